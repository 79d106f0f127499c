"""Simon, Adams & Zou (ICML 2026) on saegeo's own models: outlier severity γ predicts dead latents at init.

γ = ‖μ‖/√tr Σ per residual hook (saegeo's ``outlier_severity``, the paper's ‖μ‖/‖σ‖), against the share of an SAE's
latents that never fire on the held-out rows, at initialisation (the paper's "initial death") and after a small
fixed training budget, for TopK and ReLU SAEs with b_dec := zeros (the uncentred start the paper measures) and
b_dec := mean (centring). Spearman ρ(γ, dead share) over the hooks with a percentile bootstrap interval (hooks
resampled), beside the paper's 0.89 (TopK) / 0.82 (ReLU) over 454 model-layers.

Everything goes through saegeo's own APIs: ``cache_activations`` writes one store per hook; γ is
``activation_geometry(...).outlier_severity`` over the whole store; each SAE is ``train_sae`` on the store (the
held-out rows are the store's last ``--heldout`` share, the same rows for every SAE of a hook). The SAE at init is
``train_sae`` with lr = 0 for one step (Adam with lr 0 leaves the init of ``init_weights`` + the architecture's
``init_training`` untouched), so both dead shares come from the same held-out evaluation.
Results are appended to outliers_and_dead_latents.jsonl as they come (a rerun skips what it holds), then
written as .csv, .md (the table) and .png.

    python experiments/outliers_and_dead_latents.py --out docs/experiments [--smollm2-every 3]
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from _common import parser, save_figure, write_csv
from scipy.stats import spearmanr

from saegeo.activations.cache import cache_activations, residual_hooks
from saegeo.activations.options import CacheConfig, store_dir
from saegeo.activations.sources import open_rows
from saegeo.activations.store import ActivationStore
from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import activation_geometry
from saegeo.sae.options import TrainConfig
from saegeo.sae.train import train_sae

MODELS = {"minilm": 6, "smollm2": 30}  # transformer blocks: residual_hooks gives blocks + 1 hooks
ARCHS = ("topk", "relu")
B_DEC = ("zeros", "mean")
PAPER_RHO = {"topk": 0.89, "relu": 0.82}


def model_hooks(model: str, every: int) -> tuple[str, ...]:
    """Every residual hook of a model, or every `every`-th one (the embeddings' hook always kept)."""
    hooks = residual_hooks(MODELS[model])
    return hooks[::every]


def outlier_severity(path: Path) -> dict:
    """γ and its parts over every row of one store."""
    rows = open_rows(ActivationStore(path))
    acc = GeometryAccumulator(rows.store.d)
    for x in rows.batches(8192)[0]:
        acc.add(x)
    geo = activation_geometry(acc)
    return {
        "n_rows": acc.n,
        "d": acc.d,
        "gamma": geo.outlier_severity,
        "mean_norm": geo.mean_vector_norm,
        "sqrt_tr_sigma": math.sqrt(geo.total_variance),
    }


def train_config(arch: str, b_dec: str, args, **changes) -> TrainConfig:
    options = dict(
        arch=arch,
        expansion=args.expansion,
        arch_options={"topk": {"k": args.k}},  # ReLU has no k: the topk table is checked and kept
        b_dec_init=b_dec,
        batch_tokens=args.batch_tokens,
        total_tokens=args.train_tokens,
        heldout_fraction=args.heldout,
        seed=args.seed,
        num_threads=1,
        progress=False,
    )
    return TrainConfig(**{**options, **changes})


def dead_at_init(path: Path, arch: str, b_dec: str, args) -> dict:
    """Dead share on the held-out rows of the SAE as initialised: lr 0, one step."""
    cfg = train_config(arch, b_dec, args, lr=0.0, total_tokens=args.batch_tokens, warmup_steps=0)
    return {"dead_init": train_sae(cfg, str(path)).heldout["dead_fraction"]}


def dead_after_training(path: Path, arch: str, b_dec: str, args) -> dict:
    """Dead share, FVE and L0 on the held-out rows after the fixed budget."""
    t0 = time.process_time()
    end = train_sae(train_config(arch, b_dec, args), str(path))
    return {
        "dead_end": end.heldout["dead_fraction"],
        "fve_end": end.heldout["fve"],
        "l0_end": end.heldout["l0"],
        "d_sae": end.sae.cfg.d_sae,
        "train_cpu_s": time.process_time() - t0,
    }


def bootstrap_spearman(x: np.ndarray, y: np.ndarray, reps: int, seed: int) -> tuple[float, float, float]:
    """ρ_S(x, y) and its 95 % percentile interval over `reps` resamples of the pairs (with replacement)."""
    rho = float(spearmanr(x, y).statistic)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(reps):
        i = rng.integers(0, len(x), len(x))
        if np.ptp(x[i]) > 0 and np.ptp(y[i]) > 0:  # a resample with a constant side has no rank correlation
            boot.append(spearmanr(x[i], y[i]).statistic)
    lo, hi = np.percentile(boot, [2.5, 97.5]) if boot else (math.nan, math.nan)
    return rho, float(lo), float(hi)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=24_576, help="rows cached per hook")
    p.add_argument("--smollm2-every", type=int, default=3, help="SmolLM2: every n-th of its 31 residual hooks")
    p.add_argument("--expansion", type=int, default=4)
    p.add_argument("--k", type=int, default=32, help="TopK's active latents")
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--train-tokens", type=int, default=32_768, help="the small fixed training budget")
    p.add_argument("--heldout", type=float, default=0.2, help="share of each store held out for the dead share")
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--acts", type=Path, default=None, help="where the stores go (default OUT/acts)")
    p.add_argument("--summary-only", action="store_true", help="write the table and figure from the .jsonl as it is")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    args = p.parse_args()
    torch.set_num_threads(1)  # a shared machine: one core
    started, cpu0 = time.time(), time.process_time()
    acts = args.acts or args.out / "acts"
    log_path = args.out / "outliers_and_dead_latents.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done: dict[tuple, dict] = {}  # (model, hook, arch, b_dec, phase) -> record

    def key(rec: dict) -> tuple:
        return rec["model"], rec["hook"], rec.get("arch"), rec.get("b_dec"), rec["phase"]

    if log_path.exists():
        for line in log_path.read_text().splitlines():
            rec = json.loads(line)
            done[key(rec)] = rec

    def record(rec: dict) -> dict:
        done[key(rec)] = rec
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return rec

    plan = {m: model_hooks(m, 1 if m == "minilm" else args.smollm2_every) for m in args.models.split(",")}
    configs = [(a, b) for a in ARCHS for b in B_DEC]
    for model, hooks in ({} if args.summary_only else plan).items():
        cache_activations(
            CacheConfig(model=model, hooks=hooks, out=str(acts / model), max_tokens=args.tokens, progress=False)
        )
        for hook in hooks:  # γ and the dead share at init first, for every hook: they need no training
            if (model, hook, None, None, "gamma") not in done:
                r = record(
                    {"model": model, "hook": hook, "phase": "gamma", **outlier_severity(store_dir(acts / model, hook))}
                )
                print(f"{model} {hook}: γ = {r['gamma']:.3f}", flush=True)
            for arch, b_dec in configs:
                if (model, hook, arch, b_dec, "init") not in done:
                    rec = {"model": model, "hook": hook, "arch": arch, "b_dec": b_dec, "phase": "init"}
                    r = record({**rec, **dead_at_init(store_dir(acts / model, hook), arch, b_dec, args)})
                    print(f"{model} {hook} {arch} b_dec={b_dec}: dead at init {r['dead_init']:.3f}", flush=True)
    for model, hooks in ({} if args.summary_only else plan).items():
        for hook in hooks:
            for arch, b_dec in configs:
                if (model, hook, arch, b_dec, "end") not in done:
                    rec = {"model": model, "hook": hook, "arch": arch, "b_dec": b_dec, "phase": "end"}
                    r = record({**rec, **dead_after_training(store_dir(acts / model, hook), arch, b_dec, args)})
                    print(
                        f"{model} {hook} {arch} b_dec={b_dec}: dead after training {r['dead_end']:.3f} "
                        f"(fve {r['fve_end']:.3f}, {r['train_cpu_s']:.0f} CPU s)",
                        flush=True,
                    )

    gamma = {  # the hooks measured at init (all, unless --summary-only came before the end)
        (m, h): done[(m, h, None, None, "gamma")]
        for m, hooks in plan.items()
        for h in hooks
        if all((m, h, a, b, "init") in done for a, b in configs)
    }
    rows = []
    for arch, b_dec in configs:
        for (m, h), g in gamma.items():
            end = done.get((m, h, arch, b_dec, "end"), {})
            rows.append(
                dict(
                    model=m,
                    hook=h,
                    gamma=g["gamma"],
                    arch=arch,
                    b_dec=b_dec,
                    dead_init=done[(m, h, arch, b_dec, "init")]["dead_init"],
                    dead_end=end.get("dead_end", math.nan),
                    fve_end=end.get("fve_end", math.nan),
                    l0_end=end.get("l0_end", math.nan),
                )
            )
    csv_path = write_csv(args.out / "outliers_and_dead_latents.csv", rows)

    summary = []
    for arch, b_dec in configs:
        for when in ("dead_init", "dead_end"):
            sub = [r for r in rows if r["arch"] == arch and r["b_dec"] == b_dec and not math.isnan(r[when])]
            if not sub:
                continue
            x, y = np.array([r["gamma"] for r in sub]), np.array([r[when] for r in sub])
            rho, lo, hi = bootstrap_spearman(x, y, args.bootstrap, args.seed) if np.ptp(y) > 0 else (math.nan,) * 3
            summary.append(
                dict(
                    arch=arch,
                    b_dec=b_dec,
                    when=when.removeprefix("dead_"),
                    n_hooks=len(sub),
                    rho=rho,
                    lo=lo,
                    hi=hi,
                    mean_dead=float(y.mean()),
                    max_dead=float(y.max()),
                )
            )
    lines = [
        "| SAE | b_dec := | dead share | hooks | Spearman ρ(γ, dead) [95 % bootstrap] | paper | mean dead | max dead |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        rho = "undefined (no spread)" if math.isnan(s["rho"]) else f"{s['rho']:.2f} [{s['lo']:.2f}, {s['hi']:.2f}]"
        paper = f"{PAPER_RHO[s['arch']]:.2f}" if s["b_dec"] == "zeros" and s["when"] == "init" else ""
        lines.append(
            f"| {s['arch']} | {s['b_dec']} | {s['when']} | {s['n_hooks']} | {rho} | {paper} | {s['mean_dead']:.1%} | "
            f"{s['max_dead']:.1%} |"
        )
    lines += ["", "| model | hook | γ | " + " | ".join(f"{a} {b}: init → end" for a, b in configs) + " |"]
    lines.append("|---|---|---|" + "---|" * len(configs))

    def cell(m: str, h: str, a: str, b: str) -> str:
        end = done.get((m, h, a, b, "end"))
        return f"{done[(m, h, a, b, 'init')]['dead_init']:.1%} → " + (f"{end['dead_end']:.1%}" if end else "—")

    for (m, h), g in gamma.items():
        lines.append(f"| {m} | {h} | {g['gamma']:.3f} | " + " | ".join(cell(m, h, a, b) for a, b in configs) + " |")
    md_path = args.out / "outliers_and_dead_latents.md"
    md_path.write_text("\n".join(lines) + "\n")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, arch in zip(axes, ARCHS):
        for b_dec, colour in zip(B_DEC, ("tab:red", "tab:blue")):
            for model, marker in zip(plan, ("o", "s")):
                sub = [r for r in rows if r["arch"] == arch and r["b_dec"] == b_dec and r["model"] == model]
                xs = [r["gamma"] for r in sub]
                ax.scatter(xs, [r["dead_init"] for r in sub], c=colour, marker=marker, label=f"{model}, b_dec {b_dec}")
                ax.scatter(xs, [r["dead_end"] for r in sub], facecolors="none", edgecolors=colour, marker=marker)
        s = next(s for s in summary if s["arch"] == arch and s["b_dec"] == "zeros" and s["when"] == "init")
        ax.set_title(f"{arch}: ρ(γ, dead at init | b_dec 0) = {s['rho']:.2f} (paper {PAPER_RHO[arch]:.2f})")
        ax.set_xscale("log")
        ax.set_xlabel("outlier severity γ = ‖μ‖/√tr Σ")
    axes[0].set_ylabel("dead share (filled: init, open: after training)")
    axes[0].legend(fontsize=8)
    png_path = save_figure(fig, args.out / "outliers_and_dead_latents.png")
    print("\n".join(lines))
    print(
        f"wrote {csv_path}, {md_path} and {png_path}: {time.time() - started:.0f} s wall, "
        f"{time.process_time() - cpu0:.0f} CPU s (this process)"
    )


if __name__ == "__main__":
    main()

"""SAE training, saegeo vs SAELens, side by side in one run on the same activations.

Data: MiniLM layer-3 `blocks.3.hook_resid_post` from the store at artifacts/acts/minilm/... (built by
`saegeo cache` if missing), or a saved tensor given with --acts. Same d_sae (3072), batch (4096),
lr (3e-4), token budget (737,280 = 180 steps) and held-out split (the last 10% of rows in store order)
for both. SAELens runs in its own venv (.venv-saelens: `python3 -m venv .venv-saelens &&
.venv-saelens/bin/pip install torch==2.13.0 sae-lens==6.54.12`) through a subprocess.

Reported per run: tokens/s (wall time of the whole training call), held-out FVE, L0, dead and dense
fractions, max |cos(W_dec, mean)|, ‖b_dec‖ vs ‖mean‖; then ratios. All metrics for both libraries are
computed by the same function (saegeo.sae.train.evaluate) on the same held-out rows; the SAELens SAE is
also scored by SAELens' own encode/decode, and the two must agree (note SAELens' TopKTrainingSAE defaults
to rescale_acts_by_decoder_norm=True, which saegeo's SAEConfig expresses). Timing: wall seconds of the
whole training call (saegeo's includes b_dec init, held-out eval and saving) and process CPU seconds;
on a shared machine the CPU-seconds ratio is the steadier one. Finally a saegeo-saved SAE is loaded
by SAELens (`SAE.load_from_disk`) and its encode/decode compared with saegeo's. SAELens' trained SAEs are left
in OUT/saelens_<arch>/ as SAELens writes them for inference (`save_inference_model`), e.g. for `saegeo report`.

The floor: before each run, the same process times a bare dense encoder matmul (B·d·N) + a top-k of k per
row + a sparse (embedding_bag) decode of one batch, and prints each side's mean step time as a share of it
(floor / step; 100 % = the step costs no more than its forward floor).
BatchTopK and JumpReLU: saegeo trains both (SAELens too with --saelens-arch); the BatchTopK SAE saegeo saves
(architecture jumprelu, threshold broadcast) is loaded by SAELens and its codes compared with saegeo's.
Threads: --threads sets torch.set_num_threads and OMP_NUM_THREADS for both sides (default 1).

Usage: .venv/bin/python benchmarks/train_bench.py [--arch topk relu batchtopk jumprelu] [--saelens-arch topk relu]
       [--tokens 737280] [--d-sae 3072] [--threads 1] [--acts PATH]
Dead-latent windows: saegeo marks a latent dead for AuxK after 200k tokens without firing; SAELens after
dead_feature_window = 1000 steps (4.1M tokens), so its AuxK never switches on in this budget. Both report
"dead" the same way here: never fires on the held-out rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from saegeo.sae.model import SAE, SAEConfig  # noqa: E402
from saegeo.sae.train import RELU_LR, TrainConfig, evaluate, train_sae  # noqa: E402

STORE = ROOT / "artifacts/acts/minilm/blocks.3.hook_resid_post"
SAELENS_PY = ROOT / ".venv-saelens/bin/python"
D_SAE, BATCH, LR, HELDOUT = 3072, 4096, 3e-4, 0.1
# SAELens runs at lr 3e-4 (as PEERS.md measured it), saegeo too except ReLU at RELU_LR = 1e-3 (unit-norm
# decoder rows: README "ReLU+L1 recipe")

SAELENS_SCRIPT = r"""
import json, os, sys, time
os.environ["TQDM_DISABLE"] = "1"
import torch
from safetensors.torch import load_file, save_file
import sae_lens
from sae_lens import SAE, SAETrainer
from sae_lens.config import SAETrainerConfig
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig, StandardTrainingSAE, StandardTrainingSAEConfig

job = json.loads(sys.argv[1])
torch.set_num_threads(job.get("threads") or torch.get_num_threads())
from sae_lens import BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
data = load_file(job["data"])
train, held = data["train"], data["heldout"]
out = {"sae_lens_version": sae_lens.__version__, "threads": torch.get_num_threads()}

if job.get("check_dir"):  # load a saegeo-saved SAE and run SAELens' own encode/decode
    sae = SAE.load_from_disk(job["check_dir"], device="cpu")
    with torch.no_grad():
        feats = sae.encode(held)
        recon = sae.decode(feats)
    save_file({"codes": feats.contiguous(), "recon": recon.contiguous()}, job["check_out"])
    out["loaded_class"] = type(sae).__name__

if job.get("arch"):
    d_in, bs = train.shape[1], job["batch"]
    if job["arch"] == "topk":
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=job["d_sae"], k=job["k"]))
    elif job["arch"] == "batchtopk":
        sae = BatchTopKTrainingSAE(BatchTopKTrainingSAEConfig(d_in=d_in, d_sae=job["d_sae"], k=job["k"]))
    elif job["arch"] == "jumprelu":  # Gemma Scope 2's quadratic penalty around the same L0 target
        sae = JumpReLUTrainingSAE(JumpReLUTrainingSAEConfig(d_in=d_in, d_sae=job["d_sae"], jumprelu_sparsity_loss_mode="quadratic",
                                                            target_l0=float(job["k"])))
    else:
        sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=d_in, d_sae=job["d_sae"], l1_coefficient=job["l1"]))
    g = torch.Generator().manual_seed(job["seed"])
    def batches():
        while True:
            perm = torch.randperm(train.shape[0], generator=g)
            for j in range(train.shape[0] // bs):
                yield train[perm[j * bs:(j + 1) * bs]]
    cfg = SAETrainerConfig(total_training_samples=job["tokens"], train_batch_size_samples=bs, lr=job["lr"],
                           lr_end=job["lr"], device="cpu")
    t0, c0 = time.perf_counter(), time.process_time()
    trained = SAETrainer(cfg=cfg, sae=sae, data_provider=batches()).fit()
    out["seconds"], out["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    trained.eval()
    with torch.no_grad():
        sse, n = 0.0, 0
        for lo in range(0, held.shape[0], 4096):
            x = held[lo:lo + 4096]
            x_hat = trained.decode(trained.encode(x))
            sse += float((x - x_hat).double().pow(2).sum())
            n += int((trained.encode(x) > 0).sum())
        css = float((held.double() - held.double().mean(0)).pow(2).sum())
    out["own_fve"], out["own_l0"] = 1 - sse / css, n / held.shape[0]
    out["apply_b_dec_to_input"] = bool(trained.cfg.apply_b_dec_to_input)
    out["rescale_acts_by_decoder_norm"] = bool(getattr(trained.cfg, "rescale_acts_by_decoder_norm", False))
    sd = {k: v.detach().contiguous() for k, v in trained.state_dict().items() if k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "topk_threshold")}
    save_file(sd, job["weights_out"])
    if job.get("save_dir"):  # the SAE as SAELens itself writes it for inference (cfg.json + sae_weights.safetensors)
        trained.save_inference_model(job["save_dir"])
print("JSON" + json.dumps(out))
"""


def run_saelens(job: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(SAELENS_SCRIPT)
    env = {**os.environ, "TQDM_DISABLE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([str(SAELENS_PY), f.name, json.dumps(job)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"SAELens subprocess failed:\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")][-1]
    return json.loads(line[4:])


def load_activations(path: str | None) -> tuple[torch.Tensor, str]:
    if path and path.endswith(".safetensors"):
        return load_file(path)["activations"].float(), path
    from saegeo.activations.store import ActivationStore

    store_dir = Path(path) if path else STORE
    if not (store_dir / "manifest.json").exists():
        print(f"no store at {store_dir}; caching MiniLM layer 3 with `saegeo cache` ...", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "saegeo.cli",
                "cache",
                "--hook",
                "blocks.3.hook_resid_post",
                "--out",
                str(store_dir.parent),
            ],
            check=True,
        )
    store = ActivationStore(store_dir)
    return store.read_rows(0, store.n_tokens), f"{store_dir} ({store.model}, {store.hook})"


def saelens_as_saegeo(weights: dict, arch: str, k: int, apply_b_dec: bool, rescale: bool) -> SAE:
    """SAELens' trained weights under saegeo's contract with SAELens' semantics (TopK then ReLU, free norms;
    BatchTopK as SAELens saves it for inference: jumprelu with its topk_threshold broadcast)."""
    d_in, d_sae = weights["W_enc"].shape
    activation = {"topk": "topk", "relu": "relu"}.get(arch, "jumprelu")
    sae = SAE(
        SAEConfig(
            d_in,
            d_sae,
            activation=activation,
            k=k if arch == "topk" else None,
            topk_order="topk_then_relu",
            apply_b_dec_to_input=apply_b_dec,
            rescale_acts_by_decoder_norm=rescale and arch in ("topk", "batchtopk"),
        )
    )
    weights = dict(weights)
    if arch == "batchtopk":
        weights["threshold"] = weights.pop("topk_threshold").reshape(1).expand(d_sae).contiguous()
    sae.load_state_dict(weights, strict=False)
    return sae


def _best_of(f, reps: int = 3) -> tuple[float, float]:
    """Minimum wall and CPU seconds of f() over reps runs (after one warm-up)."""
    f()
    walls, cpus = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def floor_seconds(x: torch.Tensor, d_sae: int, k: int) -> float:
    """The floor of one step on a batch: dense encoder matmul (B·d·N) + top-k + sparse decode (k rows per token)."""
    g = torch.Generator().manual_seed(0)
    W_enc = torch.randn(x.shape[1], d_sae, generator=g) / x.shape[1] ** 0.5
    W_dec = torch.randn(d_sae, x.shape[1], generator=g)

    def step():
        with torch.no_grad():
            values, indices = (x @ W_enc).topk(k, dim=-1, sorted=False)
            torch.nn.functional.embedding_bag(indices, W_dec, per_sample_weights=values, mode="sum")

    return _best_of(step, reps=5)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["topk", "relu", "batchtopk", "jumprelu"])
    ap.add_argument("--saelens-arch", nargs="*", default=["topk", "relu"], help="archs SAELens also trains")
    ap.add_argument("--tokens", type=int, default=737_280)
    ap.add_argument("--d-sae", type=int, default=D_SAE)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--l1", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and OMP_NUM_THREADS) for both sides")
    ap.add_argument("--acts", help="store directory or .safetensors with an `activations` tensor")
    ap.add_argument("--out", default=str(ROOT / "artifacts/runs/train_bench"))
    args = ap.parse_args()
    if not SAELENS_PY.exists():
        sys.exit(
            f"{SAELENS_PY} missing: make .venv-saelens/.installed (python3 -m venv .venv-saelens && "
            ".venv-saelens/bin/pip install torch==2.13.0 sae-lens==6.54.12)"
        )
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the SAELens subprocess inherits it

    x, source = load_activations(args.acts)
    n_held = int(round(x.shape[0] * HELDOUT))
    train_x, held_x = x[: x.shape[0] - n_held], x[x.shape[0] - n_held :]
    mean = train_x.double().mean(0)
    d_sae = args.d_sae
    print(
        f"data: {source}: {x.shape[0]:,} tokens x {x.shape[1]}, train {train_x.shape[0]:,}, held-out "
        f"{held_x.shape[0]:,} (last 10%); |mean| {mean.norm():.2f}, mean token norm {x.norm(dim=1).mean():.2f}"
    )
    steps = args.tokens // BATCH
    print(
        f"budget: {args.tokens:,} tokens = {steps} steps of {BATCH}; d_sae {d_sae}; lr {LR} (saegeo ReLU: "
        f"{RELU_LR}); torch threads {torch.get_num_threads()} on both sides",
        flush=True,
    )
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    data_file = tmp / "data.safetensors"
    save_file({"train": train_x.contiguous(), "heldout": held_x.contiguous()}, str(data_file))

    rows = []
    floor = floor_seconds(train_x[:BATCH].contiguous(), d_sae, args.k)
    for arch in args.arch:
        cfg = TrainConfig(
            arch=arch,
            d_sae=d_sae,
            k=args.k,
            l1_coefficient=args.l1,
            batch_tokens=BATCH,
            lr=RELU_LR if arch == "relu" else LR,
            total_tokens=args.tokens,
            heldout_fraction=HELDOUT,
            b_dec_init="mean",
            progress=False,
            out_dir=str(out_dir / f"saegeo_{arch}"),
            log_every=20,
            num_threads=args.threads,
            overwrite=True,
        )  # the benchmark's own scratch output, rewritten on every run
        t0, c0 = time.perf_counter(), time.process_time()
        res = train_sae(cfg, x, resume=False)
        sec, cpu = time.perf_counter() - t0, time.process_time() - c0
        ours = evaluate(res.sae, [held_x], mean)
        step = BATCH / res.history[-1]["tok_s"]  # the training loop's own wall time per step
        print(
            f"saegeo  {arch}: {sec:.1f} s wall, {cpu:.1f} s CPU; step {step * 1e3:.0f} ms, floor {floor * 1e3:.0f} ms "
            f"({floor / step:.0%} of the step)",
            flush=True,
        )
        row = dict(arch=arch, ours=ours, tps_ours=args.tokens / sec, cpu_ours=cpu, floor=floor, step_ours=step)
        if arch in args.saelens_arch:
            job = dict(
                data=str(data_file),
                arch=arch,
                d_sae=d_sae,
                k=args.k,
                l1=args.l1,
                batch=BATCH,
                lr=LR,
                tokens=args.tokens,
                seed=0,
                threads=args.threads,
                weights_out=str(tmp / f"saelens_{arch}.safetensors"),
                save_dir=str(out_dir / f"saelens_{arch}"),
            )
            sl = run_saelens(job)
            sl_sae = saelens_as_saegeo(
                load_file(job["weights_out"]),
                arch,
                args.k,
                sl["apply_b_dec_to_input"],
                sl["rescale_acts_by_decoder_norm"],
            )
            theirs = evaluate(sl_sae, [held_x], mean)
            if arch in ("topk", "relu"):  # same semantics (BatchTopK: SAELens' training encode is batch-level)
                assert abs(theirs["fve"] - sl["own_fve"]) < 1e-3, (theirs["fve"], sl["own_fve"])
            sl_step = sl["seconds"] / steps
            print(
                f"SAELens {arch}: {sl['seconds']:.1f} s wall, {sl['cpu_seconds']:.1f} s CPU; step {sl_step * 1e3:.0f} ms "
                f"({floor / sl_step:.0%} of the step) (SAELens {sl['sae_lens_version']})",
                flush=True,
            )
            row.update(theirs=theirs, tps_sl=args.tokens / sl["seconds"], cpu_sl=sl["cpu_seconds"], step_sl=sl_step)
        rows.append(row)

    # SAELens loads saegeo-saved SAEs and encodes/decodes as saegeo does (BatchTopK: saved as jumprelu)
    checks = []
    for arch in [a for a in ("batchtopk", "topk", "relu", "jumprelu") if a in args.arch]:
        check_dir = out_dir / f"saegeo_{arch}"
        chk = run_saelens(
            dict(
                data=str(data_file),
                check_dir=str(check_dir),
                check_out=str(tmp / "check.safetensors"),
                threads=args.threads,
            )
        )
        ref = SAE.load(check_dir)
        with torch.no_grad():
            codes = ref.encode(held_x)
            recon = ref.decode(codes)
        got = load_file(str(tmp / "check.safetensors"))
        code_err = float((got["codes"] - codes).abs().max())
        support = int(((got["codes"] > 0) != (codes > 0)).sum())
        recon_err = float((got["recon"] - recon).abs().max() / recon.abs().max())
        checks.append((arch, chk, code_err, support, recon_err))
        assert code_err < 1e-3 and recon_err < 1e-5, (arch, code_err, recon_err)

    def fmt(m):
        return (
            f"FVE {m['fve']:.3f}  L0 {m['l0']:6.1f}  dead {m['dead_fraction']:6.1%}  dense {m['dense_fraction']:5.1%}  "
            f"max|cos(W_dec,mean)| {m['max_abs_cos_mean']:.3f} (#>0.5: {m['n_latents_cos_mean_gt_0.5']})  "
            f"|b_dec| {m['b_dec_norm']:.2f}"
        )

    print("\n=== results (held-out, same rows, same metric code) ===")
    summary = {}
    for r in rows:
        arch = r["arch"]
        print(f"[{arch}] saegeo : {r['tps_ours']:8,.0f} tok/s  {r['cpu_ours']:6.1f} CPU s  {fmt(r['ours'])}")
        entry = dict(
            saegeo=dict(tok_s=r["tps_ours"], cpu_seconds=r["cpu_ours"], step_s=r["step_ours"], **r["ours"]),
            floor_s=r["floor"],
        )
        if "theirs" in r:
            print(f"[{arch}] SAELens: {r['tps_sl']:8,.0f} tok/s  {r['cpu_sl']:6.1f} CPU s  {fmt(r['theirs'])}")
            target = {"topk": "2", "relu": "1.5"}.get(arch)
            print(
                f"[{arch}] ratio saegeo/SAELens tokens/s: {r['tps_ours'] / r['tps_sl']:.2f}x wall, "
                f"{r['cpu_sl'] / r['cpu_ours']:.2f}x in CPU seconds" + (f" (target {target}x)" if target else "")
            )
            entry.update(
                saelens=dict(tok_s=r["tps_sl"], cpu_seconds=r["cpu_sl"], step_s=r["step_sl"], **r["theirs"]),
                speed_ratio=r["tps_ours"] / r["tps_sl"],
                cpu_ratio=r["cpu_sl"] / r["cpu_ours"],
            )
            if arch == "relu":
                o, t = r["ours"], r["theirs"]
                print(
                    f"[relu] front: saegeo FVE {o['fve']:.3f} at L0 {o['l0']:.0f} vs SAELens {t['fve']:.3f} at L0 "
                    f"{t['l0']:.0f}: {'on or beyond' if o['fve'] >= t['fve'] and o['l0'] <= t['l0'] else 'NOT on'} SAELens' front"
                )
        floor_line = f"[{arch}] floor {r['floor'] * 1e3:.0f} ms = {r['floor'] / r['step_ours']:.0%} of saegeo's step"
        if "step_sl" in r:
            floor_line += f", {r['floor'] / r['step_sl']:.0%} of SAELens'"
        print(floor_line + (" (target >= 50% for topk)" if arch == "topk" else ""))
        if arch == "jumprelu":
            print(
                f"[jumprelu] L0 {r['ours']['l0']:.1f} against its target {args.k}: "
                f"{abs(r['ours']['l0'] / args.k - 1):.0%} off (bandwidth {TrainConfig.bandwidth}, "
                f"L0 coefficient {TrainConfig.l0_coefficient}, threshold lr x{TrainConfig.threshold_lr_scale})"
            )
        summary[arch] = entry
    print(f"|mean| of training rows: {float(mean.norm()):.2f}")
    for arch, chk, code_err, support, recon_err in checks:
        print(
            f"SAELens {chk['sae_lens_version']} loads the saegeo {arch} SAE as {chk['loaded_class']}: max |codes diff| "
            f"{code_err:.2e} ({support} entries differ in support), max relative recon diff {recon_err:.2e}"
        )
        summary.setdefault(arch, {})["saelens_load"] = dict(
            cls=chk["loaded_class"], code_err=code_err, support=support, recon_err=recon_err
        )
    (out_dir / "train_bench.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

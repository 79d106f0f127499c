"""SAE training, saegeo vs SAELens: FVE–L0 curves side by side on the same activations, each point at its best lr.

Data: MiniLM layer-3 `blocks.3.hook_resid_post` from the store at artifacts/acts/minilm/... (built by
`saegeo cache` if missing), or a saved tensor given with --acts. Same d_sae (3072 = expansion 8), batch (4096),
token budget (737,280 = 180 steps) and held-out split (the last 10% of rows in store order) for both sides.
SAELens 6.54.12 runs in its own venv (.venv-saelens: `make .venv-saelens/.installed`) through a subprocess, at
its defaults except the lr (constant: SAELens' default schedule), l1_coefficient (ReLU) and k (TopK, BatchTopK).
saegeo runs at its architecture's defaults but the lr and sparsity (ReLU: gradient clipped at norm 1, as SAELens').

The grid. Per architecture, each side trains every sparsity setting (ReLU: the L1 coefficient, --l1s; TopK and
BatchTopK: k, --ks) at every lr of the same small grid (--lrs). A point's "best lr" is, for ReLU, the lr with the
lowest held-out objective mean‖x − x̂‖² + l1·mean Σ_i a_i‖w_i‖ (the objective both sides minimise, same scale;
computed by one function on both SAEs), for TopK/BatchTopK (L0 fixed by k) the lr with the highest held-out FVE.
The curve of a side is its best points, ordered by held-out L0. Comparing curves: each side's curve is
interpolated linearly in log L0; at every point of either curve inside the L0 range both cover, the gap
FVE_saegeo − FVE_SAELens is printed, and its minimum decides "at or above". Every point of the grid is printed
too, so the whole cloud can be read.

The defaults: `TrainConfig(arch=...)` with only the budget set (what `saegeo train --arch relu --total-tokens
737280` trains; its per-architecture lr and l1 come from the architecture module) is trained on the same rows and
placed against saegeo's curve, and the SAE it saves is loaded by SAELens (`SAE.load_from_disk`), whose
encode/decode must agree with saegeo's (BatchTopK is saved as jumprelu with its threshold broadcast).

All metrics for both libraries are computed by the same function (saegeo.sae.train.evaluate) on the same held-out
rows; SAELens' own encode/decode FVE must agree with it (TopK, ReLU). Timing: process CPU seconds of the whole
training call (saegeo's includes b_dec init, held-out eval and saving; SAELens' is its `fit()`), the CPU ratio per
matched (setting, lr) pair. The floor (TopK, BatchTopK): before each run the same process times a bare dense
encoder matmul (B·d·N) + a top-k of k per row + a sparse (embedding_bag) decode of one batch; a side's step is
printed as floor / step (100 % = the step costs no more than its forward floor).

Running: each run's result is one JSON file in --results (default artifacts/runs/train_bench/results); a run
already there is skipped, so an interrupted grid resumes and two workers (`--worker`, two processes at most)
share one grid, each claiming runs by an atomic mkdir. While the file named by --pause-file exists no new run
starts (none by default). `--print` re-prints the curves from the saved results without training.

Gated and JumpReLU's sparsity forms (`--arch gated jumprelu-quadratic jumprelu-step jumprelu-tanh`): SAELens'
GatedTrainingSAE and JumpReLUTrainingSAE (jumprelu_sparsity_loss_mode quadratic, step, tanh) against saegeo's gated
and jumprelu (--jumprelu.sparsity-loss of the same name). Settings: gated the L1 coefficient (--l1s; both sides'
loss is mean‖x − x̂‖² + l1·mean Σ relu(gate_pre)·‖w_i‖ + the auxiliary term), quadratic the target L0 (--ks,
l0_coefficient 1), step and tanh the l0_coefficient (--l0-coefs). JumpReLU coefficients are SAELens' (its loss is
mean‖x − x̂‖² + c·S); saegeo's loss is an FVU, so it gets c / mean‖x − x̄‖² of the training rows: both minimise the
same objective. A point's best lr: the lowest held-out value of that objective (computed by one function on both
SAEs, S with the hard step). Every SAELens SAE of these runs is saved with its own save_inference_model and read by
saegeo's SAE.load, its codes on 4,096 held-out rows compared with SAELens' own encode; saegeo's default run of each
is loaded by SAELens (as for the others).

Usage: .venv/bin/python benchmarks/train_bench.py [--arch relu topk batchtopk] [--lrs 1e-3 2e-3 4e-3 8e-3]
       [--l1s 0.5 1 2] [--ks 16 32 64] [--l0-coefs 0.5 2] [--tokens 737280] [--batch 4096] [--d-sae 3072]
       [--threads 1] [--acts PATH] [--worker] [--print]
Dead-latent windows: saegeo marks a latent dead for AuxK after 200k tokens without firing; SAELens after
dead_feature_window = 1000 steps (4.1M tokens), so its AuxK never switches on in this budget. Both report
"dead" the same way here: never fires on the held-out rows.
"""

from __future__ import annotations

import argparse
import json
import math
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

from saegeo.io import json_safe  # noqa: E402
from saegeo.sae.model import SAE, SAEConfig  # noqa: E402
from saegeo.sae.train import TrainConfig, evaluate, train_sae  # noqa: E402

STORE = ROOT / "artifacts/acts/minilm/blocks.3.hook_resid_post"
SAELENS_PY = ROOT / ".venv-saelens/bin/python"
D_SAE, BATCH, HELDOUT, D_IN = 3072, 4096, 0.1, 384  # D_IN: MiniLM's width
LRS = (1e-3, 2e-3, 4e-3, 8e-3)  # the one lr grid both sides search
SETTINGS = {"relu": (0.5, 1.0, 2.0), "topk": (16, 32, 64), "batchtopk": (16, 32, 64)}  # l1 coefficients; k
# JumpReLU's sparsity forms as bench architectures: SAELens' jumprelu_sparsity_loss_mode = saegeo's sparsity_loss
JUMPRELU_FORMS = {"jumprelu-quadratic": "quadratic", "jumprelu-step": "step", "jumprelu-tanh": "tanh"}
OBJECTIVE_ARCHS = ("relu", "gated", *JUMPRELU_FORMS)  # best lr: the lowest held-out objective (else: highest FVE)
READ_BACK = ("gated", *JUMPRELU_FORMS)  # SAELens' saved SAE read by saegeo in every run
SIDES = ("saegeo", "saelens")

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
    elif job["arch"].startswith("jumprelu-"):  # one sparsity form: quadratic (target L0), step, tanh
        mode = job["arch"].split("-", 1)[1]
        sae = JumpReLUTrainingSAE(JumpReLUTrainingSAEConfig(
            d_in=d_in, d_sae=job["d_sae"], jumprelu_sparsity_loss_mode=mode, l0_coefficient=job["l0_coefficient"],
            target_l0=float(job["k"]) if mode == "quadratic" else None))
    elif job["arch"] == "gated":
        from sae_lens import GatedTrainingSAE, GatedTrainingSAEConfig
        sae = GatedTrainingSAE(GatedTrainingSAEConfig(d_in=d_in, d_sae=job["d_sae"], l1_coefficient=job["l1"]))
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
    if job.get("codes_out"):  # SAELens' own encode of the first held-out rows, for the read-back check
        with torch.no_grad():
            save_file({"codes": trained.encode(held[:4096]).contiguous()}, job["codes_out"])
print("JSON" + json.dumps(out))
"""


def run_saelens(job: dict, python: Path) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(SAELENS_SCRIPT)
    env = {**os.environ, "TQDM_DISABLE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([str(python), f.name, json.dumps(job)], capture_output=True, text=True, env=env)
    os.unlink(f.name)
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


def relu_objective(sae: SAE, held: torch.Tensor, l1: float) -> float:
    """The ReLU+L1 objective on held-out rows, mean_rows ‖x − x̂‖² + l1 · mean_rows Σ_i a_i‖W_dec[i]‖ (SAELens'
    Standard loss; invariant to moving a latent's scale between its code and its decoder row)."""
    sse = penalty = 0.0
    with torch.no_grad():
        norms = sae.W_dec.norm(dim=1).double()
        for lo in range(0, held.shape[0], 4096):
            x = held[lo : lo + 4096]
            codes = sae.encode(x)
            sse += float((x - sae.decode(codes)).double().pow(2).sum())
            penalty += float((codes.double() @ norms).sum())
    return (sse + l1 * penalty) / held.shape[0]


def gated_objective(sae: SAE, held: torch.Tensor, l1: float) -> float:
    """Gated's objective on held-out rows as both libraries train it, less the auxiliary term: mean_rows ‖x − x̂‖²
    + l1 · mean_rows Σ_i relu(gate_pre_i)·‖W_dec[i]‖, gate_pre = (x − b_dec) W_enc + b_gate."""
    sse = penalty = 0.0
    with torch.no_grad():
        norms = sae.W_dec.norm(dim=1).double()
        for lo in range(0, held.shape[0], 4096):
            x = held[lo : lo + 4096]
            sse += float((x - sae.decode(sae.encode(x))).double().pow(2).sum())
            penalty += float((sae.pre_activations(x).clamp_min(0).double() @ norms).sum())
    return (sse + l1 * penalty) / held.shape[0]


def jumprelu_objective(sae: SAE, held: torch.Tensor, form: str, coefficient: float, target: float) -> float:
    """SAELens' JumpReLU objective on held-out rows with the hard step: mean_rows ‖x − x̂‖² + c·S, S = mean_rows
    L0_r (step), mean_rows (2/t)(L0_r − t)² (quadratic), mean_rows Σ_i tanh(4·a_ri·‖W_dec[i]‖) (tanh)."""
    sse = penalty = 0.0
    with torch.no_grad():
        norms = sae.W_dec.norm(dim=1)
        for lo in range(0, held.shape[0], 4096):
            x = held[lo : lo + 4096]
            codes = sae.encode(x)
            sse += float((x - sae.decode(codes)).double().pow(2).sum())
            l0_rows = (codes > 0).double().sum(1)
            penalty += float(
                l0_rows.sum()
                if form == "step"
                else (2 / target * (l0_rows - target).pow(2)).sum()
                if form == "quadratic"
                else torch.tanh(4.0 * codes * norms).double().sum()
            )
    return (sse + coefficient * penalty) / held.shape[0]


def objective(sae: SAE, held: torch.Tensor, arch: str, setting: float) -> float:
    """The held-out objective a point's best lr minimises (relu, gated and the JumpReLU forms)."""
    if arch == "relu":
        return relu_objective(sae, held, setting)
    if arch == "gated":
        return gated_objective(sae, held, setting)
    form = JUMPRELU_FORMS[arch]
    return jumprelu_objective(sae, held, form, *form_coefficient_target(arch, setting))


def form_coefficient_target(arch: str, setting: float) -> tuple[float, float]:
    """(SAELens' l0_coefficient, target L0) of a JumpReLU form's grid point: quadratic varies the target at
    coefficient 1 (SAELens' default), step and tanh the coefficient (the target, 32, only starts saegeo's θ)."""
    return (1.0, float(setting)) if arch == "jumprelu-quadratic" else (float(setting), 32.0)


# =========================================================================== one run
def job_key(job: dict) -> str:
    if job.get("default"):
        return f"{job['arch']}-saegeo-default"
    return f"{job['arch']}-{job['side']}-{job['setting']:g}-lr{job['lr']:g}"


def grid_jobs(args) -> list[dict]:
    """Per architecture every (setting, lr), the two sides next to each other; then the run at the defaults.

    Order only (the grid is the same): each side's lrs run in the order of --lr-order SIDE=LR,LR,... (where the
    earlier runs put its best lr), so an interrupted grid has each side's likeliest best points first."""
    settings = {"relu": args.l1s, "topk": args.ks, "batchtopk": args.ks, "gated": args.l1s}
    settings |= {"jumprelu-quadratic": args.ks, "jumprelu-step": args.l0_coefs, "jumprelu-tanh": args.l0_coefs}
    prefer = {side: [float(v) for v in lrs.split(",")] for side, lrs in (o.split("=") for o in args.lr_order)}

    def tier(side: str, lr: float) -> int:
        order = prefer.get(side, [])
        return order.index(lr) if lr in order else len(order) + sorted(args.lrs).index(lr)

    jobs = []
    for arch in args.arch:
        grid = [
            dict(arch=arch, side=side, setting=s, lr=lr)
            for s in settings[arch]
            for lr in args.lrs
            for side in args.sides
        ]
        jobs += sorted(grid, key=lambda j: (tier(j["side"], j["lr"]), j["setting"], j["side"]))
        if not args.no_defaults and "saegeo" in args.sides:
            jobs.append(dict(arch=arch, side="saegeo", default=True))
    return jobs


class Data:
    """The rows, their split and the file the SAELens subprocess reads."""

    def __init__(self, args):
        x, self.source = load_activations(args.acts)
        n_held = int(round(x.shape[0] * HELDOUT))
        self.x, self.train_x, self.held_x = x, x[: x.shape[0] - n_held], x[x.shape[0] - n_held :]
        self.mean = self.train_x.double().mean(0)
        self.tmp = Path(tempfile.mkdtemp())
        self.file = self.tmp / "data.safetensors"
        save_file({"train": self.train_x.contiguous(), "heldout": self.held_x.contiguous()}, str(self.file))


RUN_OPTIONS = dict(progress=False, log_every=20, overwrite=True)  # options that do not change the weights


SPARSITY_OPTION = {
    "relu": "l1_coefficient",
    "topk": "k",
    "batchtopk": "k",
    "jumprelu": "l0_target",
    "gated": "l1_coefficient",
}


def sparsity_setting(cfg: TrainConfig) -> float:
    """The value of the option the grid varies (relu: l1; topk, batchtopk: k; jumprelu: its L0 target)."""
    return getattr(cfg.options, SPARSITY_OPTION[cfg.arch])


def saegeo_arch_options(arch: str, setting: float | None, args) -> tuple[str, dict]:
    """(saegeo architecture, its options) of a bench architecture at a grid point (None: its defaults); a JumpReLU
    form's SAELens coefficient divided by mean‖x − x̄‖² (saegeo's loss is an FVU)."""
    if arch in JUMPRELU_FORMS:
        opts: dict = {"sparsity_loss": JUMPRELU_FORMS[arch]}
        if setting is not None:
            coefficient, target = form_coefficient_target(arch, setting)
            opts |= {"l0_coefficient": coefficient / args.mean_sq, "l0_target": int(target)}
        return "jumprelu", {"jumprelu": opts}
    if setting is None:
        return arch, {}
    return arch, {arch: {SPARSITY_OPTION[arch]: setting if arch in ("relu", "gated") else int(setting)}}


def bench_config(arch: str, setting: float | None, args, out_dir: str | None, **fields) -> TrainConfig:
    """saegeo's TrainConfig for a bench architecture at a grid point (None: its defaults), at the grid's d_sae,
    batch and budget; `fields` add the rest (the grid's lr and held-out share)."""
    name, options = saegeo_arch_options(arch, setting, args)
    return TrainConfig(
        arch=name,
        arch_options=options,
        d_sae=args.d_sae,
        batch_tokens=args.batch,
        total_tokens=args.tokens,
        out_dir=out_dir,
        num_threads=args.threads,
        **fields,
        **RUN_OPTIONS,
    )


def grid_config(arch: str, setting: float, lr: float, args, out_dir: str | None = None) -> TrainConfig:
    """saegeo's run at one point of the grid."""
    return bench_config(arch, setting, args, out_dir, lr=lr, heldout_fraction=HELDOUT)


def default_config(arch: str, args, out_dir: str | None = None) -> TrainConfig:
    """What `saegeo train --arch ARCH --total-tokens N` trains: nothing else given (the architecture's lr, l1),
    at the grid's d_sae and batch (the defaults, 3072 = expansion 8 and 4096, unless --d-sae / --batch say else)."""
    return bench_config(arch, None, args, out_dir)


def same_weights(a: TrainConfig, b: TrainConfig, d_in: int) -> bool:
    """Whether two configs train the same weights on the same rows: equal in every option but those that do not
    change the weights (saegeo.sae.train.NOT_IN_WEIGHTS), d_sae compared as the number of latents it gives."""
    from dataclasses import asdict

    from saegeo.sae.train import NOT_IN_WEIGHTS

    def weights_part(c: TrainConfig) -> dict:
        c = c.resolved()
        return {k: v for k, v in asdict(c).items() if k not in NOT_IN_WEIGHTS + ("d_sae", "expansion")} | {
            "n_latents": c.d_sae or c.expansion * d_in
        }

    return weights_part(a) == weights_part(b)


def run_job(job: dict, data: Data, args, out_dir: Path) -> dict:
    arch, side = job["arch"], job["side"]
    rec = {"key": job_key(job), **job, "tokens": args.tokens, "threads": args.threads, "when": time.time()}
    setting = job.get("setting")
    if arch in ("relu", "gated", "jumprelu-step", "jumprelu-tanh"):
        k = None
    else:
        k = int(setting if setting is not None else sparsity_setting(default_config(arch, args)))
    floor = floor_seconds(data.train_x[: args.batch].contiguous(), args.d_sae, k) if k is not None else None
    steps = args.tokens // args.batch
    if side == "saegeo":
        if job.get("default"):
            cfg = default_config(arch, args, str(out_dir / f"saegeo_{arch}_default"))
        else:
            cfg = grid_config(arch, setting, job["lr"], args, str(out_dir / f"scratch_{os.getpid()}"))
        t0, c0 = time.perf_counter(), time.process_time()
        res = train_sae(cfg, data.x, resume=False)
        rec["wall_seconds"], rec["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
        sae = res.sae
        live = res.history[-1] if res.history else {}
        rec["step_s"] = args.batch / live["tok_s"] if "tok_s" in live else rec["wall_seconds"] / steps
        used = res.config
        rec.update(lr=used.lr, setting=setting if arch in READ_BACK and setting is not None else sparsity_setting(used))
        if job.get("default"):
            rec["default_config"] = {f: getattr(used, f) for f in ("lr", "d_sae", "expansion")}
            rec["default_config"] |= {"l1_coefficient" if arch in ("relu", "gated") else "k": sparsity_setting(used)}
            rec["saelens_load"] = saelens_load_check(arch, Path(cfg.out_dir), data, args)
    else:
        sl_job = dict(
            data=str(data.file),
            arch=arch,
            d_sae=args.d_sae,
            k=k,
            l1=setting if arch in ("relu", "gated") else 1.0,
            l0_coefficient=form_coefficient_target(arch, setting)[0] if arch in JUMPRELU_FORMS else None,
            batch=args.batch,
            lr=job["lr"],
            tokens=args.tokens,
            seed=0,
            threads=args.threads,
            weights_out=str(data.tmp / f"saelens_{os.getpid()}.safetensors"),
            save_dir=str(out_dir / f"saelens_topk_lr{job['lr']:g}") if (arch, k) == ("topk", 32) else None,
        )
        if arch in READ_BACK:  # SAELens saves it, saegeo reads the folder, codes compared with SAELens' own
            sl_job["save_dir"] = str(out_dir / f"saelens_{job_key(job)}")
            sl_job["codes_out"] = str(data.tmp / f"saelens_codes_{os.getpid()}.safetensors")
        sl = run_saelens(sl_job, args.saelens_python)
        if arch in READ_BACK:
            sae = SAE.load(sl_job["save_dir"])
            with torch.no_grad():
                ours = sae.encode(data.held_x[:4096])
            theirs = load_file(sl_job["codes_out"])["codes"]
            rec["read_by_saegeo"] = dict(
                code_err=float((ours - theirs).abs().max()), support=int(((ours > 0) != (theirs > 0)).sum())
            )
        else:
            sae = saelens_as_saegeo(
                load_file(sl_job["weights_out"]),
                arch,
                k,
                sl["apply_b_dec_to_input"],
                sl["rescale_acts_by_decoder_norm"],
            )
        rec.update(
            wall_seconds=sl["seconds"],
            cpu_seconds=sl["cpu_seconds"],
            step_s=sl["seconds"] / steps,
            own_fve=sl["own_fve"],
            sae_lens_version=sl["sae_lens_version"],
        )
    rec["metrics"] = {k2: float(v) for k2, v in evaluate(sae, [data.held_x], data.mean).items()}
    if side == "saelens" and arch in ("topk", "relu"):  # same semantics (BatchTopK: SAELens trains batch-level)
        assert abs(rec["metrics"]["fve"] - rec["own_fve"]) < 1e-3, (rec["metrics"]["fve"], rec["own_fve"])
    if arch in OBJECTIVE_ARCHS and not (job.get("default") and arch in JUMPRELU_FORMS):  # no SAELens-unit setting
        rec["objective"] = objective(sae, data.held_x, arch, rec["setting"])
    if floor is not None:
        rec["floor_s"] = floor
    return rec


def saelens_load_check(arch: str, sae_dir: Path, data: Data, args) -> dict:
    """SAELens loads the saegeo-saved SAE and encodes/decodes the held-out rows as saegeo does."""
    out = data.tmp / f"check_{os.getpid()}.safetensors"
    chk = run_saelens(
        dict(data=str(data.file), check_dir=str(sae_dir), check_out=str(out), threads=args.threads),
        args.saelens_python,
    )
    ref = SAE.load(sae_dir)
    with torch.no_grad():
        codes = ref.encode(data.held_x)
        recon = ref.decode(codes)
    got = load_file(str(out))
    result = dict(
        cls=chk["loaded_class"],
        version=chk["sae_lens_version"],
        code_err=float((got["codes"] - codes).abs().max()),
        support=int(((got["codes"] > 0) != (codes > 0)).sum()),
        recon_err=float((got["recon"] - recon).abs().max() / recon.abs().max()),
    )
    assert result["code_err"] < 1e-3 and result["recon_err"] < 1e-5, (arch, result)
    return result


def work(args) -> None:
    """Run every job of the grid not yet in the results directory, claiming each by an atomic mkdir."""
    results = Path(args.results)
    claims = results / "claims"
    claims.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the SAELens subprocess inherits it
    data = Data(args)
    args.mean_sq = float((data.train_x.double() - data.mean).pow(2).sum(1).mean())  # mean‖x − x̄‖², training rows
    print(
        f"data: {data.source}: {data.x.shape[0]:,} tokens x {data.x.shape[1]}, train {data.train_x.shape[0]:,}, "
        f"held-out {data.held_x.shape[0]:,} (last 10%); |mean| {data.mean.norm():.2f}; budget {args.tokens:,} "
        f"tokens = {args.tokens // args.batch} steps of {args.batch}; d_sae {args.d_sae}; torch threads {args.threads}; "
        f"mean‖x − x̄‖² {args.mean_sq:.1f}",
        flush=True,
    )
    for job in grid_jobs(args):
        key = job_key(job)
        if (results / f"{key}.json").exists():
            continue
        while args.pause_file and Path(args.pause_file).exists():  # someone runs the full suite: start nothing
            time.sleep(30)
        try:
            (claims / key).mkdir()
        except FileExistsError:
            continue
        rec = run_job(job, data, args, out_dir)
        (results / f"{key}.json").write_text(json.dumps(rec, indent=1))
        m = rec["metrics"]
        print(
            f"{key}: FVE {m['fve']:.4f} L0 {m['l0']:.1f} dead {m['dead_fraction']:.1%}  {rec['cpu_seconds']:.1f} CPU s"
            f"  step {rec['step_s'] * 1e3:.0f} ms"
            + (f" (floor {rec['floor_s'] / rec['step_s']:.0%})" if "floor_s" in rec else "")
            + (
                f"  read by saegeo: max |codes diff| {rec['read_by_saegeo']['code_err']:.1e}"
                if "read_by_saegeo" in rec
                else ""
            ),
            flush=True,
        )


# =========================================================================== the curves
def interpolate(curve: list[dict], l0: float) -> float | None:
    """FVE of a curve (points sorted by L0) at l0, linear in log L0; None outside its L0 range."""
    pts = [(math.log(p["metrics"]["l0"]), p["metrics"]["fve"]) for p in curve]
    x = math.log(l0)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1] if len(pts) == 1 and abs(pts[0][0] - x) < 1e-12 else None


def best_curve(recs: list[dict], arch: str, side: str) -> list[dict]:
    """Per sparsity setting the run at its best lr (ReLU: lowest held-out objective; else highest FVE), by L0."""
    by_setting: dict[float, list[dict]] = {}
    for r in recs:
        if r["arch"] == arch and r["side"] == side and not r.get("default"):
            by_setting.setdefault(r["setting"], []).append(r)
    score = (lambda r: r["objective"]) if arch in OBJECTIVE_ARCHS else (lambda r: -r["metrics"]["fve"])
    return sorted((min(runs, key=score) for runs in by_setting.values()), key=lambda r: r["metrics"]["l0"])


def report(args) -> None:
    recs = [json.loads(p.read_text()) for p in sorted(Path(args.results).glob("*.json"))]
    summary: dict = {}
    for arch in args.arch:
        runs = [r for r in recs if r["arch"] == arch]
        if not runs:
            continue
        name = {"relu": "l1", "gated": "l1", "jumprelu-step": "c", "jumprelu-tanh": "c"}.get(arch, "k")
        has_objective = arch in OBJECTIVE_ARCHS
        print(f"\n=== {arch}: every run (held-out rows, the same metric code for both sides) ===")
        print(
            f"{'side':8s} {name:>4s} {'lr':>7s} {'FVE':>7s} {'L0':>7s} {'dead':>6s}"
            + (f" {'objective':>9s}" if has_objective else "")
            + f" {'CPU s':>7s} {'wall s':>7s} {'step ms':>8s}"
            + (" floor/step" if arch != "relu" else "")
            + ("  read back" if arch in READ_BACK else "")
        )
        for r in sorted(runs, key=lambda r: (r["side"], r.get("default", False), r["setting"], r["lr"])):
            m = r["metrics"]
            print(
                f"{r['side'] + ('*' if r.get('default') else ''):8s} {r['setting']:4g} {r['lr']:7.0e} {m['fve']:7.4f} "
                f"{m['l0']:7.1f} {m['dead_fraction']:6.1%}"
                + ((f" {r['objective']:9.3f}" if "objective" in r else f" {'-':>9s}") if has_objective else "")
                + f" {r['cpu_seconds']:7.1f} {r['wall_seconds']:7.1f} {r['step_s'] * 1e3:8.0f}"
                + (f" {r['floor_s'] / r['step_s']:10.0%}" if "floor_s" in r else "")
                + (f"  {r['read_by_saegeo']['code_err']:.1e}" if "read_by_saegeo" in r else "")
            )
        print("(* the default run: TrainConfig(arch) with only the budget given)")
        curves = {side: best_curve(recs, arch, side) for side in SIDES}
        entry: dict = {"curves": {}}
        for side, curve in curves.items():
            if curve:
                pts = "  ".join(
                    f"{name} {p['setting']:g} (lr {p['lr']:.0e}): FVE {p['metrics']['fve']:.4f} at L0 {p['metrics']['l0']:.1f}"
                    for p in curve
                )
                print(f"[{arch}] curve {side:8s}: {pts}")
                entry["curves"][side] = [
                    dict(setting=p["setting"], lr=p["lr"], fve=p["metrics"]["fve"], l0=p["metrics"]["l0"])
                    for p in curve
                ]
        ours, theirs = curves["saegeo"], curves["saelens"]
        if ours and theirs:
            lo = max(ours[0]["metrics"]["l0"], theirs[0]["metrics"]["l0"])
            hi = min(ours[-1]["metrics"]["l0"], theirs[-1]["metrics"]["l0"])
            at = sorted({p["metrics"]["l0"] for p in ours + theirs if lo - 1e-9 <= p["metrics"]["l0"] <= hi + 1e-9})
            gaps = [(l0, interpolate(ours, l0) - interpolate(theirs, l0)) for l0 in at]
            if gaps:
                worst = min(g for _, g in gaps)
                print(
                    f"[{arch}] FVE saegeo - SAELens over the L0 range both cover [{lo:.1f}, {hi:.1f}]: "
                    + ", ".join(f"{g:+.4f} at L0 {l0:.1f}" for l0, g in gaps)
                    + f"; min {worst:+.4f}: saegeo's curve {'at or above' if worst >= 0 else 'BELOW'} SAELens'"
                )
                entry.update(overlap=[lo, hi], gaps=gaps, min_gap=worst)
            else:
                print(
                    f"[{arch}] the two curves cover no common L0 range (saegeo {ours[0]['metrics']['l0']:.1f}–"
                    f"{ours[-1]['metrics']['l0']:.1f}, SAELens {theirs[0]['metrics']['l0']:.1f}–{theirs[-1]['metrics']['l0']:.1f})"
                )
            pairs = {}
            for r in runs:
                if not r.get("default"):
                    pairs.setdefault((r["setting"], r["lr"]), {})[r["side"]] = r["cpu_seconds"]
            ratios = sorted(p["saelens"] / p["saegeo"] for p in pairs.values() if len(p) == 2)
            if ratios:
                med = (
                    ratios[len(ratios) // 2]
                    if len(ratios) % 2
                    else sum(ratios[len(ratios) // 2 - 1 : len(ratios) // 2 + 1]) / 2
                )
                print(
                    f"[{arch}] CPU seconds SAELens / saegeo over {len(ratios)} matched runs: median {med:.2f}x "
                    f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x)"
                )
                entry.update(cpu_ratio_median=med, cpu_ratio_min=ratios[0], cpu_ratio_max=ratios[-1])
        dflt = default_config(arch, args).resolved()
        setting = sparsity_setting(dflt)
        twin = (
            []
            if arch in JUMPRELU_FORMS
            else [
                r
                for r in runs
                if r["side"] == "saegeo"
                and not r.get("default")
                and r["setting"] == setting
                and r["lr"] == dflt.lr
                and same_weights(dflt, grid_config(arch, setting, dflt.lr, args), D_IN)
            ]
        )
        if twin:  # the defaults are a grid point: the same config on the same rows trains the same weights
            m = twin[0]["metrics"]
            best = next((p for p in ours if p["setting"] == setting), None)
            print(
                f"[{arch}] defaults (lr {dflt.lr:g}, {name} {setting:g}) are the grid run {twin[0]['key']} (the same "
                f"TrainConfig in every option that changes the weights): FVE {m['fve']:.4f} at L0 {m['l0']:.1f}, "
                + (
                    "a point of saegeo's curve"
                    if best is twin[0]
                    else f"NOT {name} {setting:g}'s best lr ({best['lr']:g})"
                    if best
                    else "no curve point"
                )
            )
            entry["defaults_grid_run"] = twin[0]["key"]
        for d in (r for r in runs if r.get("default")):
            m, dc = d["metrics"], d["default_config"]
            on = interpolate(ours, m["l0"]) if ours else None
            where = (
                f"saegeo's curve there {on:.4f} ({m['fve'] - on:+.4f}): "
                + ("on or above the curve" if m["fve"] >= on - 1e-3 else "BELOW the curve")
                if on is not None
                else "outside saegeo's curve's L0 range"
            )
            their = interpolate(theirs, m["l0"]) if theirs else None
            if their is not None:
                where += f"; SAELens' curve there {their:.4f} ({m['fve'] - their:+.4f})"
            cfg_text = f"lr {dc['lr']:g}" + (
                f", l1 {dc['l1_coefficient']:g}"
                if arch in ("relu", "gated")
                else f", l0_target {dc['k']}, l0_coefficient 1 on the FVU"
                if arch in JUMPRELU_FORMS
                else f", k {dc['k']}"
            )
            print(f"[{arch}] defaults ({cfg_text}): FVE {m['fve']:.4f} at L0 {m['l0']:.1f}; {where}")
            entry["defaults"] = dict(config=dc, fve=m["fve"], l0=m["l0"], curve_fve=on, saelens_curve_fve=their)
            chk = d.get("saelens_load")
            if chk:
                print(
                    f"[{arch}] SAELens {chk['version']} loads the saegeo default SAE as {chk['cls']}: max |codes diff| "
                    f"{chk['code_err']:.2e} ({chk['support']} entries differ in support), max relative recon diff "
                    f"{chk['recon_err']:.2e}"
                )
                entry["saelens_load"] = chk
        if arch != "relu":
            for side, curve in curves.items():
                shares = [f"{p['floor_s'] / p['step_s']:.0%} (k {p['setting']:g})" for p in curve if "floor_s" in p]
                if shares:
                    print(f"[{arch}] floor / step, {side}'s curve: " + ", ".join(shares))
        summary[arch] = entry
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train_bench.json").write_text(json.dumps(summary, indent=1))


# =========================================================================== where the FVE gap to SAELens' TopK comes from
def offset_stats(sae, data: Data) -> dict:
    """What a TopK SAE does with the activation mean μ: ‖b_dec − μ‖/‖μ‖, the share of μ that the latents carry
    (mean over held-out rows of Σ_i a_i w_i, projected on μ, over ‖μ‖²), and the latents firing on > 30 % of the
    held-out tokens (dense latents: what a mean the bias does not hold turns into)."""
    mu = data.mean.float()
    with torch.no_grad():
        codes = sae.encode(data.held_x)
        latent_mean = (codes @ sae.W_dec).mean(0)
        freq = (codes > 0).float().mean(0)
    return dict(
        b_dec_off=float((sae.b_dec.detach() - mu).norm() / mu.norm()),
        mean_in_latents=float(latent_mean @ mu / (mu @ mu)),
        dense_latents=int((freq > 0.3).sum()),
    )


def offset_ablation(args) -> None:
    """saegeo's TopK at one (k, lr) with its defaults, with unit rows (the former default), and with SAELens'
    settings (b_dec 0, its clip at 1 on SSE/n — on saegeo's FVU loss a clip at n/Σ‖x − x̄‖², no warm-up, no decay,
    AuxK off as SAELens' 1000-step window leaves it in this budget), with and without b_dec at the mean; beside
    SAELens' own run at that (k, lr) (its SAE saved by the grid)."""
    from dataclasses import replace

    torch.set_num_threads(args.threads)
    data = Data(args)
    k, lr = args.ks[0], args.lrs[0]
    base = grid_config("topk", k, lr, args)
    train_rows = data.train_x.double()
    mean_sq = float((train_rows - train_rows.mean(0)).pow(2).sum(1).mean())  # Σ‖x − x̄‖²/n over the training rows
    no_auxk = {"topk": {"k": int(k), "aux_coefficient": 0.0}}
    saelens_like = dict(b_dec_init="zeros", grad_clip_norm=1 / mean_sq, warmup_steps=0, decay_fraction=0.0,
                        arch_options=no_auxk)  # fmt: skip
    variants = {
        "saegeo defaults (free rows, b_dec = mean)": base,
        "saegeo, unit rows (before)": replace(base, decoder_norm="unit"),
        "saegeo at SAELens' settings (b_dec = 0)": replace(base, **saelens_like),
        "saegeo at SAELens' settings, b_dec = mean": replace(base, **{**saelens_like, "b_dec_init": "mean"}),
    }
    rows = {}
    for name, cfg in variants.items():
        c0 = time.process_time()
        sae = train_sae(cfg, data.x, resume=False).sae
        rows[name] = {**evaluate(sae, [data.held_x], data.mean), **offset_stats(sae, data)}
        rows[name]["cpu_seconds"] = time.process_time() - c0
    saelens_dir = Path(args.out) / f"saelens_topk_lr{lr:g}"
    if k == 32 and (saelens_dir / "cfg.json").exists():  # the grid saves SAELens' k 32 runs in its own format
        sae = SAE.load(saelens_dir)
        rows[f"SAELens {k} lr {lr:g} (its grid run)"] = {
            **evaluate(sae, [data.held_x], data.mean),
            **offset_stats(sae, data),
        }
    print(f"\n=== TopK k {k}, lr {lr:g}, {args.tokens:,} tokens: the FVE and what carries the mean μ ===")
    print(f"{'':46s} {'FVE':>7s} {'dead':>6s} {'‖b_dec−μ‖/‖μ‖':>14s} {'μ in latents':>12s} {'>30% latents':>12s}")
    for name, r in rows.items():
        print(
            f"{name:46s} {float(r['fve']):7.4f} {float(r['dead_fraction']):6.1%} {r['b_dec_off']:14.3f} "
            f"{r['mean_in_latents']:12.3f} {r['dense_latents']:12d}"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "offset_ablation.json").write_text(json.dumps(json_safe(rows), indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["relu", "topk", "batchtopk"])
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument("--lrs", nargs="+", type=float, default=list(LRS), help="the lr grid both sides search")
    ap.add_argument("--l1s", nargs="+", type=float, default=list(SETTINGS["relu"]), help="ReLU's L1 coefficients")
    ap.add_argument("--ks", nargs="+", type=int, default=list(SETTINGS["topk"]), help="TopK / BatchTopK k")
    ap.add_argument(
        "--l0-coefs", nargs="+", type=float, default=[0.5, 2.0], help="JumpReLU step/tanh: SAELens' l0_coefficient"
    )
    ap.add_argument("--tokens", type=int, default=737_280)
    ap.add_argument("--batch", type=int, default=BATCH, help="rows per step, both sides")
    ap.add_argument("--d-sae", type=int, default=D_SAE)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and OMP_NUM_THREADS) for both sides")
    ap.add_argument("--acts", help="store directory or .safetensors with an `activations` tensor")
    ap.add_argument("--out", default=str(ROOT / "artifacts/runs/train_bench"))
    ap.add_argument("--results", help="one JSON per run (default OUT/results)")
    ap.add_argument("--saelens-python", type=Path, default=SAELENS_PY)
    ap.add_argument(
        "--pause-file",
        default=None,
        help="no new run starts while this path exists (e.g. a lock held while the full suite runs)",
    )
    ap.add_argument(
        "--lr-order",
        nargs="*",
        default=["saegeo=8e-3,4e-3", "saelens=2e-3,4e-3"],
        help="the order each side's lrs run in (the best lrs of earlier runs first; the grid is --lrs)",
    )
    ap.add_argument("--no-defaults", action="store_true", help="skip the runs at saegeo's defaults")
    ap.add_argument("--worker", action="store_true", help="only run jobs (another process prints)")
    ap.add_argument("--print", action="store_true", help="only print the curves from the saved results")
    ap.add_argument(
        "--offset-ablation",
        action="store_true",
        help="only saegeo's TopK at the first --ks and --lrs, at its defaults, unit rows and SAELens' settings",
    )
    args = ap.parse_args()
    args.results = args.results or str(Path(args.out) / "results")
    if args.offset_ablation:
        offset_ablation(args)
        return
    if not args.print:
        if "saelens" in args.sides and not args.saelens_python.exists():
            sys.exit(
                f"{args.saelens_python} missing: make .venv-saelens/.installed (python3 -m venv .venv-saelens && "
                ".venv-saelens/bin/pip install torch==2.13.0 sae-lens==6.54.12)"
            )
        work(args)
    if not args.worker:
        report(args)


if __name__ == "__main__":
    main()

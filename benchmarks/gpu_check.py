"""GPU checks, one line each and one table at the end (run by benchmarks/gpu_check.sh): cache on the GPU vs the
CPU, TopK training tokens/s on the GPU vs the same machine's CPU, every registered architecture trained on the GPU
vs the CPU, a report with its accumulators on the GPU, the accumulation against a bare GPU gram (goal ≥ 0.5),
training throughput at d 2,304 × 16,384 latents in bf16 against the FLOP bound (goal ≥ 1M tokens/s on an H200),
caching with a SmolLM2-shaped model (its config, random weights: the GGUF does not fit the carried tree), the SAE
spliced into the model on the GPU (saegeo eval) vs the CPU, and saegeo's DDP path under `torchrun
--nproc_per_node 1` on NCCL.

No network and no MiniLM weights there: the model is a tiny random HookedTransformer from a config (with
MiniLM's tokenizer files, carried), the corpus is CPython's bundled pydoc topics, training data is synthetic.
--cpu-dry-run runs the same logic with "cuda" replaced by "cpu" (and gloo), small, for machines without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from saegeo.activations.cache import CacheConfig, cache_activations  # noqa: E402
from saegeo.activations.models import from_config  # noqa: E402
from saegeo.activations.store import ActivationStore  # noqa: E402
from saegeo.report.geometry_report import ReportOptions, geometry_report  # noqa: E402
from saegeo.sae.train import TrainConfig, train_sae  # noqa: E402
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig  # noqa: E402

HOOK = "blocks.1.hook_resid_post"


def tiny_model(tokenizer_dir: str | None, d_model: int):
    cfg = dict(
        n_layers=2,
        d_model=d_model,
        n_ctx=128,
        d_head=32,
        n_heads=d_model // 32,
        d_mlp=4 * d_model,
        d_vocab=30_522,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
    )
    return from_config(cfg, tokenizer=tokenizer_dir)


ROWS: list[tuple[str, bool, str]] = []  # (check, passed, its figure): the table printed at the end


def check(name: str, ok: bool, detail: str, figure: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name:<10} {detail}", flush=True)
    ROWS.append((name, ok, (figure or detail.split(";")[0]).replace("|", "\\|")))  # a Markdown cell
    return ok


def print_table() -> None:
    print("\n| check | result | figure |\n|---|---|---|")
    for name, ok, figure in ROWS:
        print(f"| {name} | {'PASS' if ok else 'FAIL'} | {figure} |")


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="no GPU: run every check with device cpu, small")
    ap.add_argument("--tokenizer", default=None, help="directory with MiniLM's tokenizer files (default: bundled)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak (H200: 989)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the torchrun side
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    dry = args.cpu_dry_run
    gpu = "cpu" if dry else "cuda"
    if args.worker:
        return torchrun_worker(args.store, gpu, dry)
    if not dry and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --cpu-dry-run to test the logic on the CPU")
    torch.backends.cuda.matmul.allow_tf32 = False  # the equality checks compare float32 with float32
    torch.backends.cudnn.allow_tf32 = False
    work = Path(args.work or tempfile.mkdtemp(prefix="saegeo_gpu_check_"))
    size = (
        dict(tokens=4_000, d_model=64, train_tokens=40_960, d_sae=512, d=64)
        if dry
        else dict(tokens=60_000, d_model=256, train_tokens=2_457_600, d_sae=8_192, d=512)
    )
    print(
        f"device: {torch.cuda.get_device_name(0) if not dry else 'cpu (dry run)'}; torch {torch.__version__}; "
        f"CPU threads {torch.get_num_threads()}; work {work}",
        flush=True,
    )
    ok = True

    # 1. cache on the GPU against the CPU
    loaded = tiny_model(args.tokenizer, size["d_model"])
    stores, secs = {}, {}
    sides = (("cpu", "cpu"), ("gpu", gpu))  # (label, device): in a dry run both are the CPU
    for side, dev in sides:
        t0 = time.perf_counter()
        res = cache_activations(
            CacheConfig(
                hooks=(HOOK,),
                out=str(work / f"cache_{side}"),
                max_tokens=size["tokens"],
                device=dev,
                progress=False,
                overwrite=True,
                shard_rows=8_192,
            ),
            loaded=loaded,
        )
        secs[side], stores[side] = time.perf_counter() - t0, ActivationStore(res.stores[HOOK])
    a, b = (s.read_rows(0, s.n_tokens) for s in stores.values())
    rel = float((a - b).abs().max() / a.abs().max())
    ok &= check(
        "cache",
        a.shape == b.shape and rel < 1e-4,
        f"{a.shape[0]:,} tokens x {a.shape[1]}: max |GPU − CPU| / max |x| = {rel:.1e} (tolerance 1e-4); "
        f"{secs['cpu']:.1f} s CPU vs {secs['gpu']:.1f} s {gpu}",
    )

    # 2. TopK training on the GPU against the same machine's CPU
    gen = SuperpositionGenerator(
        SyntheticConfig(d=size["d"], n_features=4 * size["d"], rate=16 / (4 * size["d"]), offset=1.0, seed=0)
    )
    x = gen.sample(200_000 if not dry else 20_000)[0]
    tps = {}
    for side, dev in sides:
        cfg = TrainConfig(
            arch="topk",
            d_sae=size["d_sae"],
            arch_options={"topk": {"k": 32}},
            batch_tokens=4096,
            total_tokens=size["train_tokens"],
            device=dev,
            progress=False,
            log_every=50,
        )
        t0 = time.perf_counter()
        res = train_sae(cfg, x.to(dev) if dev != "cpu" else x, resume=False)
        tps[side] = (cfg.total_tokens / (time.perf_counter() - t0), res.heldout["fve"])
    (cpu_tps, cpu_fve), (gpu_tps, gpu_fve) = tps.values()
    ok &= check(
        "train",
        abs(cpu_fve - gpu_fve) < 0.02,
        f"TopK d_sae {size['d_sae']}, {size['train_tokens']:,} tokens: {gpu_tps:,.0f} tok/s on {gpu} vs "
        f"{cpu_tps:,.0f} on the CPU ({gpu_tps / cpu_tps:.1f}x); held-out FVE {gpu_fve:.3f} vs {cpu_fve:.3f}",
    )

    # 2b. the same TopK run under bf16 autocast on the device (train --dtype bf16): float32 weights, the same FVE
    t0 = time.perf_counter()
    low = train_sae(dataclasses.replace(cfg, dtype="bfloat16"), x.to(gpu) if gpu != "cpu" else x, resume=False)
    low_tps = cfg.total_tokens / (time.perf_counter() - t0)
    ok &= check(
        "train bf16",
        abs(low.heldout["fve"] - gpu_fve) < 0.02 and all(p.dtype == torch.float32 for p in low.sae.parameters()),
        f"TopK under torch.autocast(bfloat16): {low_tps:,.0f} tok/s vs {gpu_tps:,.0f} in float32 "
        f"({low_tps / gpu_tps:.2f}x); held-out FVE {low.heldout['fve']:.3f} vs {gpu_fve:.3f}; weights float32",
    )

    # 3. a report with the SAE and the float64 accumulators on the device
    store = stores["gpu"]
    sae_dir = work / "sae"
    train_sae(
        TrainConfig(
            arch="topk",
            d_sae=4 * store.d,
            arch_options={"topk": {"k": 16}},
            batch_tokens=1024,
            total_tokens=20_480,
            device=gpu,
            progress=False,
            out_dir=str(sae_dir),
        ),
        store,
        resume=False,
    )
    r_cpu, r_gpu = (
        geometry_report(store, str(sae_dir), options=ReportOptions(device=dev, progress=False)) for _, dev in sides
    )
    diff = max(
        abs(r_cpu.activations["anisotropy"] - r_gpu.activations["anisotropy"]),
        abs(r_cpu.saes[0].fve - r_gpu.saes[0].fve),
    )
    ok &= check(
        "report",
        diff < 1e-5,
        f"{r_gpu.source['n_tokens']:,} tokens: A {r_gpu.activations['anisotropy']:.4f}, "
        f"SAE FVE {r_gpu.saes[0].fve:.4f}; max |{gpu} − cpu| {diff:.1e}; {r_gpu.seconds:.1f} s on {gpu}",
    )

    # 3b. the GeometryAccumulator alone on the device against the CPU, past its row sample (the sampled sd path)
    ok &= check_accumulator(gpu, dry)
    # 3c. the report's accumulation against the bare gram on the device
    ok &= check_gram_share(gpu, dry)
    # 3d. every registered architecture trained on the device against the CPU
    ok &= check_architectures(gpu, dry)
    # 3e. training throughput at a published width in bf16 against the FLOP bound
    ok &= check_throughput(gpu, dry, args.peak_tflops)
    # 3f. caching with a SmolLM2-shaped model
    ok &= check_smollm2_cache(gpu, dry, args.tokenizer, work)

    # 4. the SAE spliced into the model on the device (saegeo eval) against the CPU
    from saegeo.sae.evaluate import EvalConfig, splice_eval_many
    from saegeo.sae.model import SAE

    evals, secs = {}, {}
    for side, dev in sides:
        ecfg = EvalConfig(
            hook=HOOK,
            context=64,
            max_tokens=512 if dry else 8_192,
            skip_tokens=0,
            batch_windows=8,
            device=dev,
            progress=False,
        )
        t0 = time.perf_counter()
        evals[side] = splice_eval_many(ecfg, {"sae": SAE.load(sae_dir)}, loaded)["sae"]
        secs[side] = time.perf_counter() - t0
    keys = ("ce_loss_clean", "ce_loss_spliced", "ce_loss_zero_ablation", "ce_loss_mean_ablation", "kl_div_spliced")
    diff = max(abs(evals["cpu"][k] - evals["gpu"][k]) for k in keys)
    e = evals["gpu"]
    loaded.to(gpu)
    layout = loaded.model.unembed.W_U.T.is_contiguous()  # load_model's fast weight layout survives .to(device)
    ok &= check(
        "eval",
        diff < 1e-4 and layout,
        f"fast layout on {gpu}: {layout}; "
        f"{e['tokens']:,} tokens: CE clean / spliced {e['ce_loss_clean']:.4f} / "
        f"{e['ce_loss_spliced']:.4f}, recovered {e['ce_loss_recovered']:.4f}; max |{gpu} − cpu| over CE/KL "
        f"{diff:.1e}; {secs['gpu']:.1f} s on {gpu} vs {secs['cpu']:.1f} s on the CPU",
    )

    # 5. torchrun --nproc_per_node 1: saegeo's DDP path on a process group of one (NCCL on the GPU)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        __file__,
        "--worker",
        "--store",
        str(store.path),
    ] + (["--cpu-dry-run"] if dry else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("WORKER")]
    ok &= check(
        "torchrun",
        proc.returncode == 0 and bool(line),
        (line[-1][7:] if line else proc.stderr[-400:].replace("\n", " | ")) + f"; {time.perf_counter() - t0:.1f} s",
    )
    print_table()
    print("ALL PASS" if ok else "SOME CHECKS FAILED", flush=True)
    sys.exit(0 if ok else 1)


def check_gram_share(gpu: str, dry: bool) -> bool:
    """Rows/s of GeometryAccumulator.add (what the report's pass does per batch) against a bare float32 gram
    (b.T @ b per batch) over the same batches on the device: the share is gram time / accumulation time."""
    from saegeo.geometry.accumulate import GeometryAccumulator

    n, d = (16_384, 64) if dry else (262_144, 2_304)
    gen = torch.Generator().manual_seed(1)
    batches = [b.to(gpu) for b in (torch.randn(n, d, generator=gen) + 0.3).split(8_192)]
    times = {}
    for name in ("gram", "accumulate", "gram", "accumulate"):  # the second of each is timed warm
        acc = GeometryAccumulator(d) if name == "accumulate" else None
        sync(gpu)
        t0 = time.perf_counter()
        for b in batches:
            if acc is None:
                torch.mm(b.T, b)
            else:
                acc.add(b)
        sync(gpu)
        times[name] = time.perf_counter() - t0
    share = times["gram"] / times["accumulate"]
    return check(
        "gram share",
        dry or share >= 0.5,
        f"{n:,} x {d} rows in batches of 8,192: accumulation {n / times['accumulate']:,.0f} rows/s, bare float32 "
        f"gram {n / times['gram']:,.0f} rows/s on {gpu}: share {share:.2f} (goal >= 0.5)",
        f"report accumulation at {share:.2f} of the bare gram (d {d:,})",
    )


def check_architectures(gpu: str, dry: bool) -> bool:
    """Every registered architecture (the new ones as they land) trained on the device and on the CPU from the
    same data: held-out FVE within 0.02, tokens/s of each side."""
    import dataclasses

    from saegeo.sae.architectures import architecture_names, get_architecture

    d, d_sae, tokens = (32, 128, 4_096) if dry else (128, 1_024, 204_800)
    gen = SuperpositionGenerator(SyntheticConfig(d=d, n_features=4 * d, rate=8 / (4 * d), offset=1.0, seed=3))
    x = gen.sample(2 * tokens)[0]
    ok, parts = True, []
    for arch in architecture_names():
        fve, tps = {}, {}
        for side, dev in (("cpu", "cpu"), ("gpu", gpu)):
            fields = {f.name for f in dataclasses.fields(get_architecture(arch).Options)}
            sparsity = {arch: {name: 16 for name in ("k", "l0_target") if name in fields}}  # 16 active a row
            cfg = TrainConfig(
                arch=arch,
                arch_options=sparsity,
                d_sae=d_sae,
                batch_tokens=1024,
                total_tokens=tokens,
                device=dev,
                progress=False,
            )
            t0 = time.perf_counter()
            res = train_sae(cfg, x.to(dev), resume=False)
            tps[side], fve[side] = tokens / (time.perf_counter() - t0), res.heldout["fve"]
        good = abs(fve["cpu"] - fve["gpu"]) < 0.02 and (dry or fve["gpu"] > 0)  # a dry run trains 4 steps
        ok &= good
        parts.append(f"{arch} FVE {fve['gpu']:.3f}/{fve['cpu']:.3f} {tps['gpu']:,.0f} tok/s{'' if good else ' FAIL'}")
    return check(
        "archs",
        ok,
        f"d {d} x {d_sae}, {tokens:,} tokens, {gpu}/cpu: " + "; ".join(parts),
        f"{len(parts)} architectures: " + ", ".join(p.split(" FVE")[0] for p in parts) + " (FVE GPU = CPU ± 0.02)",
    )


def check_throughput(gpu: str, dry: bool, peak_tflops: float) -> bool:
    """TopK training at d 2,304 × 16,384 latents under bf16 autocast on the device, data already there: tokens/s
    against the FLOP bound peak / (6·d·d_sae) per token (the encoder's matmul forward 2·d·d_sae and backward
    4·d·d_sae; the TopK decoder's sparse work is left out, so the bound is generous). Goal: >= 1M tokens/s on an
    H200 (about 40 % of that bound)."""
    d, d_sae, rows, tokens = (64, 512, 16_384, 8_192 * 3) if dry else (2_304, 16_384, 131_072, 8_192 * 400)
    x = torch.randn(rows, d, generator=torch.Generator().manual_seed(2)).to(gpu)
    cfg = TrainConfig(
        arch="topk", d_sae=d_sae, arch_options={"topk": {"k": 32}}, batch_tokens=8_192, total_tokens=tokens, device=gpu, progress=False,
        dtype="bfloat16", log_every=100, heldout_fraction=0.01, b_dec_init_tokens=8_192,
    )  # fmt: skip
    warm = 8_192 * (2 if dry else 20)
    train_sae(dataclasses.replace(cfg, total_tokens=warm), x, resume=False)  # warm-up (kernels, allocator)
    sync(gpu)
    t0 = time.perf_counter()
    train_sae(cfg, x, resume=False)
    sync(gpu)
    tps = tokens / (time.perf_counter() - t0)
    bound = peak_tflops * 1e12 / (6 * d * d_sae)
    return check(
        "throughput",
        dry or tps >= 1e6,
        f"TopK d {d:,} x {d_sae:,}, bf16, batches of 8,192: {tps:,.0f} tokens/s = {tps / bound:.1%} of the FLOP "
        f"bound {bound:,.0f} (peak {peak_tflops:g} TFLOPS, 6·d·d_sae per token); goal >= 1M tokens/s",
        f"{tps / 1e6:.2f}M tokens/s, {tps / bound:.0%} of the FLOP bound",
    )


def check_smollm2_cache(gpu: str, dry: bool, tokenizer: str | None, work: Path) -> bool:
    """saegeo cache with SmolLM2-135M's architecture (30 Llama blocks, d 576, 9 heads / 3 KV heads, gated SiLU MLP
    1,536, RMSNorm, rotary; random weights: the GGUF is larger than the tree carried to a device) at layer 15 on
    the device: tokens/s, and its first rows against the CPU's."""
    cfg = dict(
        n_layers=2 if dry else 30, d_model=576, d_head=64, n_heads=9, n_key_value_heads=3, d_mlp=1_536,
        n_ctx=2_048, d_vocab=49_152, act_fn="silu", gated_mlp=True, normalization_type="RMS", final_rms=True,
        positional_embedding_type="rotary", rotary_dim=64, rotary_base=100_000, seed=0,
    )  # fmt: skip
    loaded = from_config(cfg, tokenizer=tokenizer, name="smollm2-shaped")
    hook = "blocks.1.hook_resid_post" if dry else "blocks.15.hook_resid_post"
    rows, secs = {}, {}
    for side, dev, n in (("cpu", "cpu", 1_024), ("gpu", gpu, 4_096 if dry else 262_144)):
        t0 = time.perf_counter()
        res = cache_activations(
            CacheConfig(hooks=(hook,), out=str(work / f"smol_{side}"), max_tokens=n, context=128,
                        batch_windows=64, device=dev, progress=False, overwrite=True),
            loaded=loaded,
        )  # fmt: skip
        secs[side] = (n / (time.perf_counter() - t0), ActivationStore(res.stores[hook]))
        rows[side] = secs[side][1].read_rows(0, 1_024)
    rel = float((rows["cpu"] - rows["gpu"]).abs().max() / rows["cpu"].abs().max())
    return check(
        "smollm2",
        rel < 1e-3,
        f"SmolLM2-shaped ({cfg['n_layers']} blocks), {hook}: {secs['gpu'][0]:,.0f} tokens/s on {gpu} "
        f"({secs['gpu'][1].n_tokens:,} tokens), {secs['cpu'][0]:,.0f} on the CPU; first 1,024 rows max |GPU − CPU| "
        f"/ max |x| = {rel:.1e} (tolerance 1e-3)",
        f"cache {secs['gpu'][0]:,.0f} tokens/s at {hook}",
    )


def check_accumulator(gpu: str, dry: bool) -> bool:
    """GeometryAccumulator + activation_geometry with the batches on ``gpu`` and on the CPU: n rows past the
    seeded row sample (so the null test's sd takes the sampled path), the same rows in the same batches. The exact
    read-outs agree to float32 rounding of the grams (tolerance 1e-4 relative), the sampled sd to the same (the
    sample is the same rows, by global row index), and the time of each side is printed."""
    from saegeo.geometry.accumulate import GeometryAccumulator
    from saegeo.geometry.measures import activation_geometry

    n, d, sample = (6_000, 64, 1_024) if dry else (400_000, 768, 8_192)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen) * torch.logspace(0.5, -1, d) + torch.randn(d, generator=gen) * 0.5
    out, secs = {}, {}
    for side, dev in (("cpu", "cpu"), ("gpu", gpu)):
        batches = [b.to(dev) for b in x.split(8_192)]
        if dev != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        acc = GeometryAccumulator(d, sample_rows=sample)
        for b in batches:
            acc.add(b)
        if dev != "cpu":
            torch.cuda.synchronize()
        secs[side] = time.perf_counter() - t0
        out[side] = activation_geometry(acc.to("cpu"))
    a, b = out["cpu"], out["gpu"]
    rel = max(
        abs(a.anisotropy - b.anisotropy) / abs(a.anisotropy),
        abs(a.null_sd - b.null_sd) / a.null_sd,
        max(abs(u - v) for u, v in zip(a.eigenvalues, b.eigenvalues)) / a.eigenvalues[0],
    )
    return check(
        "accum",
        rel < 1e-4,
        f"{n:,} x {d} rows, sample {sample:,}: A {b.anisotropy:.5f}, null_sd {b.null_sd:.3e}; max relative "
        f"|{gpu} − cpu| over A, null_sd, λ {rel:.1e} (tolerance 1e-4); accumulate {secs['gpu']:.2f} s on {gpu} "
        f"vs {secs['cpu']:.2f} s on the CPU",
    )


def torchrun_worker(store: str, gpu: str, dry: bool) -> None:
    """Under torchrun: an all_reduce on the group (NCCL on the GPU), then saegeo's trainer under the launcher's
    environment. With one rank saegeo takes its single-process path (distributed.current() is None below two
    ranks), so DDP's gradient all-reduce itself needs two GPUs: `torchrun --nproc_per_node 2` of the same file."""
    import torch.distributed as dist

    backend = "gloo" if dry else "nccl"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    t = torch.arange(4.0, device=gpu)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.arange(4.0) * dist.get_world_size()), t
    with tempfile.TemporaryDirectory() as out:
        res = train_sae(
            TrainConfig(
                arch="topk",
                d_sae=256,
                arch_options={"topk": {"k": 8}},
                batch_tokens=512,
                total_tokens=10_240,
                device=gpu,
                progress=False,
                out_dir=out,
                checkpoint_every=10,
            ),
            store,
            resume=False,
        )
        world = res.provenance.get("world_size")
    print(
        f"WORKER backend {dist.get_backend()}, world {dist.get_world_size()}: all_reduce of a {gpu} tensor exact; "
        f"saegeo train under torchrun: held-out FVE {res.heldout['fve']:.3f} (DDP path: {world is not None})",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

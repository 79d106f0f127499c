"""`saegeo check` on dictionaries of published width: SAELens-format directories (cfg.json + sae_weights.safetensors,
laid out as SAELens 6.54 writes a JumpReLU SAE) of 16k, 65k and 262k latents × 2,304 (Gemma Scope 2B's shapes,
synthetic weights), checked one by one in child processes; prints time, CPU seconds and peak RSS per width, the
peak against the budget (1.5 × the float32 W_dec + a fixed allowance) and how the cost grows with width.

  * The files are written streaming (a block of rows at a time: W_dec rows appended, W_enc's columns written in
    place with pwrite), so this script never holds a matrix; 262k × 2304 float32 is 2.4 GB per matrix, 4.8 GB on
    disk. They are deleted after each width unless --keep.
  * Each width's check runs as `/usr/bin/time -v python -m saegeo.cli check DIR --out ...` (its maximum resident
    set size, user + sys CPU seconds and wall time); a child that only imports saegeo and torch gives the
    interpreter's own RSS, part of the fixed allowance.
  * Planted near-duplicate pairs (cos ≈ 0.995) must all be found, no others.
  * --acts-rows R (> 0) also runs `check --acts` at each width on a store of R rows written for that dictionary
    (`write_acts_store`: each row a sparse sum of ACTIVE of its decoder directions plus noise, so its codes are
    sparse, L0 ≈ ACTIVE, as a trained SAE's on its own activations; token ids and positions, so the artifact test
    and the latent cards' contexts run too): time, CPU seconds and peak RSS against the same budget.
  * --phases also times each part of the check (load, geometry, duplicates, nearest neighbours, encoder-decoder,
    flags) in one child per width, on the same mapped weights, to show which part grows how.
  * --parts runs each `check --acts` inside benchmarks/memory_parts.py and prints where its memory goes: the peak
    resident memory while each part ran (anonymous and file-backed), what it kept, and its wall seconds.

    python benchmarks/check_bench.py [--widths 16384 65536 262144] [--d 2304] [--threads 2] [--phases]
                                     [--acts-rows 16384] [--parts] [--skip-weights]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAELENS_VERSION = "6.54.12"  # the cfg.json written is the one SAELens 6.54.12 JumpReLUSAE.save_model writes
BLOCK = 4096  # rows per block written
THRESHOLD = 1.0  # JumpReLU threshold: ~3.7 sd of a silent latent's pre-activation on `write_acts_store` rows
ACTIVE = 32  # decoder directions summed per row of the --acts store


def planted_pairs(n: int, n_dup: int) -> list[tuple[int, int]]:
    return [(k * 997 % (n // 2), k * 997 % (n // 2) + n // 2) for k in range(n_dup)]


def _rows(s: int, e: int, d: int, seed: int, pairs: list[tuple[int, int]]) -> np.ndarray:
    """Decoder rows s … e − 1: seeded per block, unit directions times norms in [0.5, 1.5); row j of a planted
    pair (i, j) is row i's direction + 0.1 · a unit noise (cos ≈ 0.995)."""
    rng = np.random.default_rng([seed, s])
    w = rng.standard_normal((e - s, d), dtype=np.float32)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    for k, (i, j) in enumerate(pairs):
        base = np.random.default_rng([seed, 1 << 40, k]).standard_normal(d).astype(np.float32)
        base /= np.linalg.norm(base)
        if s <= i < e:
            w[i - s] = base
        if s <= j < e:
            noise = np.random.default_rng([seed, 1 << 41, k]).standard_normal(d).astype(np.float32)
            w[j - s] = base + 0.1 * noise / np.linalg.norm(noise)
    scale = np.random.default_rng([seed, 1 << 42, s]).uniform(0.5, 1.5, size=(e - s, 1)).astype(np.float32)
    return w * scale


def write_saelens(folder: Path, n: int, d: int, n_dup: int, seed: int = 0) -> None:
    """A SAELens 6.54 JumpReLU directory: cfg.json as JumpReLUSAE.save_model writes it, and a safetensors file in
    safetensors' own layout (tensors by name, header JSON padded with spaces to 8 bytes, no __metadata__).
    W_enc = W_decᵀ + 0.01·noise (a tied-then-trained encoder), b_enc 0, b_dec seeded N(0, I/d), threshold THRESHOLD."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "d_in": d,
        "d_sae": n,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": False,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {
            "sae_lens_version": SAELENS_VERSION,
            "sae_lens_training_version": SAELENS_VERSION,
            "model_name": "gemma-2-2b",
            "hook_name": "blocks.12.hook_resid_post",
        },
        "architecture": "jumprelu",
    }
    (folder / "cfg.json").write_text(json.dumps(cfg))
    shapes = {"W_dec": (n, d), "W_enc": (d, n), "b_dec": (d,), "b_enc": (n,), "threshold": (n,)}
    header, offset = {}, 0
    for name, shape in shapes.items():  # sorted by name, as safetensors writes them
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    pairs = planted_pairs(n, n_dup)
    enc_at = start + header["W_enc"]["data_offsets"][0]
    with open(folder / "sae_weights.safetensors", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(start + offset)
        fd = f.fileno()
        for s in range(0, n, BLOCK):
            e = min(n, s + BLOCK)
            w = _rows(s, e, d, seed, pairs)
            os.pwrite(fd, w.tobytes(), start + s * d * 4)
            noise = np.random.default_rng([seed, 1 << 43, s]).standard_normal((d, e - s), dtype=np.float32)
            enc = np.ascontiguousarray(w.T) + np.float32(0.01) * noise
            for r in range(d):  # row r of W_enc (d, n): columns s … e − 1
                os.pwrite(fd, enc[r].tobytes(), enc_at + (r * n + s) * 4)
        rng = np.random.default_rng([seed, 1 << 44])
        tail = [
            rng.standard_normal(d).astype(np.float32) / np.float32(math.sqrt(d)),  # ‖b_dec‖ ≈ 1 ≈ ‖μ‖ of the store
            np.zeros(n, np.float32),
            np.full(n, THRESHOLD, np.float32),
        ]
        for name, value in zip(("b_dec", "b_enc", "threshold"), tail):
            os.pwrite(fd, value.tobytes(), start + header[name]["data_offsets"][0])
        os.fsync(fd)  # on disk, as a downloaded file is: dirty pages could not be handed back by the check


def write_acts_store(folder: Path, store: Path, rows: int, d: int, seed: int = 1) -> None:
    """A saegeo store of `rows` activations for the dictionary in `folder`: x = Σ_{k∈S} c_k u_k + 0.05·z, S ACTIVE
    latents drawn per row, c_k ~ U(1, 3), u_k = W_dec,k/‖W_dec,k‖ read from the file's mapped pages, z ~ N(0, I_d).
    A silent latent's pre-activation W_enc[:, i]·x has sd ≈ √(Σc²/d + 10⁻⁴·Σc²) ≈ 0.27, an active one's is
    c_i‖w_i‖ ≥ 0.5: with THRESHOLD 1.0 about ACTIVE·0.6 of the chosen latents fire and 10⁻⁴ of the others. Token
    ids and positions (windows of 128) are stored too; the model and hook are the SAE's."""
    from saegeo.activations.store import StoreWriter

    header_len = int.from_bytes((folder / "sae_weights.safetensors").read_bytes()[:8], "little")
    header = json.loads((folder / "sae_weights.safetensors").read_bytes()[8 : 8 + header_len])
    n = header["W_dec"]["shape"][0]
    w_dec = np.memmap(
        folder / "sae_weights.safetensors",
        dtype=np.float32,
        mode="r",
        offset=8 + header_len + header["W_dec"]["data_offsets"][0],
        shape=(n, d),
    )
    rng = np.random.default_rng(seed)
    with StoreWriter(
        store, d=d, hook="blocks.12.hook_resid_post", model="gemma-2-2b", shard_rows=8192, mode="overwrite"
    ) as writer:
        for s in range(0, rows, 1024):
            m = min(1024, rows - s)
            latents = rng.integers(0, n, size=(m, ACTIVE))
            u = np.asarray(w_dec[latents.ravel()]).reshape(m, ACTIVE, d)
            u /= np.linalg.norm(u, axis=2, keepdims=True)
            c = rng.uniform(1.0, 3.0, size=(m, ACTIVE, 1)).astype(np.float32)
            x = (c * u).sum(1) + np.float32(0.05) * rng.standard_normal((m, d), dtype=np.float32)
            ids = rng.integers(0, 256_000, size=m)
            writer.append(x, token_ids=ids, positions=(np.arange(s, s + m) % 128))
    del w_dec


TIME_FIELDS = {
    "Maximum resident set size (kbytes)": "peak_rss_kb",
    "User time (seconds)": "user_s",
    "System time (seconds)": "sys_s",
    "Elapsed (wall clock) time (h:mm:ss or m:ss)": "wall",
}


def timed(cmd: list[str], env: dict) -> dict:
    """Run `cmd` under /usr/bin/time -v; its peak RSS (GB), CPU and wall seconds, stdout and rc."""
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    got = {}
    for line in proc.stderr.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key in TIME_FIELDS:
            got[TIME_FIELDS[key]] = value
    if "peak_rss_kb" not in got:
        raise SystemExit(f"{cmd[:4]} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    parts = [float(p) for p in got["wall"].split(":")]
    wall = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    return {
        "rc": proc.returncode,
        "peak_rss_gb": int(got["peak_rss_kb"]) * 1024 / 1e9,
        "cpu_s": float(got["user_s"]) + float(got["sys_s"]),
        "wall_s": wall,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


PHASES = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from saegeo.geometry.dictionary import (dictionary_geometry, encoder_decoder_cosines, near_duplicate_pairs,
    nearest_neighbour_summary)
from saegeo.report.flags import dictionary_flags
from saegeo.sae.formats.weight_files import release_pages
from saegeo.sae.model import SAE
out = {}
def phase(name, fn):
    t0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    out[name] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    return value
sae = phase("load", lambda: SAE.load(sys.argv[1]))
w_dec, w_enc = sae.W_dec.detach(), sae.W_enc.detach()
geom = phase("geometry (norms, A_dict, spectrum)", lambda: dictionary_geometry(w_dec, gram_dtype=torch.float32))
phase("duplicate search (exact)", lambda: near_duplicate_pairs(w_dec, 0.99, norms=geom.direction_norms))
nn = phase("nearest neighbours (check's default)", lambda: nearest_neighbour_summary(w_dec, norms=geom.direction_norms))
out["nearest"] = {k: v for k, v in nn.items() if not isinstance(v, list)}
phase("encoder-decoder cosines", lambda: encoder_decoder_cosines(w_enc, w_dec,
    after_block=lambda r, r_end: release_pages(w_enc[r:r_end])))
phase("mean-direction flag", lambda: dictionary_flags(w_dec, sae.b_dec.detach(), norms=geom.direction_norms))
print("RESULT " + json.dumps(out))
"""


def weights_check(folder: Path, out: Path, n: int, a: argparse.Namespace, env: dict, write_s: float) -> dict:
    """`saegeo check` (weights only) of one width: its figures, printed as a row of the table."""
    w_gb = n * a.d * 4 / 1e9
    budget = 1.5 * w_gb + a.allowance_gb
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "saegeo.cli", "check", str(folder), "--out", str(out), "--no-progress"]
    if a.device != "cpu":
        cmd += ["--device", a.device]
    res = timed(cmd, env)
    if res["rc"] != 0:
        raise SystemExit(f"check failed at {n}:\n{res['stdout'][-2000:]}\n{res['stderr'][-3000:]}")
    result = json.loads((out / "check.json").read_text())
    found = sorted((p[0], p[1]) for p in result["duplicate_pairs"])
    nn = result.get("nearest_neighbour_cos") or {}
    row = {
        "d_sae": n,
        "w_dec_gb": w_gb,
        "write_s": write_s,
        "check_wall_s": res["wall_s"],
        "check_cpu_s": res["cpu_s"],
        "peak_rss_gb": res["peak_rss_gb"],
        "budget_gb": budget,
        "n_pairs": result["n_duplicate_pairs"],
        "planted_found": found == sorted(planted_pairs(n, a.n_dup)),
        "nearest": nn,
    }
    err = nn.get("mean_error_bound")
    how = f"{nn.get('method', '?')} m={nn.get('n_queries', '?')}"
    print(
        f"{n:>8} {w_gb:>9.2f} {write_s:>8.1f} {res['wall_s']:>8.1f} {res['cpu_s']:>8.1f} "
        f"{res['peak_rss_gb']:>8.2f} {'ok' if res['peak_rss_gb'] <= budget else 'OVER':>7} {row['n_pairs']:>6} "
        f"{nn.get('mean', float('nan')):>12.4f} {('±' + format(err, '.4f')) if err else '(exact)':>9} {how:>12}",
        flush=True,
    )
    if not row["planted_found"]:
        print(f"  WARNING: planted pairs {planted_pairs(n, a.n_dup)}, found {found}")
    if a.phases:
        ph = subprocess.run(
            [sys.executable, "-c", PHASES, str(folder), str(a.threads)], capture_output=True, text=True, env=env
        )
        line = [ln for ln in ph.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            raise SystemExit(f"phases failed at {n}:\n{ph.stderr[-3000:]}")
        row["phases"] = json.loads(line[0][7:])
        print(
            "  phases (CPU s): " + ", ".join(f"{k} {v['cpu_s']:.1f}" for k, v in row["phases"].items() if "cpu_s" in v),
            flush=True,
        )
    return row


def fit_exponent(widths: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) on log(width): cost ∝ width^slope."""
    x, y = np.log(np.asarray(widths, float)), np.log(np.asarray(values, float))
    return float(np.polyfit(x, y, 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[16384, 65536, 262144])
    ap.add_argument("--d", type=int, default=2304)
    ap.add_argument("--n-dup", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--allowance-gb", type=float, default=1.0, help="the budget's fixed part (interpreter included)")
    ap.add_argument("--acts-rows", type=int, default=0, help="> 0: also `check --acts` on a store of this many rows")
    ap.add_argument("--skip-weights", action="store_true", help="with --acts-rows: only the `check --acts` run")
    ap.add_argument("--phases", action="store_true", help="also time each part of the check in one child per width")
    ap.add_argument(
        "--parts", action="store_true", help="with --acts-rows: print each part's peak memory (memory_parts.py)"
    )
    ap.add_argument("--device", default="cpu", help="--device of the check's pairwise parts (cuda on a GPU machine)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the dictionaries (default: deleted after each width)")
    ap.add_argument("--results", default=None, help="JSON file of rows: earlier runs' widths are kept, joining the fit")
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="saegeo_check_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    need = 2 * max(a.widths) * a.d * 4 / 1e9
    free = shutil.disk_usage(work).free / 1e9
    if free < need + 1:
        raise SystemExit(f"{work}: {free:.1f} GB free, the largest dictionary needs {need:.1f} GB")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.update({k: str(a.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    base = timed([sys.executable, "-c", "import torch, saegeo.cli, saegeo.report.dictionary_check"], env)
    print(
        f"threads {a.threads}; interpreter + torch + saegeo imported: peak RSS {base['peak_rss_gb']:.2f} GB; "
        f"budget per width = 1.5 × W_dec (float32) + {a.allowance_gb:g} GB"
    )
    print(
        f"{'d_sae':>8} {'W_dec GB':>9} {'write s':>8} {'check s':>8} {'CPU s':>8} {'peak GB':>8} {'budget':>7} "
        f"{'pairs':>6} {'NN cos mean':>12} {'(± / method)':>22}"
    )
    rows, reference = [], None
    for n in a.widths:
        folder = work / f"width_{n // 1024}k"
        t0 = time.perf_counter()
        write_saelens(folder, n, a.d, a.n_dup)
        write_s = time.perf_counter() - t0
        out = work / f"out_{n // 1024}k"
        w_gb = n * a.d * 4 / 1e9
        budget = 1.5 * w_gb + a.allowance_gb
        row = {"d_sae": n, "w_dec_gb": w_gb, "write_s": write_s, "budget_gb": budget}
        if not a.skip_weights:
            row.update(weights_check(folder, out, n, a, env, write_s))
        if a.acts_rows > 0:
            store = work / f"acts_{n // 1024}k"
            t0 = time.perf_counter()
            write_acts_store(folder, store, a.acts_rows, a.d)
            store_s = time.perf_counter() - t0
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "saegeo.cli", "check", str(folder), "--acts", str(store), "--no-progress"]
            if a.parts:  # the same command inside the per-part memory poller (benchmarks/memory_parts.py)
                cmd = [sys.executable, str(ROOT / "benchmarks" / "memory_parts.py"), "--", *cmd[3:]]
            acts_res = timed([*cmd, "--out", str(out), "--format", "json"], env)
            sae = {}
            if acts_res["rc"] in (0, 1):
                sae = json.loads((out / "report.json").read_text())["saes"][0]
            row["acts"] = {
                **{k: acts_res[k] for k in ("rc", "peak_rss_gb", "cpu_s", "wall_s")},
                "rows": a.acts_rows,
                "store_s": store_s,
                "mean_l0": sae.get("mean_l0"),
                "fve": sae.get("fve"),
                "within_budget": acts_res["peak_rss_gb"] <= budget,
            }
            if a.parts and "PARTS\n" in acts_res["stderr"]:
                table = acts_res["stderr"].split("PARTS\n", 1)[1].split("\tCommand being timed")[0].rstrip()
                row["acts"]["parts"] = table
                print(
                    "  where the memory goes (peak resident GB while each part ran, its anonymous and file-backed "
                    "pages; kept = resident after − before):\n    " + table.replace("\n", "\n    "),
                    flush=True,
                )
            tail = re.sub(r"\s+", " ", acts_res["stderr"][-300:]) if acts_res["rc"] not in (0, 1) else ""
            print(
                f"  check --acts ({a.acts_rows:,} rows, store written in {store_s:.0f} s): {acts_res['wall_s']:.1f} s, "
                f"CPU {acts_res['cpu_s']:.1f} s, peak RSS {acts_res['peak_rss_gb']:.2f} GB "
                f"({'ok' if row['acts']['within_budget'] else 'OVER'} against {budget:.2f}), L0 {sae.get('mean_l0')}, "
                f"FVE {sae.get('fve')} (rc {acts_res['rc']}) {tail}",
                flush=True,
            )
            if reference is None:  # the activation report alone (no SAE): its fixed part, the same at every width
                shutil.rmtree(out, ignore_errors=True)
                cmd = [sys.executable, "-m", "saegeo.cli", "report", "--acts", str(store), "--no-progress"]
                ref = timed([*cmd, "--out", str(out), "--format", "json"], env)
                reference = {k: ref[k] for k in ("rc", "peak_rss_gb", "cpu_s", "wall_s")}
                print(
                    f"  report --acts without an SAE (the pass's own cost): {ref['wall_s']:.1f} s, CPU "
                    f"{ref['cpu_s']:.1f} s, peak RSS {ref['peak_rss_gb']:.2f} GB (rc {ref['rc']})",
                    flush=True,
                )
            row["acts"]["report_without_sae"] = reference
            shutil.rmtree(store, ignore_errors=True)
        rows.append(row)
        if a.results:  # every width as it finishes (a long run can be read, and extended, run by run)
            old = json.loads(Path(a.results).read_text()) if Path(a.results).exists() else []
            merged = {r["d_sae"]: r for r in old} | {r["d_sae"]: r for r in rows}
            Path(a.results).write_text(json.dumps([merged[k] for k in sorted(merged)], indent=1))
        if not a.keep:
            shutil.rmtree(folder)
    if a.results:
        rows = json.loads(Path(a.results).read_text())
        print(f"(fit over every width in {a.results}: {[r['d_sae'] for r in rows]})")
    if len(rows) >= 2 and all("check_cpu_s" in r for r in rows):
        widths = [r["d_sae"] for r in rows]
        print()
        print(
            f"growth with width (least-squares exponent over {widths}): check CPU seconds ∝ N^"
            f"{fit_exponent(widths, [r['check_cpu_s'] for r in rows]):.2f}, wall ∝ N^"
            f"{fit_exponent(widths, [r['check_wall_s'] for r in rows]):.2f}, peak RSS above the interpreter ∝ N^"
            f"{fit_exponent(widths, [max(r['peak_rss_gb'] - base['peak_rss_gb'], 1e-3) for r in rows]):.2f}"
        )
        if a.phases:
            for name in rows[0]["phases"]:
                if "cpu_s" in rows[0]["phases"][name]:
                    cost = [max(r["phases"][name]["cpu_s"], 1e-3) for r in rows]
                    print(f"  {name}: CPU s {', '.join(f'{c:.1f}' for c in cost)} ∝ N^{fit_exponent(widths, cost):.2f}")
    if any("peak_rss_gb" in r for r in rows):
        within = all(r["peak_rss_gb"] <= r["budget_gb"] for r in rows if "peak_rss_gb" in r)
        print(f"peak RSS within budget at every width: {within}")
    acts_rows = [r for r in rows if "acts" in r]
    if len(acts_rows) >= 2:
        widths = [r["d_sae"] for r in acts_rows]
        print(
            f"check --acts growth with width (least-squares exponent over {widths}): CPU seconds ∝ N^"
            f"{fit_exponent(widths, [r['acts']['cpu_s'] for r in acts_rows]):.2f}, wall ∝ N^"
            f"{fit_exponent(widths, [r['acts']['wall_s'] for r in acts_rows]):.2f}, peak RSS above the interpreter ∝ N^"
            f"{fit_exponent(widths, [max(r['acts']['peak_rss_gb'] - base['peak_rss_gb'], 1e-3) for r in acts_rows]):.2f}"
        )
    if acts_rows:
        for r in acts_rows:
            print(
                f"  {r['d_sae']:>8}: check --acts {r['acts']['wall_s']:.0f} s wall, {r['acts']['cpu_s']:.0f} CPU s, "
                f"peak {r['acts']['peak_rss_gb']:.2f} GB of {r['budget_gb']:.2f}"
            )
        within = all(r["acts"]["within_budget"] for r in acts_rows)
        print(f"check --acts peak RSS within budget at every width: {within}")
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()

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
  * --acts-rows R (> 0) also runs `check --acts` on R random rows (an .npy file) at each width.
  * --phases also times each part of the check (load, geometry, duplicates, nearest neighbours, encoder-decoder,
    flags) in one child per width, on the same mapped weights, to show which part grows how.

    python benchmarks/check_bench.py [--widths 16384 65536 262144] [--d 2304] [--threads 2] [--phases]
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
    W_enc = W_decᵀ + 0.01·noise (a tied-then-trained encoder), b_enc 0, b_dec seeded, threshold 0.05."""
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
            rng.standard_normal(d).astype(np.float32),
            np.zeros(n, np.float32),
            np.full(n, 0.05, np.float32),
        ]
        for name, value in zip(("b_dec", "b_enc", "threshold"), tail):
            os.pwrite(fd, value.tobytes(), start + header[name]["data_offsets"][0])
        os.fsync(fd)  # on disk, as a downloaded file is: dirty pages could not be handed back by the check


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
from saegeo.sae.formats.base import release_pages
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
    ap.add_argument("--acts-rows", type=int, default=0, help="> 0: also `check --acts` on this many random rows")
    ap.add_argument("--phases", action="store_true", help="also time each part of the check in one child per width")
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
    base = timed([sys.executable, "-c", "import torch, saegeo.cli, saegeo.report.check"], env)
    print(
        f"threads {a.threads}; interpreter + torch + saegeo imported: peak RSS {base['peak_rss_gb']:.2f} GB; "
        f"budget per width = 1.5 × W_dec (float32) + {a.allowance_gb:g} GB"
    )
    print(
        f"{'d_sae':>8} {'W_dec GB':>9} {'write s':>8} {'check s':>8} {'CPU s':>8} {'peak GB':>8} {'budget':>7} "
        f"{'pairs':>6} {'NN cos mean':>12} {'(± / method)':>22}"
    )
    rows = []
    for n in a.widths:
        folder = work / f"width_{n // 1024}k"
        t0 = time.perf_counter()
        write_saelens(folder, n, a.d, a.n_dup)
        write_s = time.perf_counter() - t0
        out = work / f"out_{n // 1024}k"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "saegeo.cli", "check", str(folder), "--out", str(out), "--no-progress"]
        if a.device != "cpu":
            cmd += ["--device", a.device]
        res = timed(cmd, env)
        if res["rc"] != 0:
            raise SystemExit(f"check failed at {n}:\n{res['stdout'][-2000:]}\n{res['stderr'][-3000:]}")
        result = json.loads((out / "check.json").read_text())
        found = sorted((p[0], p[1]) for p in result["duplicate_pairs"])
        w_gb = n * a.d * 4 / 1e9
        budget = 1.5 * w_gb + a.allowance_gb
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
                "  phases (CPU s): "
                + ", ".join(f"{k} {v['cpu_s']:.1f}" for k, v in row["phases"].items() if "cpu_s" in v),
                flush=True,
            )
        if a.acts_rows > 0:
            acts = work / "acts.npy"
            if not acts.exists():
                x = np.random.default_rng(1).standard_normal((a.acts_rows, a.d), dtype=np.float32)
                np.save(acts, x)
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "saegeo.cli", "check", str(folder), "--acts", str(acts), "--no-progress"]
            acts_res = timed([*cmd, "--out", str(out)], env)
            row["acts"] = {k: acts_res[k] for k in ("rc", "peak_rss_gb", "cpu_s", "wall_s")}
            tail = re.sub(r"\s+", " ", acts_res["stderr"][-300:]) if acts_res["rc"] not in (0, 1) else ""
            print(
                f"  check --acts ({a.acts_rows:,} rows): {acts_res['wall_s']:.1f} s, CPU {acts_res['cpu_s']:.1f} s, "
                f"peak RSS {acts_res['peak_rss_gb']:.2f} GB (rc {acts_res['rc']}) {tail}",
                flush=True,
            )
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
    if len(rows) >= 2:
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
    print(f"peak RSS within budget at every width: {all(r['peak_rss_gb'] <= r['budget_gb'] for r in rows)}")
    print("RESULT " + json.dumps(rows))


if __name__ == "__main__":
    main()

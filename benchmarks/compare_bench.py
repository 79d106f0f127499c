"""`saegeo compare`'s matching at width: the dense exact Hungarian (scipy's linear_sum_assignment on the float64
N × N cosine matrix, the reference every seed-consistency paper runs) beside saegeo's candidate-graph matching
(`match_latents` above `exact_max_entries`), on two dictionaries with a planted shared half.

Each (method, N) runs in its own child process: wall and CPU seconds of the matching and the child's peak RSS,
the MCC (with the candidate method's upper bound) and whether the planted shared pairs at cosine ≥ 0.7 are
found exactly. Dictionaries: A ~ N(0, I_d) rows; B = A permuted, half its rows replaced by new random rows, the
other half perturbed by 0.3·N(0, I_d) (matched cosine ≈ 0.96, well above 0.7).

    python benchmarks/compare_bench.py [--sizes 4096 16384] [--d 64] [--methods dense candidates] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, torch
from saegeo.geometry.consistency import match_latents, match_similarity, cosine_matrix
n, d, method, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
a = torch.randn(n, d, generator=g)
perm = torch.randperm(n, generator=g)
b = a[perm].clone()
new = torch.rand(n, generator=g) >= 0.5
b[new] = torch.randn(int(new.sum()), d, generator=g)
b[~new] += 0.3 * torch.randn(int((~new).sum()), d, generator=g)
truth = {(int(perm[j]), j) for j in range(n) if not new[j]}
t, c = time.perf_counter(), time.process_time()
m = match_similarity(cosine_matrix(a, b)) if method == "dense" else match_latents(a, b, exact_max_entries=0)
wall, cpu = time.perf_counter() - t, time.process_time() - c
sel = m.shared(0.7)
found = set(zip(m.index_a[sel].tolist(), m.index_b[sel].tolist()))
print(json.dumps({"n": n, "d": d, "method": method, "wall_s": wall, "cpu_s": cpu,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "mcc": m.mcc, "mcc_upper_bound": m.mcc_upper_bound, "planted_found_exactly": found == truth,
                  "n_shared": len(found), "n_planted": len(truth)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--methods", nargs="+", default=["dense", "candidates"], choices=["dense", "candidates"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print("method      N        wall s   CPU s   peak RSS MiB   MCC      upper    planted found")
    for n in args.sizes:
        for method in args.methods:
            run = subprocess.run(
                [sys.executable, "-c", CHILD, str(n), str(args.d), method, str(args.threads)],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                print(f"{method:<10} {n:>7,}  failed: {run.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(
                f"{method:<10} {n:>7,}  {r['wall_s']:8.1f}  {r['cpu_s']:6.1f}  {r['peak_rss_mib']:12.0f}   "
                f"{r['mcc']:.4f}   {r['mcc_upper_bound']:.4f}   {r['planted_found_exactly']} "
                f"({r['n_shared']:,}/{r['n_planted']:,})"
            )


if __name__ == "__main__":
    main()

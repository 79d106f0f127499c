"""Matryoshka BatchTopK against BatchTopK on synthetic ground truth (issue 40 item 6): the same data, k, budget and
seed; recovery of the true features printed side by side.

Data: `saegeo synth`'s generator (saegeo.synthetic.SuperpositionGenerator), N true unit features in d dimensions,
in three regimes: uniform rates; Zipf rates (frequent and rare features, where the nesting should put the frequent
ones first); co-firing groups (pairs of features that always fire together). Scores (saegeo.synthetic.recovery):
MCC = the mean cosine of the one-to-one matching of true features to decoder rows (Hungarian; SAEBench's synthetic
MCC), and the fraction of true features with a decoder row at cos ≥ 0.9. Held-out FVE and L0 (at the inference
threshold) beside them, and each run's CPU and wall seconds.

    PYTHONPATH=. python benchmarks/matryoshka_recovery.py [--seeds 7 8] [--steps 200]
"""

from __future__ import annotations

import argparse
import time

import torch

from saegeo.sae.train import TrainConfig, train_sae
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig
from saegeo.synthetic.recovery import recovery


def hierarchical(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Parent/child features (not in `saegeo synth`): 64 parents, each with 3 children, 256 random unit directions in
    d 64. A parent fires with probability 1/16; a child only with its parent, each with probability 0.3 then (so a
    child's firing implies its parent's, the absorption case). Magnitudes 0.5 + Exp(1). Returns (rows, dictionary)."""
    g = torch.Generator().manual_seed(seed)
    dictionary = torch.randn(256, 64, generator=g)
    dictionary /= dictionary.norm(dim=1, keepdim=True)
    parents = torch.rand(n, 64, generator=g) < 1 / 16
    children = (torch.rand(n, 64, 3, generator=g) < 0.3) & parents[:, :, None]
    fires = torch.cat([parents, children.reshape(n, 192)], dim=1).float()
    magnitudes = 0.5 + torch.empty(n, 256).exponential_(generator=g)
    return (fires * magnitudes) @ dictionary, dictionary


REGIMES = {
    "uniform": {},
    "zipf": {"rate_law": "zipf", "zipf_exponent": 1.0},
    "co-firing pairs": {"n_groups": 64, "group_size": 2},
    "parent/child": None,  # `hierarchical`
}
ARCHS = {
    "batchtopk": ("batchtopk", {}),
    "matryoshka (dictionary_learning loss)": ("matryoshka", {"loss": "dictionary_learning"}),
    "matryoshka (saelens loss)": ("matryoshka", {"loss": "saelens"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--lrs", type=float, nargs="+", default=[4e-3, 1e-2])
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| regime | architecture | lr | seed | MCC | recovered@0.9 | held-out FVE | L0 | CPU s | wall s | latents' max cos by group |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for regime in args.regimes:
        extra = REGIMES[regime]
        if extra is None:
            x, truth = hierarchical(20_000)
        else:
            gen = SuperpositionGenerator(SyntheticConfig(d=64, n_features=256, rate=args.k / 256, seed=1, **extra))
            (x, _), truth = gen.sample(20_000), gen.truth.dictionary
        for label, (arch, options) in ARCHS.items():
            for lr, seed in ((lr, seed) for lr in args.lrs for seed in args.seeds):
                cfg = TrainConfig(
                    arch=arch,
                    arch_options={arch: {"k": args.k, **options}},
                    d_sae=512,
                    lr=lr,
                    batch_tokens=512,
                    total_tokens=args.steps * 512,
                    dead_window_tokens=10_240,
                    heldout_fraction=0.05,
                    seed=seed,
                    progress=False,
                )
                cpu, wall = time.process_time(), time.perf_counter()
                res = train_sae(cfg, x)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                w_dec = res.sae.W_dec.detach()
                rep = recovery(truth, w_dec, threshold=0.9)
                groups = "/".join(
                    f"{recovery(truth, w_dec[lo:hi], match=False).mean_max_cos_learned:.2f}"
                    for lo, hi in zip((0, 32, 64, 128, 256), (32, 64, 128, 256, 512))
                )
                print(
                    f"| {regime} | {label} | {lr:g} | {seed} | {rep.mean_matched_cos:.3f} | {rep.frac_recovered:.3f} | "
                    f"{res.heldout['fve']:.3f} | {res.heldout['l0']:.2f} | {cpu:.1f} | {wall:.1f} | {groups} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""How well the folded-whitening check (`whitening_alignment`: median cos(e_i, w_i) against median cos(e_i, G⁻¹w_i))
tells an SAE trained on whitened rows and folded from one trained on the raw rows, at several widths, with the sample
the check uses (max(1,024, 2d) evenly spaced latents) beside the 4,096 it used before and every latent.

    python benchmarks/whitening_discrimination.py STORE [--widths 1536 4096 16384] [--tokens 65536] [--rows 60000]
                                                  [--saes DIR ...]

Per width, two TopK SAEs (k 16, saegeo's trainer, same seed and batches) on the store's first --rows rows: one on
the raw rows, one on the rows whitened as SAELens' covariance_whitening whitens (μ and M = E diag(λ + 1e-3)^{-1/2}
from the first 20,480 rows; z = (x − μ)M), its whitening then folded as SAELens' fold_activation_whitening folds it
(W_enc ← M W_enc, W_dec ← W_dec M⁻¹, b_dec ← b_dec M⁻¹ + μ). --saes adds SAEs read from disk (e.g. the SAELens-trained
fixtures). Prints one Markdown table: per SAE and sample size, the two medians, their gap and whether `check`'s rule
(gap > 0.2 and the whitened median ≥ 0.5) calls it folded; then the wall and CPU seconds."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from saegeo.activations.store import ActivationStore
from saegeo.geometry.dictionary import whitening_alignment
from saegeo.report.flags.whitening_misuse import FoldedOptions
from saegeo.sae.model import SAE
from saegeo.sae.options import TrainConfig
from saegeo.sae.train import train_sae

RULE = FoldedOptions()  # check's default thresholds for the folded kind of whitening_misuse
WHITENING_ROWS, EPS = 20 * 1024, 1e-3  # SAELens: n_batches_for_norm_estimate 20 batches of 1,024; eigenvalue eps


def store_rows(path: str, n: int) -> torch.Tensor:
    store = ActivationStore(path)
    parts, have = [], 0
    for i in range(len(store.shards)):
        parts.append(store.read_shard(i))
        have += parts[-1].shape[0]
        if have >= n:
            break
    return torch.cat(parts)[:n].float()


def whitening(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """μ, M, M⁻¹ as SAELens' estimate_whitening computes them (float64)."""
    sample = x[:WHITENING_ROWS].double()
    mu = sample.mean(0)
    eigenvalues, vectors = torch.linalg.eigh(torch.cov((sample - mu).T))
    eigenvalues = eigenvalues.clamp(min=0) + EPS
    return mu, vectors * eigenvalues.rsqrt(), eigenvalues.sqrt().unsqueeze(1) * vectors.T


def trained(x: torch.Tensor, width: int, tokens: int) -> SAE:
    cfg = TrainConfig(
        arch="topk",
        arch_options={"topk": {"k": 16}},
        d_sae=width,
        total_tokens=tokens,
        batch_tokens=1024,
        heldout_fraction=0.0,
        seed=1,
        progress=False,
    )
    return train_sae(cfg, x).sae


def folded(x: torch.Tensor, width: int, tokens: int) -> SAE:
    mu, m, m_inv = whitening(x)
    sae = trained(((x.double() - mu) @ m).float(), width, tokens)
    with torch.no_grad():
        sae.W_enc.copy_((m @ sae.W_enc.double()).float())
        sae.W_dec.copy_((sae.W_dec.double() @ m_inv).float())
        sae.b_dec.copy_((sae.b_dec.double() @ m_inv + mu).float())
    return sae


def rows_for(name: str, sae: SAE) -> list[str]:
    n, d = sae.W_dec.shape
    out = []
    for label, m in (("max(1,024, 2d)", 1024), ("4,096", 4096), ("all", n)):
        a = whitening_alignment(sae.W_enc.detach(), sae.W_dec.detach(), max_latents=m)
        if a is None:
            out.append(f"| {name} | {n:,} × {d} | {label} | – | – | – | no (fewer than d latents) |")
            continue
        gap = a["median_cos_whitened"] - a["median_cos"]
        called = gap > RULE.folded_whitening_gain and a["median_cos_whitened"] >= RULE.folded_whitening_min_cos
        out.append(
            f"| {name} | {n:,} × {d} | {label} ({a['latents']:,}) | {a['median_cos']:.3f} | "
            f"{a['median_cos_whitened']:.3f} | {gap:+.3f} | {'folded' if called else 'no'} |"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("--widths", type=int, nargs="*", default=[1536, 4096, 16384])
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--rows", type=int, default=60000)
    p.add_argument("--saes", nargs="*", default=[])
    args = p.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    x = store_rows(args.store, args.rows)
    lines = [
        "| SAE | d_sae × d | latents sampled | median cos(e, w) | median cos(e, G⁻¹w) | gap | check's call |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in args.saes:
        lines += rows_for(Path(path).name, SAE.load(path))
    for width in args.widths:
        lines += rows_for(f"raw-trained, {args.tokens:,} tokens", trained(x, width, args.tokens))
        lines += rows_for(f"whitened-trained + folded, {args.tokens:,} tokens", folded(x, width, args.tokens))
        print("\n".join(lines), flush=True)  # a table so far, in case the run is stopped
        print(f"\n{time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU so far\n", flush=True)
    print(f"done: {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU")


if __name__ == "__main__":
    main()

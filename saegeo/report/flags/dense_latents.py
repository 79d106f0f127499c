"""dense_latents: latents that fire on most tokens. ``dense_frequency`` is the one home of "dense": the report's
n_dense, the per-latent table's dense column and its figure read it too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import DENSE, Flag, flag, rounded


@dataclass
class Options:
    dense_frequency: float = option(0.5, "a latent firing on more than this fraction of tokens is dense", low=0, high=1)
    dense_max_fraction: float = option(0.0, "dense latents above this fraction of latents: a warning", low=0)


@flag(
    DENSE,
    stage="sae",
    reads=("firing_frequency", "cos_decoder_mean", "d_sae", "name"),
    options=Options,
    bands={"warning": "any dense latent"},
    when="any latent fires on > 50 % of tokens",
    order=50,
)
def dense_latents(q: dict[str, Any], t: Any) -> Flag | None:
    import torch

    sae = q["sae"]
    freq = torch.tensor(sae["firing_frequency"], dtype=torch.float64)
    cos = torch.tensor(sae["cos_decoder_mean"], dtype=torch.float64)
    d_sae = int(sae["d_sae"])
    dense = (freq > t.dense_frequency).nonzero().flatten()
    if not dense.numel() / d_sae > t.dense_max_fraction:
        return None
    order = dense[freq[dense].argsort(descending=True)].tolist()
    return Flag(
        DENSE,
        "warning",
        {
            "n_dense": len(order),
            "dense_fraction": rounded(len(order) / d_sae),
            "dense_frequency": t.dense_frequency,
            "max_firing_frequency": rounded(freq.max()),
            "max_abs_cos_mean_of_dense": rounded(cos[dense].abs().max()),
        },
        "Latents that fire on most tokens are usually the mean or a positional direction, not features: "
        "check their cos with the mean and centre the inputs.",
        summary=f"{len(order)} latent(s) fire on > {100 * t.dense_frequency:.0f}% of tokens",
        latents=order[: t.max_latents],
        subject=str(sae.get("name") or "sae"),
    )

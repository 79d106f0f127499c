"""BatchTopK SAE (Bussmann et al. 2024; dictionary_learning, SAELens).

Training: codes = the k·n largest entries of relu(pre) over the whole batch (k per row on average); loss as
TopK (FVU + AuxK). The inference threshold θ tracks the smallest positive code kept (`update_threshold`).
Inference: one global scalar threshold, codes = relu(pre)·[relu(pre) > θ] (dictionary_learning's default).
Saved as SAELens saves its own: architecture "jumprelu" with θ broadcast to every latent, the saegeo block
keeping trained_as = "batchtopk" and training_k.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.config import option
from saegeo.sae.architectures.base import Architecture, ExtraTensor, TrainOutput, register_architecture
from saegeo.sae.architectures.kernels import (
    AuxKOptions,
    GatheredLinear,
    aux_options,
    auxk_loss,
    gathered_pre,
    row_sorted_entries,
)


def batch_topk_entries(
    values: Float[Tensor, "n d_sae"], count: int, per_row: int | None = None
) -> Int[Tensor, " count"]:
    """Flat indices r·d_sae + c of the `count` largest entries of `values` (BatchTopK's selection), exactly as
    a topk over the flattened matrix, but from each row's top `per_row` (default 2·count/n) candidates: the
    global set lies inside them unless a row's smallest candidate exceeds the count-th largest candidate τ;
    such rows join with all their entries (τ only rises, so the rest stay complete). Faster on CPU than the flat
    topk (benchmarks/README.md#numbers-behind-code-comments)."""
    n, d_sae = values.shape
    per_row = min(d_sae, per_row or max(1, 2 * -(-count // n)))
    if per_row * n <= count or per_row == d_sae:
        return values.view(-1).topk(count, sorted=False).indices
    cand_values, cand_cols = values.topk(per_row, dim=1, sorted=False)
    tau = cand_values.view(-1).topk(count, sorted=False).values.min()
    overflow = cand_values.min(dim=1).values > tau  # rows that may hold more than their candidates
    truncated, keep = overflow.nonzero()[:, 0], ~overflow
    cand_flat = torch.arange(n, device=values.device)[:, None] * d_sae + cand_cols
    whole_rows = truncated[:, None] * d_sae + torch.arange(d_sae, device=values.device)
    flat = torch.cat([cand_flat[keep].view(-1), whole_rows.view(-1)])
    pool = torch.cat([cand_values[keep].view(-1), values[truncated].view(-1)])
    return flat[pool.topk(count, sorted=False).indices]


class BatchTopKCodes(NamedTuple):
    """One training batch's BatchTopK codes as flat entries sorted by row (then latent)."""

    xc: Float[Tensor, "n d_in"]  # the encoder's input (x − b_dec)
    pre: Float[Tensor, "n d_sae"]  # relu(pre-activations), no gradient (AuxK's candidates)
    rows: Int[Tensor, " m"]
    cols: Int[Tensor, " m"]
    offsets: Int[Tensor, " n"]  # each row's first entry (embedding_bag's bags)
    values: Float[Tensor, " m"]  # the codes, with their gradient to W_enc, b_enc and xc
    min_kept: Tensor  # the smallest positive code kept (the inference threshold's update)
    fire_count: Float[Tensor, " d_sae"]  # rows each latent fired on
    l0_sum: Tensor  # codes > 0 over the batch


def batch_topk_codes(sae, x: Float[Tensor, "n d_in"]) -> BatchTopKCodes:
    """The k·n largest entries of relu(pre) over the batch: dense pre-activations without autograd, then only the
    entries kept carry a gradient (GatheredLinear), so the backward never forms an (n, d_sae) matrix."""
    xc = sae.centre(x)
    n, d_sae = x.shape[0], sae.cfg.d_sae
    with torch.no_grad():
        pre = torch.addmm(sae.b_enc, xc, sae.W_enc)
        entries = batch_topk_entries(pre.relu_(), min(int(sae.cfg.k) * n, pre.numel()))
    rows, cols, offsets = row_sorted_entries(entries, n, d_sae)
    values = F.relu(GatheredLinear.apply(xc, sae.W_enc, sae.b_enc, cols, pre[rows, cols], rows, offsets))
    with torch.no_grad():
        active = values > 0
        min_kept = values[active].min() if bool(active.any()) else values.new_zeros(())
        fire_count = torch.zeros(d_sae, device=x.device, dtype=torch.float32).index_add_(0, cols, active.float())
    return BatchTopKCodes(xc, pre, rows, cols, offsets, values, min_kept, fire_count, active.sum())


@torch.no_grad()
def update_threshold(sae, min_kept: Tensor, step: int, rate: float) -> None:
    """θ ← θ + max(rate, 1/(step + 1))·(m − θ), m = the smallest positive code BatchTopK kept in this batch: the
    running mean of m for the first 1/rate steps, then an EMA (dictionary_learning and SAELens track the same m).
    At inference codes = relu(pre)·[relu(pre) > θ], which keeps about k per row."""
    sae.threshold.add_((min_kept.to(sae.threshold.dtype) - sae.threshold) * max(rate, 1.0 / (step + 1)))


@dataclass
class BatchTopKOptions(AuxKOptions):
    """k, AuxK and the inference threshold's estimate."""

    k: int = option(32, "active latents per token, on average over the batch", low=1)
    threshold_ema: float = option(
        0.05, "inference threshold = running mean, then EMA at this rate, of the smallest code kept", above=0, high=1
    )


class BatchTopK(Architecture):
    """k·n codes per batch in training; one scalar threshold at inference; the loss term "auxk_loss" is AuxK."""

    Options = BatchTopKOptions
    legacy_options = {
        "k": "k",
        "aux_k": "aux_k",
        "aux_coefficient": "aux_coefficient",
        "threshold_ema": "threshold_ema",
    }
    # SAELens saves its own BatchTopK as a jumprelu (saved_form): no SAELens name of its own
    saved_names = {"saelens": (), "dictionary_learning": ("BatchTopKSAE",)}
    extra_tensors = {"threshold": ExtraTensor(lambda cfg: (1,), in_file=True)}  # the global θ, estimated in training
    uses_k = True
    # lr 4e-3, not the grid's best FVE at 8e-3: that run left most latents dead, 4e-3 few, at a slightly lower FVE
    # (benchmarks/README.md#training-train_benchpy)
    train_defaults = {"lr": 4e-3, "grad_clip_norm": 0.0, "decoder_norm": "unit"}

    latent_wise = True  # at inference: the threshold, the same for every latent

    def encode_latents(self, sae, pre, latents):
        # dictionary_learning BatchTopK at inference: one global scalar threshold, not per-row TopK.
        post = F.relu(pre)
        return post * (post > sae.threshold.reshape(-1)[0])

    def forward_train(
        self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, aux_k: int = 0, aux_coefficient: float = 0.0, **_: Any
    ) -> TrainOutput:
        codes = batch_topk_codes(sae, x)
        err = x - sae.decode_sparse(codes.values, codes.cols, offsets=codes.offsets)
        sse = err.pow(2).sum()
        pre = codes.pre
        aux = auxk_loss(
            sae, err, pre, dead_mask, aux_k, aux_coefficient, centred_ss_fn, gathered_pre(codes.xc, sae, pre)
        )
        loss = sse / centred_ss + aux_coefficient * aux
        terms, state = {"auxk_loss": aux.detach()}, {"min_kept": codes.min_kept}
        fire_count = codes.fire_count
        return TrainOutput(loss, sse.detach(), centred_ss, codes.l0_sum, fire_count > 0, fire_count, terms, state)

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        return aux_options(self.options(tcfg), d_in)

    def after_step(self, sae, out, step, tcfg, mean_across_ranks) -> None:
        update_threshold(sae, mean_across_ranks(out.state["min_kept"]), step, self.options(tcfg).threshold_ema)

    def option_summary(self, tcfg) -> str:
        return f"k={self.options(tcfg).k}"

    def saved_form(self, cfg):
        # relu(pre)·[relu(pre) > θ] = relu(pre)·[pre > θ_i] with θ_i = θ: a JumpReLU with θ broadcast
        return dataclasses.replace(cfg, activation="jumprelu", k=None), {"trained_as": self.name, "training_k": cfg.k}


register_architecture("batchtopk", BatchTopK)

"""Sparse training kernels shared by the architectures: gradients through a sparse set of encoder entries,
row-sorted entry lists for bagged decodes, the threshold window, and AuxK."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.config import check, option


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype torch.autocast runs matmuls in on this device type now (the trainer's --dtype bf16), or None
    when autocast is off. Hand-written backwards use it to run their GEMMs in the same dtype as the forward."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def rectangle_window(pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
    """Rectangle kernel K((pre − θ)/ε) = 1[|pre − θ| < ε/2], in the dtype of pre."""
    return ((pre - threshold).abs() < bandwidth / 2).to(pre.dtype)


def sum_to(grad: Tensor, like: Tensor) -> Tensor:
    """grad summed over the leading dimensions that `like` was broadcast along ((n, d_sae) → (d_sae,)), or
    as it is when `like` has grad's shape (one θ per entry of a sparse set, gathered from the θ vector)."""
    return grad if grad.shape == like.shape else grad.sum(dim=0)


class GatheredLinear(torch.autograd.Function):
    """v_j = x[r_j] · W_enc[:, c_j] + b_enc[c_j] over a sparse set of entries (r_j, c_j), with a sparse backward.

    The entries are either k per row (`cols` (n, k), rows implied) or a flat list sorted by row (`cols` (m,),
    `rows` (m,) and the bag `offsets` (n,) of each row's first entry: BatchTopK, JumpReLU). The forward takes
    the already-computed values (`gathered`, from the no-grad dense pre-activations); the backward scatters
    the upstream gradients g: ∂W_enc[:, i] = Σ_{j: c_j = i} g_j·x[r_j] (a sparse (d_sae × n) @ (n × d_in)
    product), ∂b_enc = scatter-add of g, ∂x[r] = Σ_{j: r_j = r} g_j·W_enc[:, c_j] (an embedding_bag over
    W_encᵀ). Cost O(m·d_in) instead of O(n·d_sae·d_in). Same idea as sparsify's fused encoder.
    """

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, cols, gathered, rows=None, offsets=None):
        ctx.save_for_backward(x, W_enc, cols, rows, offsets)
        return gathered.clone()

    @staticmethod
    def backward(ctx, grad):
        x, W_enc, cols, rows, offsets = ctx.saved_tensors
        n, d_sae = x.shape[0], W_enc.shape[1]
        grad_x = grad_w = grad_b = None
        flat_idx, flat_g = cols.reshape(-1), grad.reshape(-1).to(W_enc.dtype)
        if ctx.needs_input_grad[0]:
            grad_x = F.embedding_bag(
                cols, W_enc.t().contiguous(), offsets, per_sample_weights=grad.to(W_enc.dtype), mode="sum"
            )
        if ctx.needs_input_grad[1]:
            if rows is None:
                rows = torch.arange(n, device=x.device).repeat_interleave(cols.shape[1])
            g_sparse = torch.sparse_coo_tensor(
                torch.stack([flat_idx, rows]), flat_g, (d_sae, n), check_invariants=False
            )
            grad_w = torch.sparse.mm(g_sparse, x.to(W_enc.dtype)).t().contiguous()
        if ctx.needs_input_grad[2]:
            grad_b = torch.zeros(d_sae, device=x.device, dtype=W_enc.dtype).index_add_(0, flat_idx, flat_g)
        return grad_x, grad_w, grad_b, None, None, None, None


def gathered_pre(xc: Tensor, sae, pre: Tensor, scale: Tensor | None = None) -> Callable[[Tensor], Tensor]:
    """idx (n, j) ↦ the entries pre[r, idx[r]] with their gradient to W_enc, b_enc and xc (`GatheredLinear`).
    ``scale`` (d_sae,): ``pre`` holds pre_i·scale_i (TopK choosing on pre·‖w_i‖); the entries returned are pre_i."""

    def gathered(idx: Tensor) -> Tensor:
        chosen = pre.gather(1, idx) if scale is None else pre.gather(1, idx) / scale[idx]
        return GatheredLinear.apply(xc, sae.W_enc, sae.b_enc, idx, chosen)

    return gathered


def row_sorted_entries(flat_index: Int[Tensor, " m"], n: int, d_sae: int) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, cols, offsets) of entries given by their row-major flat indices r·d_sae + c, sorted by row
    (then column); offsets[r] = the first entry of row r (embedding_bag's bags, empty rows allowed)."""
    flat_index = flat_index.sort().values
    rows, cols = flat_index // d_sae, flat_index % d_sae
    offsets = torch.zeros(n, dtype=torch.long, device=flat_index.device)
    offsets[1:] = torch.bincount(rows, minlength=n).cumsum(0)[:-1]
    return rows, cols, offsets


def auxk_loss(
    sae,
    err: Float[Tensor, "n d_in"],
    pre: Float[Tensor, "n d_sae"],
    dead_mask: Tensor | None,
    aux_k: int,
    aux_coefficient: float,
    centred_ss_fn: Callable[[Tensor], Tensor],
    gathered: Callable[[Tensor], Tensor],
    *,
    signed: bool = False,
) -> Tensor:
    """AuxK: ‖e − ê‖²/‖e − ē‖² · min(n_dead/aux_k, 1), ê from the top-aux_k dead latents of each row (pre is
    detached; `gathered(idx)` gives those entries with their gradient). Zero without dead latents.
    ``signed`` (AbsTopK): ``pre`` holds the keys |pre| the dead latents are chosen on, and their codes keep their sign
    (SAELens' calculate_abstopk_aux_acts) instead of relu(pre).
    Unlike sparsify, which divides by the batch's Σ‖x − x̄‖² and adds b_dec to ê, the residual is normalised
    by its own centred sum of squares (Gao et al. 2024)."""
    use_aux = dead_mask is not None and aux_k > 0 and aux_coefficient > 0
    if use_aux and dead_mask.device.type == "cpu":
        use_aux = bool(dead_mask.any())  # free on CPU; on GPU we avoid the sync and compute a zero
    if not use_aux:
        return err.new_zeros(())
    n_dead = dead_mask.sum()  # stays on device: no host sync per step
    k_aux = min(aux_k, sae.cfg.d_sae)
    with torch.no_grad():
        if dead_mask.device.type == "cpu":  # the dead columns only (the mask is on the host: no sync)
            cols = dead_mask.nonzero().squeeze(1)
            aux_idx = cols[pre.index_select(1, cols).topk(min(k_aux, cols.numel()), dim=-1, sorted=False).indices]
        else:
            dead_pre = torch.where(dead_mask, pre, torch.full_like(pre, -torch.inf))
            aux_idx = dead_pre.topk(k_aux, dim=-1, sorted=False).indices
    chosen = gathered(aux_idx)
    # rows with < k_aux dead latents: mask the rest
    aux_vals = (chosen if signed else F.relu(chosen)) * dead_mask[aux_idx]
    e = err.detach()
    # the bag's weights in the decoder's dtype (under autocast the gathered pre-activations are bfloat16)
    e_hat = F.embedding_bag(aux_idx, sae.W_dec, per_sample_weights=aux_vals.to(sae.W_dec.dtype), mode="sum")
    aux = (e - e_hat).pow(2).sum() / centred_ss_fn(e)
    aux = aux * (n_dead.float() / k_aux).clamp(max=1.0)
    return torch.nan_to_num(aux, nan=0.0)


@dataclass
class AuxKOptions:
    """The AuxK options of the architectures that train with it (topk, batchtopk: each Options extends this)."""

    aux_k: int | None = option(None, "AuxK latents; default d_in // 2", low=1)
    aux_coefficient: float = option(1 / 32, "weight of the AuxK loss", low=0)

    def __post_init__(self) -> None:
        check(self)


def aux_options(opts: AuxKOptions, d_in: int) -> dict:
    """AuxK's step options (topk, batchtopk): aux_k (default d_in // 2) and its coefficient."""
    return {"aux_k": opts.aux_k if opts.aux_k is not None else d_in // 2, "aux_coefficient": opts.aux_coefficient}

"""JumpReLU SAE (Rajamanoharan et al. 2024; SAELens, Gemma Scope): codes = relu(pre)·[pre > θ_i].

Training: codes = pre·H(pre − θ) (`JumpReLUFn`); loss = FVU + l0_coefficient·S, where the sparsity loss S is one
of four forms (option `sparsity_loss`, named after their source; L0_r = Σ_i H(pre_ri − θ_i) through `StepFn`,
straight-through for θ with a rectangle kernel of width `bandwidth`; L0 = mean_r L0_r; t = l0_target):

    dictionary_learning  S = (L0/t − 1)²                          dictionary_learning's JumpReluTrainer (default)
    step                 S = mean_r L0_r                          the JumpReLU paper; SAELens "step"
    quadratic            S = mean_r (2/t)·(L0_r − t)²             Gemma Scope 2; SAELens "quadratic"
    tanh                 S = mean_r Σ_i tanh(c·codes_ri·‖W_dec[i]‖) Anthropic; SAELens "tanh" (c = tanh_scale)

FVU is SAELens' mean_r ‖x − x̂‖² divided by the batch's mean_r ‖x − x̄‖², so an l0_coefficient from SAELens is
divided by that number here. The thresholds train at
lr · threshold_lr_scale, start where each latent fires on an l0/d_sae share of the rows, and stay ≥ 0.
Only the entries that are active or inside θ's window carry a gradient: they go through
`kernels.GatheredLinear` and a bagged decode, unless more than an eighth of the batch does (`dense_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from saegeo.config import check, option
from saegeo.sae.architectures.base import Architecture, ExtraTensor, TrainOutput, register_architecture
from saegeo.sae.architectures.kernels import GatheredLinear, rectangle_window, row_sorted_entries, sum_to


class JumpReLUFn(torch.autograd.Function):
    """codes = pre·H(pre − θ) with a straight-through estimator for θ (Rajamanoharan et al. 2024).

    ∂codes/∂pre = H(pre − θ) (exact away from the jump); ∂codes/∂θ_i := −(θ_i/ε)·K((pre − θ_i)/ε) with the
    rectangle kernel K(u) = 1[|u| < ½] and bandwidth ε: the jump of height θ_i spread over a window of width ε.
    """

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_pre = grad * (pre > threshold) if ctx.needs_input_grad[0] else None
        grad_thr = None
        if ctx.needs_input_grad[1]:
            grad_thr = sum_to(-(threshold / eps) * grad * rectangle_window(pre, threshold, eps), threshold)
        return grad_pre, grad_thr, None


class StepFn(torch.autograd.Function):
    """H(pre − θ) with ∂/∂pre := 0 and ∂/∂θ_i := −(1/ε)·K((pre − θ_i)/ε): the L0 that trains the threshold.

    Summed over rows this is exactly the central finite difference of Σ_r H(pre_r − θ_i) with step ε:
    −#{r: |pre_r − θ_i| < ε/2}/ε.
    """

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_thr = None
        if ctx.needs_input_grad[1]:
            grad_thr = sum_to(-(grad * rectangle_window(pre, threshold, eps)) / eps, threshold)
        return None, grad_thr, None


SparsityLoss = Literal["dictionary_learning", "step", "tanh", "quadratic"]


def sparsity_penalty(
    mode: str, entries: Tensor, rows: Tensor | None, n: int, l0_target: float | None
) -> Float[Tensor, ""]:
    """S of the module docstring from its per-entry terms: `entries` holds H(pre − θ) (or tanh(c·codes·‖W_dec[i]‖)
    for "tanh") of every entry that can be nonzero, either the dense (n, d_sae) matrix (rows None) or a flat
    vector whose rows are `rows`; the entries left out are 0.
        dictionary_learning (L0/t − 1)²;  step, tanh  mean_r Σ_i entries_ri;  quadratic  mean_r (2/t)(L0_r − t)²"""
    if mode == "quadratic":
        per_row = entries.sum(1) if rows is None else entries.new_zeros(n).index_add(0, rows, entries)
        return (2 / l0_target) * (per_row - l0_target).pow(2).mean()
    mean = entries.sum() / n
    if mode == "dictionary_learning" and l0_target:
        return (mean / l0_target - 1).pow(2)
    return mean  # step, tanh (and dictionary_learning without a target: the paper's L0)


def dense_step(
    sae,
    x: Tensor,
    centred_ss: Tensor,
    l0_target: float | None,
    l0_coefficient: float,
    bandwidth: float,
    sparsity: str = "dictionary_learning",
    tanh_scale: float = 4.0,
) -> TrainOutput:
    """JumpReLU's objective on dense (n, d_sae) tensors: cheaper than the sparse path when more than an
    eighth of the entries are active or near θ. (x − b_dec) W_enc + b_enc = x W_enc + (b_enc − b_dec W_enc):
    x needs no gradient, so the backward skips the (n × d_sae) @ (d_sae × d_in) product of ∂x."""
    bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc
    pre = torch.addmm(bias, x, sae.W_enc)
    codes = JumpReLUFn.apply(pre, sae.threshold, bandwidth)
    sse = (x - torch.addmm(sae.b_dec, codes, sae.W_dec)).pow(2).sum()
    fire_count = torch.count_nonzero(codes.detach(), dim=0).to(torch.float32)
    if sparsity == "tanh":
        entries = torch.tanh(tanh_scale * codes * sae.W_dec.norm(dim=1))
    else:
        entries = StepFn.apply(pre, sae.threshold, bandwidth)
    aux = sparsity_penalty(sparsity, entries, None, x.shape[0], l0_target)
    loss = sse / centred_ss + l0_coefficient * aux
    return TrainOutput(
        loss, sse.detach(), centred_ss, fire_count.sum(), fire_count > 0, fire_count, {"l0_loss": aux.detach()}
    )


@torch.no_grad()
def init_threshold(sae, x: Float[Tensor, "n d"], l0: float) -> None:
    """θ_i := the m-th largest pre-activation of latent i on the rows x, m = max(1, round(n·l0/d_sae)): every
    latent starts firing on an l0/d_sae share of the rows, so L0 starts at its target (the STE moves θ only
    by about lr per step, too slowly to come down from a dense start in a short run)."""
    pre = sae.pre_activations(x.to(sae.W_enc.device))
    m = max(1, min(pre.shape[0], round(pre.shape[0] * l0 / sae.cfg.d_sae)))
    sae.threshold.copy_(pre.topk(m, dim=0).values[-1].clamp_min(0.0))


@dataclass
class JumpReLUOptions:
    """The L0 target and the threshold's training."""

    l0_target: int = option(32, "the L0 the sparsity loss (L0/l0_target − 1)² aims at", low=1)
    l0_coefficient: float = option(1.0, "weight of the sparsity loss (L0/l0_target − 1)²", low=0)
    bandwidth: float = option(
        0.05, "width ε of the rectangle kernel of the threshold's straight-through estimator", above=0
    )
    threshold_lr_scale: float = option(10.0, "the thresholds' learning rate is lr times this", low=0)
    sparsity_loss: SparsityLoss = option(
        "dictionary_learning",
        "the sparsity loss, after its source: dictionary_learning (L0/t − 1)², step (SAELens', the paper's L0), "
        "quadratic (Gemma Scope 2: mean_r (2/t)(L0_r − t)²), tanh (Anthropic: Σ tanh(c·codes·‖W_dec[i]‖))",
    )
    tanh_scale: float = option(4.0, "c of the tanh sparsity loss (SAELens' jumprelu_tanh_scale)", above=0)

    def __post_init__(self) -> None:
        check(self)


class JumpReLU(Architecture):
    """codes = relu(pre)·[pre > θ_i], one trained threshold per latent; the loss term "l0_loss" is
    (L0/l0_target − 1)² (or L0 without a target), before l0_coefficient."""

    Options = JumpReLUOptions
    # k was the L0 target before the options were the architecture's own
    legacy_options = {
        "k": "l0_target",
        "l0_coefficient": "l0_coefficient",
        "bandwidth": "bandwidth",
        "threshold_lr_scale": "threshold_lr_scale",
    }
    saved_names = {"saelens": "jumprelu", "dictionary_learning": ("JumpReluAutoEncoder",)}
    # trained (its gradient turned on in param_groups); SAE.load fills it from the file
    extra_tensors = {"threshold": ExtraTensor(lambda cfg: (cfg.d_sae,), trained=True, in_file=True)}
    uses_k = True  # the L0 target, recorded in SAEConfig.k (inference does not read it)

    latent_wise = True

    def encode_latents(self, sae, pre, latents):
        return F.relu(pre) * (pre > sae.threshold[latents])

    def scale_latents(self, sae, scale: Tensor) -> None:
        sae.W_enc.mul_(scale)
        sae.b_enc.mul_(scale)
        sae.threshold.mul_(scale)

    def forward_train(
        self,
        sae,
        x,
        *,
        centred_ss,
        centred_ss_fn,
        dead_mask,
        l0_target: float | None = None,
        l0_coefficient: float = 0.0,
        bandwidth: float = 0.05,
        sparsity_loss: str = "dictionary_learning",
        tanh_scale: float = 4.0,
        **_: Any,
    ) -> TrainOutput:
        xc = sae.centre(x)
        n, d_sae = x.shape[0], sae.cfg.d_sae
        with torch.no_grad():
            pre = torch.addmm(sae.b_enc, xc, sae.W_enc)
            # active (pre > θ) or inside the threshold's window: every entry with a gradient
            near = rectangle_window(pre, sae.threshold, bandwidth) > 0
            entries = ((pre > sae.threshold) | near).view(-1).nonzero()[:, 0]
        if entries.numel() > pre.numel() // 8:  # far from sparse (thresholds too low)
            return dense_step(sae, x, centred_ss, l0_target, l0_coefficient, bandwidth, sparsity_loss, tanh_scale)
        rows, cols, offsets = row_sorted_entries(entries, n, d_sae)
        gathered = GatheredLinear.apply(xc, sae.W_enc, sae.b_enc, cols, pre[rows, cols], rows, offsets)
        threshold = sae.threshold[cols]  # one θ per entry: its gradient scatters back per latent
        values = JumpReLUFn.apply(gathered, threshold, bandwidth)
        x_hat = sae.decode_sparse(values, cols, offsets=offsets)
        sse = (x - x_hat).pow(2).sum()
        active = values.detach() > 0
        fire_count = torch.zeros(d_sae, device=x.device, dtype=torch.float32).index_add_(0, cols, active.float())
        # entries outside the set add H = 0 (tanh(0) = 0) and no gradient: the sparsity of the whole batch
        if sparsity_loss == "tanh":
            entries = torch.tanh(tanh_scale * values * sae.W_dec.norm(dim=1)[cols])
        else:
            entries = StepFn.apply(gathered, threshold, bandwidth)
        aux = sparsity_penalty(sparsity_loss, entries, rows, n, l0_target)
        loss = sse / centred_ss + l0_coefficient * aux
        return TrainOutput(
            loss, sse.detach(), centred_ss, active.sum(), fire_count > 0, fire_count, {"l0_loss": aux.detach()}
        )

    def sae_config_fields(self, tcfg, d_sae) -> dict:
        return {"k": self.options(tcfg).l0_target}

    def option_summary(self, tcfg) -> str:
        opts = self.options(tcfg)
        form = "" if opts.sparsity_loss == "dictionary_learning" else f", sparsity_loss={opts.sparsity_loss}"
        return f"L0 target={opts.l0_target}, l0_coefficient={opts.l0_coefficient:g}{form}"

    def param_groups(self, sae, tcfg) -> list[dict]:
        sae.threshold.requires_grad_(True)
        others = [p for name, p in sae.named_parameters() if name != "threshold"]
        lr_scale = self.options(tcfg).threshold_lr_scale
        return [{"params": others, "lr_scale": 1.0}, {"params": [sae.threshold], "lr_scale": lr_scale}]

    def init_training(self, sae, tcfg, sample_rows) -> None:
        init_threshold(sae, sample_rows(min(tcfg.b_dec_init_tokens, 16_384)), self.options(tcfg).l0_target)

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        opts = self.options(tcfg)
        return {
            "l0_target": opts.l0_target,
            "l0_coefficient": opts.l0_coefficient,
            "bandwidth": opts.bandwidth,
            "sparsity_loss": opts.sparsity_loss,
            "tanh_scale": opts.tanh_scale,
        }

    def after_step(self, sae, out, step, tcfg, mean_across_ranks) -> None:
        sae.threshold.data.clamp_(min=0.0)  # codes pre·H(pre − θ) stay ≥ 0

    def saved_tensors(self, sae, cfg) -> dict[str, Tensor]:
        # a BatchTopK SAE saved as jumprelu holds one θ: broadcast to every latent
        return {**super().saved_tensors(sae, cfg), "threshold": sae.threshold.detach().expand(cfg.d_sae)}


register_architecture("jumprelu", JumpReLU)

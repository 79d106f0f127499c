"""ReLU SAE with an L1 penalty (SAELens "standard"): codes = relu(pre).

Training: loss = mean_rows ‖x − x̂‖² + l1 · mean_rows Σ_i codes_i·‖W_dec[i]‖ (the SAELens Standard objective,
so coefficients transfer), the coefficient ramped up over `l1_warmup_fraction` of the steps. With
decoder_norm "free" the rows start at norm 0.1 (SAELens' start) and are folded to unit norm at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from saegeo.config import check, option
from saegeo.sae.architectures.base import Architecture, TrainOutput, register_architecture
from saegeo.sae.architectures.kernels import autocast_dtype


class ReLUStep(torch.autograd.Function):
    """The ReLU SAE's training forward with a hand-written backward (no autograd graph of (n, d_sae) temporaries).

    Forward: xc = x − b_dec·[apply], codes = relu(xc @ W_enc + b_enc), x̂ = codes @ W_dec + b_dec,
    l1 = Σ_i ‖w_i‖·Σ_rows codes_ri / n; also the per-latent firing counts (no gradient).
    Backward, given G = ∂L/∂x̂ and g = ∂L/∂l1:
      ∂codes = G W_decᵀ + (g/n)‖w‖ (one GEMM with a broadcast bias), ∂pre = ∂codes·[codes > 0],
      ∂W_enc = xcᵀ ∂pre, ∂b_enc = Σ_rows ∂pre, ∂W_dec = codesᵀ G + (g/n)(Σ_rows codes)_i w_i/‖w_i‖,
      ∂b_dec = Σ_rows G − W_enc ∂b_enc·[apply]; x gets none.
    Five GEMMs of n·d·d_sae and four elementwise passes over (n, d_sae): relu, its backward, two column sums.
    (Not folded into the GEMMs as an extra row/column: the wider GEMMs cost more than the passes they save;
    benchmarks/README.md#numbers-behind-code-comments.)
    Under torch.autocast (the trainer's dtype bfloat16) the five GEMMs run in the autocast dtype, forward and
    backward alike; x̂, the sums, the norms and every gradient returned stay in the weights' dtype (float32).
    """

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, W_dec, b_dec, apply_b_dec: bool):
        low = autocast_dtype(x.device.type)
        cast = (lambda t: t.to(low)) if low is not None else (lambda t: t)
        xc = x - b_dec if apply_b_dec else x
        codes = torch.addmm(cast(b_enc), cast(xc), cast(W_enc)).relu_()
        x_hat = torch.addmm(cast(b_dec), codes, cast(W_dec)).to(W_dec.dtype)
        norms = W_dec.norm(dim=1)
        code_sums = codes.sum(dim=0, dtype=W_dec.dtype)
        l1 = code_sums @ norms / x.shape[0]
        fire_count = torch.count_nonzero(codes, dim=0).to(torch.float32)
        ctx.save_for_backward(xc, codes, W_enc, W_dec, norms, code_sums)
        ctx.apply_b_dec, ctx.low = apply_b_dec, low
        ctx.mark_non_differentiable(fire_count)
        return x_hat, l1, fire_count

    @staticmethod
    def backward(ctx, grad_x_hat, grad_l1, _):
        xc, codes, W_enc, W_dec, norms, code_sums = ctx.saved_tensors
        cast = (lambda t: t.to(ctx.low)) if ctx.low is not None else (lambda t: t)
        g = grad_l1 / xc.shape[0]
        # ∂pre = ∂codes where codes > 0: ReLU's own fused backward kernel, one pass
        grad_pre = torch.ops.aten.threshold_backward(
            torch.addmm(cast(g * norms), cast(grad_x_hat), cast(W_dec).t()), codes, 0.0
        )
        grad_W_enc = (cast(xc).t() @ grad_pre).to(W_enc.dtype)
        grad_b_enc = grad_pre.sum(dim=0, dtype=W_enc.dtype)
        del grad_pre
        grad_W_dec = torch.addmm(
            cast((g * code_sums / norms.clamp_min(1e-12))[:, None] * W_dec), codes.t(), cast(grad_x_hat)
        ).to(W_dec.dtype)
        grad_b_dec = grad_x_hat.sum(dim=0)
        if ctx.apply_b_dec:
            grad_b_dec = grad_b_dec - W_enc @ grad_b_enc
        return None, grad_W_enc, grad_b_enc, grad_W_dec, grad_b_dec, None


@dataclass
class ReLUOptions:
    """The L1 penalty."""

    # 1: SAELens' default, the same objective scale (see train_defaults below)
    l1_coefficient: float = option(1.0, "L1 coefficient; the same objective scale as SAELens Standard", low=0)
    l1_warmup_fraction: float = option(
        0.0, "the L1 coefficient rises linearly from 0 over this fraction of the steps", low=0, high=1
    )

    def __post_init__(self) -> None:
        check(self)


def l1_ramp(step: int, total_steps: int, warmup_fraction: float) -> float:
    """The L1 warm-up factor min(1, (step + 1)/(l1_warmup_fraction · total_steps)) (1 without warm-up)."""
    ramp_steps = warmup_fraction * total_steps
    return 1.0 if ramp_steps <= 0 else min(1.0, (step + 1) / ramp_steps)


class ReLU(Architecture):
    """codes = relu(pre); L1 on codes·‖W_dec[i]‖ (the term "l1_loss": mean_rows Σ_i codes_i·‖W_dec[i]‖)."""

    Options = ReLUOptions
    legacy_options = {"l1_coefficient": "l1_coefficient", "l1_warmup_fraction": "l1_warmup_fraction"}
    saved_names = {"saelens": "standard", "dictionary_learning": ("AutoEncoder", "AutoEncoderNew"), "openai": "ReLU"}
    # Why 0.1: with W_enc = W_decᵀ about half of the d_sae latents fire on a row, and x̂ − b_dec ≈
    # (d_sae / 2d_in)·(x − b_dec), several times the data, so the L1 term dominates early and the run ends
    # dense and poorly fit. SAELens starts decoder rows at norm 0.1 with a tied encoder (initial x̂ 0.01× that);
    # in unit-decoder form that is encoder_scale 0.01; 0.1 and 0.01 end alike, 1 ends dense
    # (benchmarks/README.md#training-train_benchpy).
    init_encoder_scale = 0.1
    # grad_clip_norm 1 (SAELens' trainer clips at 1 too): on this objective's scale the gradient falls about tenfold
    # over the first steps while Adam's second moment (β2 0.999) still holds the first steps', so unclipped later
    # steps shrink by about that factor; clipped (every step there: ‖∇‖ > 1), Adam sees unit-norm gradients and
    # keeps its step: a lower held-out objective at a sparser L0. A TopK loss is FVU (‖∇‖ < 1): it has no clip.
    # lr 8e-3: with the clip, the lowest held-out objective at l1 0.5 and 1 of the lr grid on MiniLM layer 3
    # (benchmarks/README.md#training-train_benchpy). l1 1: SAELens' default, the same objective scale.
    train_defaults = {"lr": 8e-3, "grad_clip_norm": 1.0, "decoder_norm": "unit"}
    free_decoder = True

    latent_wise = True

    def encode_latents(self, sae, pre: Float[Tensor, "n b"], latents: slice) -> Float[Tensor, "n b"]:
        return F.relu(pre)

    def scale_latents(self, sae, scale: Tensor) -> None:
        sae.W_enc.mul_(scale)
        sae.b_enc.mul_(scale)

    def forward_train(
        self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, l1_coefficient: float = 0.0, **_: Any
    ) -> TrainOutput:
        x_hat, l1, fire_count = ReLUStep.apply(
            x, sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, sae.cfg.apply_b_dec_to_input
        )
        sse = (x - x_hat).pow(2).sum()
        loss = sse / x.shape[0] + l1_coefficient * l1
        return TrainOutput(
            loss, sse.detach(), centred_ss, fire_count.sum(), fire_count > 0, fire_count, {"l1_loss": l1.detach()}
        )

    def init_training(self, sae, tcfg, sample_rows) -> None:
        if not self.unit_decoder(tcfg):  # SAELens' start: rows of norm 0.1, encoder W_decᵀ (x̂ as encoder_scale 0.01)
            sae.W_dec.data.mul_(0.1)
            sae.W_enc.data.copy_(sae.W_dec.data.T)

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        opts = self.options(tcfg)
        return {"l1_coefficient": opts.l1_coefficient * l1_ramp(step, tcfg.total_steps, opts.l1_warmup_fraction)}

    def option_summary(self, tcfg) -> str:
        return f"l1={self.options(tcfg).l1_coefficient:g}"


register_architecture("relu", ReLU)

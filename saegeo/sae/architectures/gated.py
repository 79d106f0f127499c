"""Gated SAE (Rajamanoharan et al. 2024, "Improving Dictionary Learning with Gated Sparse Autoencoders"; SAELens
"gated"): a gate decides which latents fire, a magnitude path how much, both from one encoder matrix.

    gate_pre = (x − b_dec) W_enc + b_gate          (b_gate is the SAE's b_enc)
    mag_pre  = (x − b_dec) (W_enc ⊙ exp(r_mag)) + b_mag = (gate_pre − b_gate)·exp(r_mag) + b_mag
    codes    = [gate_pre > 0] · relu(mag_pre)

Training (the paper's loss): loss = mean_rows ‖x − x̂‖² + l1 · mean_rows Σ_i relu(gate_pre_i)·‖W_dec[i]‖ +
mean_rows ‖x − (relu(gate_pre) W_dec + b_dec)‖² with W_dec and b_dec detached in the last (the auxiliary
reconstruction that trains the gate, whose step function has no gradient), as dictionary_learning's GatedSAETrainer
computes it (its L1 has no ‖W_dec[i]‖: its decoder columns are kept at norm 1). SAELens 6.54's GatedTrainingSAE
weighs the L1 by ‖W_dec[i]‖ as here but does not detach the decoder in the auxiliary term. Logged terms:
"l1_loss" and "aux_recon_loss". Saved in SAELens' layout: architecture "gated", tensors W_enc, b_gate, b_mag,
r_mag, W_dec, b_dec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from saegeo.config import check, option
from saegeo.errors import FormatError
from saegeo.sae.architectures.base import Architecture, ExtraTensor, TrainOutput, register_architecture


@dataclass
class GatedOptions:
    """The L1 penalty on the gate's pre-activations."""

    l1_coefficient: float = option(1.0, "weight of mean_rows Σ relu(gate_pre_i)·‖W_dec[i]‖", low=0)

    def __post_init__(self) -> None:
        check(self)


class Gated(Architecture):
    """codes = [gate_pre > 0]·relu((gate_pre − b_gate)·exp(r_mag) + b_mag)."""

    Options = GatedOptions
    saved_names = {"saelens": "gated", "dictionary_learning": ("GatedAutoEncoder",)}
    file_tensor_names = {"b_enc": "b_gate"}  # SAELens' GatedSAE has no b_enc: the gate's bias is b_gate
    extra_tensors = {
        **Architecture.extra_tensors,
        "r_mag": ExtraTensor(lambda cfg: (cfg.d_sae,), trained=True, in_file=True),  # log of each latent's scale
        "b_mag": ExtraTensor(lambda cfg: (cfg.d_sae,), trained=True, in_file=True),
    }
    # The gate trains as a ReLU SAE's encoder does (the same L1 on relu(pre)·‖w_i‖): relu's start and clip
    # (relu.py). lr 1e-2: the better of 4e-3 and 1e-2 on tests/sae/test_gated.py's synthetic run (the recovery
    # table in benchmarks/README.md); not yet tuned on a model's activations.
    init_encoder_scale = 0.1
    train_defaults = {"lr": 1e-2, "grad_clip_norm": 1.0, "decoder_norm": "unit"}
    latent_wise = True

    def check_config(self, cfg) -> None:
        if cfg.rescale_acts_by_decoder_norm:
            raise FormatError("a gated SAE does not rescale its codes by the decoder norms")

    def encode_latents(self, sae, pre: Float[Tensor, "n b"], latents: slice) -> Float[Tensor, "n b"]:
        mag_pre = (pre - sae.b_enc[latents]) * sae.r_mag[latents].exp() + sae.b_mag[latents]
        return (pre > 0) * F.relu(mag_pre)

    def forward_train(
        self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, l1_coefficient: float = 0.0, **_: Any
    ) -> TrainOutput:
        n = x.shape[0]
        gate_pre = torch.addmm(sae.b_enc, sae.centre(x), sae.W_enc)
        mag_pre = (gate_pre - sae.b_enc) * sae.r_mag.exp() + sae.b_mag
        codes = (gate_pre > 0).to(mag_pre.dtype) * F.relu(mag_pre)
        sse = (x - torch.addmm(sae.b_dec, codes, sae.W_dec)).pow(2).sum()
        gate = F.relu(gate_pre)
        l1 = (gate * sae.W_dec.norm(dim=1)).sum() / n
        aux = (x - torch.addmm(sae.b_dec.detach(), gate, sae.W_dec.detach())).pow(2).sum() / n
        loss = sse / n + l1_coefficient * l1 + aux
        fire_count = torch.count_nonzero(codes.detach(), dim=0).to(torch.float32)
        terms = {"l1_loss": l1.detach(), "aux_recon_loss": aux.detach()}
        return TrainOutput(loss, sse.detach(), centred_ss, fire_count.sum(), fire_count > 0, fire_count, terms)

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        return {"l1_coefficient": self.options(tcfg).l1_coefficient}

    def option_summary(self, tcfg) -> str:
        return f"l1={self.options(tcfg).l1_coefficient:g}"

    def saved_tensors(self, sae, cfg) -> dict[str, Tensor]:
        tensors = super().saved_tensors(sae, cfg)
        return {self.file_tensor_names.get(name, name): value for name, value in tensors.items()}


register_architecture("gated", Gated)

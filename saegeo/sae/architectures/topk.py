"""TopK SAE (Gao et al. 2024; sparsify, SAELens, OpenAI): the k largest codes of each row.

topk_order relu_then_topk (sparsify): top-k of relu(pre); topk_then_relu (SAELens, OpenAI): relu of the
top-k of pre. Dense codes are identical; the chosen *indices* differ when a row has fewer than k positive
pre-activations.

Training: loss = SSE / centred SS (FVU) + aux_coefficient · AuxK, AuxK reconstructing the residual from the
top-`aux_k` dead latents (`kernels.auxk_loss`). Gradients flow only through the k selected (and AuxK) entries
(`kernels.GatheredLinear`) and a bagged decode: the backward never forms an (n, d_sae) matrix.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import FormatError
from saegeo.sae.architectures.base import Architecture, TrainOutput, register_architecture
from saegeo.sae.architectures.kernels import GatheredLinear, aux_options, auxk_loss, gathered_pre


def topk_codes(sae, pre: Float[Tensor, "n d_sae"]) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """(values ≥ 0, indices) of each row's k codes in the SAE's topk_order."""
    k = int(sae.cfg.k)
    if sae.cfg.topk_order == "relu_then_topk":
        return F.relu(pre).topk(k, dim=-1, sorted=False)
    values, indices = pre.topk(k, dim=-1, sorted=False)
    return F.relu(values), indices


class TopK(Architecture):
    """codes = the k largest of each row (per topk_order), zeros elsewhere."""

    uses_k = True
    topk_codes = True
    aux_loss_name = "auxk_loss"  # the AuxK term, before aux_coefficient
    # lr 4e-3: the highest held-out FVE at k 16 and 32 of the grid 2e-3, 4e-3, 8e-3 (MiniLM layer 3, 368,640 tokens,
    # benchmarks/README.md "Training"): k 32 0.891 against 0.875 at 2e-3 and 0.889 (48 % dead) at 8e-3; the former
    # default 3e-4 gave 0.741. SmolLM2 layer 6, same budget, k 32: 0.921 at 4e-3 against 0.856 at 4e-4.
    train_defaults = {"lr": 4e-3, "l1_coefficient": 1.0, "grad_clip_norm": 0.0}

    def check_config(self, cfg) -> None:
        if not (cfg.k and 0 < cfg.k <= cfg.d_sae):
            raise FormatError(f"topk SAE needs 0 < k <= d_sae={cfg.d_sae}, got k={cfg.k}")

    def encode(self, sae, pre):
        values, indices = topk_codes(sae, pre)
        return torch.zeros_like(pre).scatter_(-1, indices, values)

    def encode_topk(self, sae, pre):
        return topk_codes(sae, pre)

    def reconstruct(self, sae, pre, norm_state):
        return sae.decode_sparse(*topk_codes(sae, pre), norm_state=norm_state)

    def forward_train(
        self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, aux_k: int = 0, aux_coefficient: float = 0.0, **_: Any
    ) -> TrainOutput:
        # Dense pre-activations without autograd; gradients flow only through the k selected
        # (and AuxK) entries via GatheredLinear, so the backward never forms a (n, d_sae) matrix.
        xc = x - sae.b_dec if sae.cfg.apply_b_dec_to_input else x
        with torch.no_grad():
            pre = torch.addmm(sae.b_enc, xc, sae.W_enc)
            if sae.cfg.topk_order == "relu_then_topk":
                # in place: the entries used below are relu'd again, and a latent at 0 adds nothing and gets
                # no gradient either way; saves a (n × d_sae) copy per step
                pre.relu_()
            indices = pre.topk(int(sae.cfg.k), dim=-1, sorted=False).indices
        values = F.relu(GatheredLinear.apply(xc, sae.W_enc, sae.b_enc, indices, pre.gather(1, indices)))
        x_hat = sae.decode_sparse(values, indices)
        err = x - x_hat
        sse = err.pow(2).sum()
        loss = sse / centred_ss
        aux = auxk_loss(sae, err, pre, dead_mask, aux_k, aux_coefficient, centred_ss_fn, gathered_pre(xc, sae, pre))
        loss = loss + aux_coefficient * aux
        active = values > 0
        fire_count = torch.zeros(sae.cfg.d_sae, device=x.device, dtype=torch.float32)
        fire_count.index_add_(0, indices.flatten(), active.flatten().float())
        return TrainOutput(loss, sse.detach(), centred_ss, active.sum(), aux.detach(), fire_count > 0, fire_count)

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        return aux_options(tcfg, d_in)

    def saelens_fields(self, cfg) -> dict:
        return {"k": cfg.k, "rescale_acts_by_decoder_norm": cfg.rescale_acts_by_decoder_norm}


register_architecture("topk", TopK)

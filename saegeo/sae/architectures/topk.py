"""TopK SAE (Gao et al. 2024; sparsify, SAELens, OpenAI): the k largest codes of each row.

topk_order relu_then_topk (sparsify): top-k of relu(pre); topk_then_relu (SAELens, OpenAI): relu of the
top-k of pre. Dense codes are identical; the chosen *indices* differ when a row has fewer than k positive
pre-activations.

Training: loss = SSE / centred SS (FVU) + aux_coefficient · AuxK, AuxK reconstructing the residual from the
top-`aux_k` dead latents (`kernels.auxk_loss`). Gradients flow only through the k selected (and AuxK) entries
(`kernels.GatheredLinear`) and a bagged decode: the backward never forms an (n, d_sae) matrix.

decoder_norm "free" (the default): SAELens' form. Decoder rows start small (norm 0.5, nearer 1 in a run too short
to grow them back: `free_init_norm`; SAELens 0.1) with a tied encoder W_decᵀ, their norms are left free, and each
row's k latents are those with the largest pre_i·‖w_i‖ (rescale_acts_by_decoder_norm while training), decoded as
pre_i·w_i; at the end the norms are folded into the encoder (W_enc[:, i], b_enc[i] ·= ‖w_i‖, w_i /= ‖w_i‖), which
keeps every code·row and every choice of latents. "unit": rows kept at unit norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.config import option
from saegeo.errors import FormatError
from saegeo.sae.architectures.base import Architecture, TrainOutput, register_architecture, row_major
from saegeo.sae.architectures.kernels import AuxKOptions, aux_options, auxk_loss, gathered_pre


def topk_codes(sae, pre: Float[Tensor, "n d_sae"]) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """(values ≥ 0, indices) of each row's k codes in the SAE's topk_order."""
    k = int(sae.cfg.k)
    if sae.cfg.topk_order == "relu_then_topk":
        return F.relu(pre).topk(k, dim=-1, sorted=False)
    values, indices = pre.topk(k, dim=-1, sorted=False)
    return F.relu(values), indices


def merge_topk(
    keys: Float[Tensor, "n a"],
    indices: Int[Tensor, "n a"],
    more_keys: Float[Tensor, "n b"],
    more: Int[Tensor, "n b"],
    k: int,
) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """Each row's k largest of two candidate sets (keys and their latent indices): the top-k of a union is the
    top-k of the parts' top-ks, so latent blocks merge exactly (up to which of tied keys is kept)."""
    keys, indices = torch.cat([keys, more_keys], dim=1), torch.cat([indices, more], dim=1)
    top, where = keys.topk(min(k, keys.shape[1]), dim=1, sorted=False)
    return top, indices.gather(1, where)


FREE_INIT_NORM = 0.5  # decoder_norm "free": the rows' norm at the start (see TopK.init_training) ...


def free_init_norm(lr: float, d_in: int, total_steps: int) -> float:
    """... unless the run is too short for it: n₀ = max(0.5, 1 − lr·√d_in·total_steps/10). Adam moves each entry
    by about lr a step, a row's norm by about lr·√d_in, so rows from n₀ are back at unit norm within a tenth of the
    run; a short run at a small lr starts (nearly) at unit rows (SmolLM2's demo SAE:
    benchmarks/README.md#training-train_benchpy)."""
    return max(FREE_INIT_NORM, 1.0 - lr * d_in**0.5 * total_steps / 10)


@dataclass
class TopKOptions(AuxKOptions):
    """k and AuxK."""

    k: int = option(32, "active latents per token", low=1)


class TopK(Architecture):
    """codes = the k largest of each row (per topk_order), zeros elsewhere; the loss term "auxk_loss" is AuxK."""

    Options = TopKOptions
    legacy_options = {"k": "k", "aux_k": "aux_k", "aux_coefficient": "aux_coefficient"}
    saved_names = {"saelens": "topk", "dictionary_learning": ("AutoEncoderTopK",), "sparsify": "topk", "openai": "TopK"}
    uses_k = True
    topk_codes = True
    # lr 4e-3: the highest held-out FVE at k 16, 32 and 64 of the lr grid on MiniLM layer 3, and on SmolLM2's short
    # demo run (benchmarks/README.md#training-train_benchpy).
    # decoder_norm free: see init_training.
    train_defaults = {"lr": 4e-3, "grad_clip_norm": 0.0, "decoder_norm": "free"}
    free_decoder = True
    trains_rescaled = True

    def check_config(self, cfg) -> None:
        if not (cfg.k and 0 < cfg.k <= cfg.d_sae):
            raise FormatError(f"topk SAE needs 0 < k <= d_sae={cfg.d_sae}, got k={cfg.k}")

    def encode(self, sae, pre):
        values, indices = topk_codes(sae, pre)
        return torch.zeros_like(pre).scatter_(-1, indices, values)

    def encode_topk(self, sae, pre):
        return topk_codes(sae, pre)

    def sparse_codes(self, sae, blocks, max_entries=None):
        # at most k codes a row: never more than the caller's max_entries allows for (it is ignored).
        # The running top-k of each row over the blocks: k keys (relu(pre) or pre, per topk_order) and their latents
        k, relu_first = int(sae.cfg.k), sae.cfg.topk_order == "relu_then_topk"
        keys = indices = None
        for latents, pre in blocks:
            block_keys, block_indices = (F.relu(pre) if relu_first else pre).topk(
                min(k, pre.shape[1]), dim=1, sorted=False
            )
            block_indices += latents.start
            if keys is None:
                keys, indices = block_keys, block_indices
            else:
                keys, indices = merge_topk(keys, indices, block_keys, block_indices, k)
        values = F.relu(keys)
        rows, slot = values.nonzero(as_tuple=True)  # codes at 0 (fewer than k positive) are not codes
        return row_major(rows, indices[rows, slot], values[rows, slot], n_latents=int(sae.cfg.d_sae))

    def reconstruct(self, sae, pre, norm_state):
        return sae.decode_sparse(*topk_codes(sae, pre), norm_state=norm_state)

    def scale_latents(self, sae, scale: Tensor) -> None:
        if not sae.cfg.rescale_acts_by_decoder_norm:
            raise FormatError("cannot fold decoder norms into a topk SAE that chooses its latents on pre alone")
        sae.W_enc.mul_(scale)
        sae.b_enc.mul_(scale)

    def sae_config_fields(self, tcfg, d_sae) -> dict:
        return super().sae_config_fields(tcfg, d_sae) | {"rescale_acts_by_decoder_norm": not self.unit_decoder(tcfg)}

    def init_training(self, sae, tcfg, sample_rows) -> None:
        # Why small rows: Adam moves every entry by about lr a step whatever its size, so small rows (and the tied
        # encoder) turn further per step while their norms grow. Why 0.5 and not SAELens' 0.1: the reconstruction
        # starts at (norm)² of its scale, and at a low lr the rows take most of a short run to grow from 0.1; on a
        # very short run even 0.5 is too small, hence free_init_norm. The held-out FVE by initial norm and lr:
        # benchmarks/README.md#training-train_benchpy ("TopK, second pass: free decoder norms").
        if not self.unit_decoder(tcfg):
            sae.W_dec.data.mul_(free_init_norm(tcfg.lr, sae.cfg.d_in, tcfg.total_steps))
            sae.W_enc.data.copy_(sae.W_dec.data.T)

    def forward_train(
        self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, aux_k: int = 0, aux_coefficient: float = 0.0, **_: Any
    ) -> TrainOutput:
        # Dense pre-activations without autograd; gradients flow only through the k selected
        # (and AuxK) entries via GatheredLinear, so the backward never forms a (n, d_sae) matrix.
        xc = sae.centre(x)
        # rescaled: ‖w_i‖ with its gradient, as decode_sparse divides the codes by it again
        decoder_norms = sae.W_dec.norm(dim=1) if sae.cfg.rescale_acts_by_decoder_norm else None
        row_norms = None if decoder_norms is None else decoder_norms.detach()
        with torch.no_grad():
            pre = torch.addmm(sae.b_enc, xc, sae.W_enc)
            if row_norms is not None:
                pre.mul_(row_norms)  # in place: latents (and AuxK's) chosen on pre_i·‖w_i‖
            keys = self.selection_keys(sae, pre)
            indices = keys.topk(int(sae.cfg.k), dim=-1, sorted=False).indices

        gathered = gathered_pre(xc, sae, pre, row_norms)  # the chosen entries of pre itself, with their gradient
        values = self.code_values(gathered(indices))
        if decoder_norms is not None:  # codes in the rescaled units decode_sparse divides out: x̂ = Σ code_i·w_i
            values = values * decoder_norms[indices]
        x_hat = sae.decode_sparse(values, indices)
        err = x - x_hat
        sse = err.pow(2).sum()
        loss = sse / centred_ss
        aux = auxk_loss(
            sae, err, keys, dead_mask, aux_k, aux_coefficient, centred_ss_fn, gathered, signed=self.signed_codes
        )
        loss = loss + aux_coefficient * aux
        active = values != 0
        fire_count = torch.zeros(sae.cfg.d_sae, device=x.device, dtype=torch.float32)
        fire_count.index_add_(0, indices.flatten(), active.flatten().float())
        return TrainOutput(
            loss, sse.detach(), centred_ss, active.sum(), fire_count > 0, fire_count, {"auxk_loss": aux.detach()}
        )

    signed_codes = False  # codes are relu(pre): AuxK's too

    def selection_keys(self, sae, pre: Float[Tensor, "n d_sae"]) -> Float[Tensor, "n d_sae"]:
        """What the k latents (and AuxK's dead ones) are chosen on while training: pre, or relu(pre) per topk_order."""
        if sae.cfg.topk_order == "relu_then_topk":
            # in place: the entries used are relu'd again, and a latent at 0 adds nothing and gets no gradient either
            # way; saves a (n × d_sae) copy per step
            pre.relu_()
        return pre

    def code_values(self, chosen: Tensor) -> Tensor:
        """The codes of the chosen entries of pre (with their gradient)."""
        return F.relu(chosen)

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        return aux_options(self.options(tcfg), d_in)

    def option_summary(self, tcfg) -> str:
        return f"k={self.options(tcfg).k}"

    def saelens_fields(self, cfg) -> dict:
        return {"k": cfg.k, "rescale_acts_by_decoder_norm": cfg.rescale_acts_by_decoder_norm}


register_architecture("topk", TopK)

"""AbsTopK SAE (Zhu et al. 2025, "AbsTopK: Rethinking Sparse Autoencoders For Bidirectional Features"; SAELens
"abstopk"; sparsify's older ``signed: true`` TopK): each row keeps the k pre-activations of largest magnitude with
their sign, so one latent can fire in both directions along its decoder row.

    pre   = (x − b_dec) W_enc + b_enc                 (· ‖w_i‖ with rescale_acts_by_decoder_norm, as TopK)
    codes = pre_i on the k latents of largest |pre_i| of the row, 0 elsewhere      (no ReLU: codes take both signs)

Training as TopK (topk.py: FVU + AuxK, gradients only through the chosen entries, free decoder norms folded at the
end), except that the k latents and AuxK's dead latents are chosen on |pre| and keep their signed values, as
SAELens' AbsTopKTrainingSAE chooses them. Saved in SAELens' layout: architecture "abstopk", k,
rescale_acts_by_decoder_norm, tensors W_enc, b_enc, W_dec, b_dec.

Codes of both signs are outside the amplification law's non-negative model; the report reads them with the signed
null and the oriented law (docs/statistics.md §9).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.sae.architectures.base import register_architecture, row_major
from saegeo.sae.architectures.topk import TopK


def abs_topk_codes(sae, pre: Float[Tensor, "n d_sae"]) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
    """(signed values, indices) of each row's k pre-activations of largest |pre|."""
    indices = pre.abs().topk(int(sae.cfg.k), dim=-1, sorted=False).indices
    return pre.gather(-1, indices), indices


class AbsTopK(TopK):
    """codes = the k entries of largest |pre| of each row, signs kept; the loss term "auxk_loss" is AuxK on |pre|."""

    legacy_options = {}
    saved_names = {"saelens": "abstopk", "sparsify": "signed topk"}  # sparsify: activation topk with signed: true
    signed_codes = True  # AuxK's dead latents keep their signs too

    def encode(self, sae, pre):
        values, indices = abs_topk_codes(sae, pre)
        return torch.zeros_like(pre).scatter_(-1, indices, values)

    def encode_topk(self, sae, pre):
        return abs_topk_codes(sae, pre)

    def sparse_codes(self, sae, blocks, max_entries=None):
        # the running top-k of |pre| over the latent blocks, with the signed values beside their keys
        k = int(sae.cfg.k)
        keys = indices = values = None
        for latents, pre in blocks:
            block_keys, where = pre.abs().topk(min(k, pre.shape[1]), dim=1, sorted=False)
            block_values, block_indices = pre.gather(1, where), where + latents.start
            if keys is not None:
                block_keys = torch.cat([keys, block_keys], dim=1)
                block_values = torch.cat([values, block_values], dim=1)
                block_indices = torch.cat([indices, block_indices], dim=1)
                block_keys, where = block_keys.topk(min(k, block_keys.shape[1]), dim=1, sorted=False)
                block_values, block_indices = block_values.gather(1, where), block_indices.gather(1, where)
            keys, values, indices = block_keys, block_values, block_indices
        rows, slot = (values != 0).nonzero(as_tuple=True)
        return row_major(rows, indices[rows, slot], values[rows, slot], n_latents=int(sae.cfg.d_sae))

    def reconstruct(self, sae, pre, norm_state):
        return sae.decode_sparse(*abs_topk_codes(sae, pre), norm_state=norm_state)

    def selection_keys(self, sae, pre):
        return pre.abs()  # a new tensor: pre keeps its signs for the chosen codes

    def code_values(self, chosen):
        return chosen


register_architecture("abstopk", AbsTopK)

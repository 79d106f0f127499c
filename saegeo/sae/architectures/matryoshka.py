"""Matryoshka BatchTopK SAE (Bussmann et al. 2025, "Learning Multi-Level Features with Matryoshka Sparse
Autoencoders"; dictionary_learning `trainers/matryoshka_batch_top_k.py`, SAELens `matryoshka_batchtopk`).

The latents are cut into nested prefixes of widths w_1 < … < w_G = d_sae (group_fractions, dictionary_learning's
rule: group g holds ⌊f_g·d_sae⌋ latents, the last group the rest). Codes are BatchTopK's (k·n largest of relu(pre)
over the batch); each prefix reconstructs on its own, x̂_ℓ = b_dec + Σ_{i < w_ℓ} a_i W_dec[i], so the first latents
learn to carry the most. Reconstruction term, with FVU_ℓ = Σ‖x − x̂_ℓ‖² / Σ‖x − x̄‖² (saegeo's normalisation of
every architecture's loss):
  loss = "dictionary_learning" (default): mean_ℓ (v_ℓ · FVU_ℓ), v_ℓ = group_weights (default 1/G): its
         MatryoshkaBatchTopKTrainer.loss, `l2_losses.mean()` of the weighted prefix losses;
         "saelens": Σ_ℓ FVU_ℓ, the unweighted sum of MatryoshkaBatchTopKTrainingSAE.training_forward_pass;
plus aux_coefficient · AuxK on the full residual (both peers' default). The inference threshold θ is BatchTopK's
(`batchtopk.update_threshold`); at inference the codes are relu(pre)·[relu(pre) > θ], as both peers encode.
Logged terms: "auxk_loss" and "fvu_prefix_<w_ℓ>" for each level.

Saved as SAELens saves its own: architecture "jumprelu" with θ broadcast, metadata.training_architecture
"matryoshka_batchtopk" and training_architecture_details {k, matryoshka_widths}; the widths are
SAEConfig.matryoshka_widths, which every reader fills (SAELens metadata, dictionary_learning group_sizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from saegeo.config import check, option
from saegeo.errors import BadInputError, FormatError
from saegeo.sae.architectures.base import TrainOutput, register_architecture
from saegeo.sae.architectures.batchtopk import BatchTopK, BatchTopKOptions, batch_topk_codes
from saegeo.sae.architectures.kernels import auxk_loss, gathered_pre

MatryoshkaLoss = Literal["dictionary_learning", "saelens"]


def group_widths(group_fractions: tuple[float, ...], d_sae: int) -> list[int]:
    """The nested prefix widths w_ℓ = Σ_{g ≤ ℓ} s_g of dictionary_learning's group sizes s_g = ⌊f_g·d_sae⌋ (the last
    group: d_sae − the others); BadInputError when a group would be empty."""
    sizes = [int(f * d_sae) for f in group_fractions[:-1]]
    sizes.append(d_sae - sum(sizes))
    if min(sizes) < 1:
        raise BadInputError(
            f"matryoshka group_fractions {list(group_fractions)} give group sizes {sizes} at d_sae {d_sae}: "
            "each group needs at least one latent (larger fractions or a larger d_sae)"
        )
    return [int(w) for w in torch.tensor(sizes).cumsum(0).tolist()]


@dataclass
class MatryoshkaOptions(BatchTopKOptions):
    """BatchTopK's options, the nesting and the loss form."""

    group_fractions: tuple[float, ...] = option(
        (1 / 16, 1 / 16, 1 / 8, 1 / 4, 1 / 2),
        "share of the latents in each nested group (sum 1; widths d_sae/16, /8, /4, /2, 1 by default)",
        above=0,
        high=1,
    )
    group_weights: tuple[float, ...] = option(
        (), "loss dictionary_learning: weight of each prefix's FVU (default 1/G each)", low=0
    )
    loss: MatryoshkaLoss = option(
        "dictionary_learning",
        "prefix losses combined as dictionary_learning (mean of the weighted FVUs) or saelens (their sum)",
    )

    def __post_init__(self) -> None:
        self.group_fractions, self.group_weights = tuple(self.group_fractions), tuple(self.group_weights)
        check(self)
        if not math.isclose(sum(self.group_fractions), 1.0, abs_tol=1e-6):
            raise BadInputError(f"matryoshka group_fractions {list(self.group_fractions)} must sum to 1")
        if self.group_weights and len(self.group_weights) != len(self.group_fractions):
            raise BadInputError(
                f"matryoshka group_weights has {len(self.group_weights)} entries, group_fractions "
                f"{len(self.group_fractions)}: one weight per group"
            )


class Matryoshka(BatchTopK):
    """BatchTopK codes and threshold; each nested prefix of latents trained to reconstruct on its own."""

    Options = MatryoshkaOptions
    legacy_options = {}  # new: no flat options of a release before
    saved_names = {"saelens": (), "dictionary_learning": ("MatryoshkaBatchTopKSAE",)}  # SAELens: saved as jumprelu

    def check_config(self, cfg) -> None:
        if cfg.matryoshka_widths is None:
            raise FormatError("a matryoshka SAE needs its nested widths (SAEConfig.matryoshka_widths)")

    def sae_config_fields(self, tcfg, d_sae: int) -> dict:
        return {"k": self.options(tcfg).k, "matryoshka_widths": group_widths(self.options(tcfg).group_fractions, d_sae)}

    def forward_train(
        self,
        sae,
        x,
        *,
        centred_ss,
        centred_ss_fn,
        dead_mask,
        aux_k: int = 0,
        aux_coefficient: float = 0.0,
        loss: str = "dictionary_learning",
        group_weights: tuple[float, ...] = (),
        **_: Any,
    ) -> TrainOutput:
        # BatchTopK's codes (batchtopk.py), then one bag per (row, level): entries sorted by row then latent are
        # sorted by (row, level) too, so one embedding_bag gives every level's part of every row
        codes = batch_topk_codes(sae, x)
        n, rows, cols = x.shape[0], codes.rows, codes.cols
        widths = torch.tensor(sae.cfg.matryoshka_widths, device=x.device)
        n_levels = widths.numel()
        bags = rows * n_levels + torch.bucketize(cols, widths, right=True)  # level of latent c: #{ℓ: w_ℓ ≤ c}
        bag_offsets = torch.zeros(n * n_levels, dtype=torch.long, device=x.device)
        bag_offsets[1:] = torch.bincount(bags, minlength=n * n_levels).cumsum(0)[:-1]
        parts = F.embedding_bag(
            cols, sae.W_dec, bag_offsets, per_sample_weights=codes.values.to(sae.W_dec.dtype), mode="sum"
        ).view(n, n_levels, -1)
        errors = (x - sae.b_dec)[:, None, :] - parts.cumsum(dim=1)  # x − x̂_ℓ for every prefix ℓ
        sse_levels = errors.pow(2).sum(dim=(0, 2))
        fvu_levels = sse_levels / centred_ss
        if loss == "saelens":
            reconstruction = fvu_levels.sum()
        else:
            weights = torch.tensor(group_weights or [1.0 / n_levels] * n_levels, device=x.device)
            reconstruction = (weights * fvu_levels).mean()
        err, pre = errors[:, -1], codes.pre
        aux = auxk_loss(
            sae, err, pre, dead_mask, aux_k, aux_coefficient, centred_ss_fn, gathered_pre(codes.xc, sae, pre)
        )
        terms = {"auxk_loss": aux.detach()}
        terms.update({f"fvu_prefix_{w}": f.detach() for w, f in zip(sae.cfg.matryoshka_widths, fvu_levels)})
        fire_count = codes.fire_count
        return TrainOutput(
            reconstruction + aux_coefficient * aux,
            sse_levels[-1].detach(),
            centred_ss,
            codes.l0_sum,
            fire_count > 0,
            fire_count,
            terms,
            {"min_kept": codes.min_kept},
        )

    def step_options(self, tcfg, step: int, d_in: int) -> dict:
        opts = self.options(tcfg)
        return super().step_options(tcfg, step, d_in) | {"loss": opts.loss, "group_weights": opts.group_weights}

    def option_summary(self, tcfg) -> str:
        opts = self.options(tcfg)
        return f"k={opts.k}, groups={'/'.join(f'{f:g}' for f in opts.group_fractions)}, loss={opts.loss}"

    def saelens_metadata(self, cfg) -> dict:
        # what SAELens' MatryoshkaBatchTopKTrainingSAE records when it saves its inference (jumprelu) form
        return {
            "training_architecture": "matryoshka_batchtopk",
            "training_architecture_details": {"k": cfg.k, "matryoshka_widths": list(cfg.matryoshka_widths)},
        }


register_architecture("matryoshka", Matryoshka)

"""mean_direction_features: latents that encode the activation mean rather than features -- measured on
activations (an SAE section of a report), or guessed from the weights alone (the dictionary stage)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import MEAN_DIRECTION, Flag, f3, flag, rounded


@dataclass
class Options:
    mean_direction_min_frequency: float = option(0.5, "a latent firing on ≥ this fraction of tokens ...")
    mean_direction_min_cos: float = option(0.5, "... with |cos(decoder row, activation mean μ)| ≥ this")
    # when the cone of the reconstructions minus b_dec is material (the codes carry an offset; without a cone
    # c_i = x/‖M‖² is noise), the latents with a large cone share and the fewest that carry cone_cover of it
    mean_direction_min_cone_share: float = option(
        0.1, "or, when x̂ − b_dec has a cone, latents with cone share c_i ≥ this ..."
    )
    cone_cover: float = option(0.5, "... and the fewest top-c_i latents that together carry this of the cone")
    cone_min_anisotropy: float = option(
        0.1, "a cone is material when the measured A of x̂ − b_dec is ≥ this (also amplification_inconsistency)"
    )


@dataclass
class DictionaryOptions:
    dictionary_min_cos: float = option(0.9, "weights alone: decoder rows with |cos(u_i, b_dec or ū)| ≥ this")


@flag(
    MEAN_DIRECTION,
    stage="sae",
    reads=("firing_frequency", "cos_decoder_mean", "cone_shares", "amplification", "d_sae", "name"),
    options=Options,
    bands={
        "error": "the top latent fires on ≥ 90 % of tokens with |cos| ≥ 0.9",
        "warning": "otherwise",
    },
    when="latents firing on ≥ 50 % of tokens with \\|cos(u_i, μ)\\| ≥ 0.5; or, when x̂ − b_dec has a cone (A ≥ 0.1), "
    "latents with c_i ≥ 0.1 plus the fewest top-c_i latents that make 50 % of the cone",
    order=10,
)
def mean_direction_features(q: dict[str, Any], t: Any) -> Flag | None:
    import torch

    sae = q["sae"]
    name = str(sae.get("name") or "sae")
    freq = torch.tensor(sae["firing_frequency"], dtype=torch.float64)
    cos = torch.tensor(sae["cos_decoder_mean"], dtype=torch.float64)
    shares = sae.get("cone_shares")
    shares_t = torch.tensor(shares, dtype=torch.float64) if shares is not None else None
    a_recon = (sae.get("amplification") or {}).get("measured_recon_minus_b_dec")
    d_sae = int(sae["d_sae"])
    by_alignment = (freq >= t.mean_direction_min_frequency) & (cos.abs() >= t.mean_direction_min_cos)
    cone_material = a_recon is not None and a_recon >= t.cone_min_anisotropy and shares_t is not None
    by_share = torch.zeros_like(by_alignment)
    n_cover = None
    if cone_material:
        by_share = shares_t >= t.mean_direction_min_cone_share
        ranked = shares_t.argsort(descending=True)
        n_cover = min(int((shares_t[ranked].cumsum(0) < t.cone_cover).sum()) + 1, d_sae)
        by_share[ranked[:n_cover]] = True
    guilty = (by_alignment | by_share).nonzero().flatten()
    if not guilty.numel():
        return None
    # most guilty first: largest cone share (when the cone is material), then largest firing × |cos|
    score = freq * cos.abs() + (shares_t if cone_material else 0.0)
    order = guilty[score[guilty].argsort(descending=True)].tolist()
    top = order[0]
    n_guilty = len(order)
    share_sum = float(shares_t[guilty].sum()) if shares_t is not None else None
    smeared = f"; the top {n_cover} by cone share make {100 * t.cone_cover:.0f}% of it" if n_cover else ""
    return Flag(
        MEAN_DIRECTION,
        "error" if float(freq[top]) >= 0.9 and abs(float(cos[top])) >= 0.9 else "warning",
        {
            "n_latents": n_guilty,
            "n_by_alignment": int(by_alignment.sum()),
            "n_by_cone_share": int(by_share.sum()),
            "n_latents_for_cone_cover": n_cover,
            "top_latent": top,
            "top_firing_frequency": rounded(freq[top]),
            "top_cos_decoder_mean": rounded(cos[top]),
            "top_cone_share": rounded(shares_t[top]) if shares_t is not None else None,
            "cone_share_of_flagged": rounded(share_sum),
            "anisotropy_recon_minus_b_dec": rounded(a_recon),
        },
        "These latents encode the activation mean rather than features: initialise b_dec to the activation "
        'mean (b_dec_init = "mean", the saegeo trainer\'s default) or centre the activations, and retrain.',
        summary=(
            f"{n_guilty} latent(s) carry the mean direction (cone of x̂ − b_dec: A = {f3(a_recon)}{smeared}); "
            f"latent {top} fires on {100 * float(freq[top]):.0f}% of tokens with cos(decoder, μ) = "
            f"{float(cos[top]):+.2f}" + (f", cone share {float(shares_t[top]):.2f}" if shares_t is not None else "")
        ),
        latents=order[: t.max_latents],
        subject=name,
    )


@flag(
    MEAN_DIRECTION,
    stage="dictionary",
    label="(dictionary only)",
    reads=("W_dec", "b_dec", "direction_norms"),
    options=DictionaryOptions,
    bands={"warning": "any such row"},
    when="decoder rows with \\|cos\\| ≥ 0.9 to b_dec (or to ū when b_dec is zero)",
    order=50,
    superseded_by_activations=True,
)
def mean_direction_from_weights(q: dict[str, Any], t: Any) -> Flag | None:
    """Latents whose unit decoder row u_i has |cos(u_i, b_dec)| ≥ dictionary_min_cos, or, when b_dec is zero/absent,
    cos(u_i, ū) ≥ it (ū = mean unit decoder row). Blockwise (``row_cosines``, ``unit_row_blocks``): no d_sae²
    matrix and no float64 copy of W_dec. ``direction_norms`` (‖w_i‖, float64, 0 for rows to leave out) saves a
    pass; such rows get cos 0."""
    import torch

    from saegeo.geometry.dictionary import row_cosines, row_norms, unit_row_blocks

    w, b_dec, block_rows = q["W_dec"].detach(), q.get("b_dec"), q.get("block_rows", 4096)
    norms = q.get("direction_norms")
    norms = row_norms(w, block_rows=block_rows) if norms is None else norms.to(torch.float64)
    use_b = b_dec is not None and float(b_dec.detach().to(torch.float64).norm()) > 0
    if use_b:
        direction = b_dec.detach().to(torch.float64)
    else:
        direction = torch.zeros(w.shape[1], dtype=torch.float64)
        for block in unit_row_blocks(w, norms, block_rows=block_rows, dtype=torch.float64):
            direction += block.sum(0)
    dnorm = float(direction.norm())
    if dnorm == 0:
        return None
    cos = row_cosines(w, direction, block_rows=block_rows)
    cos[norms == 0] = 0.0
    guilty = (cos.abs() >= t.dictionary_min_cos).nonzero().flatten()
    if not guilty.numel():
        return None
    order = guilty[cos[guilty].abs().argsort(descending=True)].tolist()
    ref = "b_dec" if use_b else "the dictionary's mean direction ū"
    return Flag(
        MEAN_DIRECTION,
        "warning",
        {
            "n_latents": len(order),
            "top_latent": order[0],
            "top_abs_cos": rounded(cos[order[0]].abs()),
            "reference_norm": rounded(dnorm),
            "d_sae": int(w.shape[0]),
        },
        "Latents parallel to b_dec (or to the mean decoder direction) usually encode the activation offset: "
        "check them against activations (saegeo check --acts) before interpreting them as features.",
        summary=f"{len(order)} decoder row(s) with |cos| ≥ {t.dictionary_min_cos:g} to {ref}",
        latents=order[: t.max_latents],
        subject=q.get("subject", "dictionary"),
    )

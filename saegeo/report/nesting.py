"""The report's figures per nesting level of a Matryoshka SAE (SAEConfig.matryoshka_widths w_1 < … < w_G): level ℓ
is the SAE cut to its first w_ℓ latents, x̂_ℓ = b_dec + Σ_{i < w_ℓ} a_i W_dec,i, as the prefix was trained to
reconstruct. In the report's one pass (`PrefixSums`, fed the codes and rows `SAEMetrics` already has), then from the
full SAE's read-outs (`nesting_levels`):

    fve            1 − Σ‖x − x̂_ℓ‖² / Σ‖x − x̄‖²
    mean_l0        Σ_{i < w_ℓ} P(a_i > 0)                  (the prefix's codes per row)
    dead_share     #{i < w_ℓ never fired} / w_ℓ
    a_dict         A_dict of the unit rows u_0 … u_{w_ℓ − 1} (dictionary_geometry)
    cone_share     Σ_{i < w_ℓ} c_i, c_i the full SAE's cone shares (the part of ‖M‖² the prefix carries)
    law_textbook   the K·A_dict law at the prefix's K = mean_l0 and A_dict: k = K·A_dict/2, A = k/(1 + k)
    measured_recon_minus_b_dec   A of x̂_ℓ − b_dec, measured (mean pairwise cosine of the rows' unit vectors)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import UnitMean
from saegeo.geometry.amplification import textbook_prediction
from saegeo.geometry.dictionary import dictionary_geometry, row_norms


class _Feed:
    """One of SAEMetrics' observer lists takes this: its `add` is the collector's method for that list."""

    def __init__(self, add: Callable[..., None]) -> None:
        self.add = add


class PrefixSums:
    """Σ‖x − x̂_ℓ‖² and the unit-vector sums of x̂_ℓ − b_dec of every level, streamed: `codes` goes into
    SAEMetrics.code_observers (each group's folded codes a_i·‖W_dec,i‖, rows in order), `rows` into its row_observers
    (each chunk of rows, after its codes). x̂_ℓ − b_dec = Σ_{i < w_ℓ} (a_i·‖W_dec,i‖)·u_i, a level at a time."""

    def __init__(self, widths: list[int], W_dec: Float[Tensor, "N d"], b_dec: Float[Tensor, " d"], device: Any):
        norms = row_norms(W_dec.detach()).to(device, torch.float32)
        self.unit_rows = W_dec.detach().to(device, torch.float32) / torch.where(norms > 0, norms, 1.0)[:, None]
        self.b_dec = b_dec.detach().to(device, torch.float32)
        self.widths = list(widths)
        self.sse = [0.0] * len(widths)
        self.recon_unit = [UnitMean(W_dec.shape[1]) for _ in widths]
        self.pending: list[tuple[Tensor, Tensor, Tensor]] = []  # codes of rows not summed yet (global row numbers)
        self.code_row = self.row = 0  # rows whose codes came in; rows summed
        self.codes, self.rows = _Feed(self._add_codes), _Feed(self._add_rows)

    def _add_codes(self, coo: Any) -> None:
        self.pending.append((coo.rows + self.code_row, coo.cols, coo.values))
        self.code_row += int(coo.n_rows)

    def _add_rows(self, x: Float[Tensor, "c d"], _recon: Tensor) -> None:
        c, lo = x.shape[0], self.row
        rows, cols, values = (torch.cat(t) for t in zip(*self.pending))
        here = rows < lo + c  # the COO is row-major: these are the first entries
        self.pending = [(rows[~here], cols[~here], values[~here])]
        rows, cols, values = (t[here].to(x.device) for t in (rows, cols, values))
        error = (x - self.b_dec).double()  # x − b_dec − (x̂_ℓ − b_dec), level after level
        recon = torch.zeros_like(error)
        start = 0
        for level, width in enumerate(self.widths):
            new = (cols >= start) & (cols < width)
            part = self.unit_rows[cols[new]] * values[new, None].to(self.unit_rows.dtype)
            recon.index_add_(0, rows[new] - lo, part.double())
            self.sse[level] += float((error - recon).square().sum())
            self.recon_unit[level].add(recon)
            start = width
        self.row += c


def nesting_levels(
    sums: PrefixSums,
    centred_ss: float,
    firing_frequency: Float[Tensor, " N"],
    cone_shares: list[float] | None,
    W_dec: Float[Tensor, "N d"],
) -> list[dict[str, Any]]:
    """One record per level (see the module docstring) from the pass's sums and the full SAE's read-outs."""
    levels = []
    shares = None if cone_shares is None else torch.tensor(cone_shares, dtype=torch.float64)
    for level, width in enumerate(sums.widths):
        try:
            a_dict = dictionary_geometry(W_dec[:width]).a_dict
        except BadInputError:  # every row of the prefix is zero
            a_dict = None
        mean_l0 = float(firing_frequency[:width].sum())
        levels.append(
            {
                "width": width,
                "fve": 1 - sums.sse[level] / centred_ss if centred_ss > 0 else None,
                "mean_l0": mean_l0,
                "dead_share": float((firing_frequency[:width] == 0).double().mean()),
                "a_dict": a_dict,
                "cone_share": None if shares is None else float(shares[:width].sum()),
                "law_textbook": None if a_dict is None else textbook_prediction(mean_l0, a_dict),
                "measured_recon_minus_b_dec": sums.recon_unit[level].anisotropy(),
            }
        )
    return levels

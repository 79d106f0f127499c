"""How well a learned dictionary recovers the true one: max cosines both ways and a one-to-one matching.

For unit true rows u_i (i ≤ N) and unit learned rows w_j (j ≤ M), cos_ij = u_i·w_j:
- mean max cosine of the truth:    (1/N) Σ_i max_j cos_ij  (is every true feature found?)
- mean max cosine of the learned:  (1/M) Σ_j max_i cos_ij  (is every learned latent real?)
- recovered fraction: #{i : max_j cos_ij ≥ threshold}/N (threshold 0.9 by convention)
- one-to-one matching: the permutation maximising Σ cos over matched pairs (Hungarian algorithm,
  scipy.optimize.linear_sum_assignment), so one latent cannot count for two features.
Cosines are computed in row blocks; only the matching holds the N×M matrix (float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError

_BLOCK_ROWS = 4096
MAX_MATCH_ENTRIES = 200_000_000  # the matching's N×M float32 matrix: 800 MB at this limit


def _unit_rows(rows, name: str) -> Float[Tensor, "n d"]:
    # a SyntheticTruth, or an SAE object with a (d_sae, d) W_dec, stands for its dictionary
    rows = getattr(rows, "dictionary", getattr(rows, "W_dec", rows))
    rows = torch.as_tensor(np.asarray(rows) if not isinstance(rows, Tensor) else rows).detach().float()
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise BadInputError(f"{name} must be a non-empty 2-D (rows, d) dictionary, got shape {tuple(rows.shape)}")
    if not torch.isfinite(rows).all():
        bad = int((~torch.isfinite(rows)).any(1).nonzero()[0])
        raise BadInputError(f"{name} row {bad} is not finite")
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)  # a zero row has cosine 0 with everything


def max_cosines(
    a: Float[Tensor, "Na d"], b: Float[Tensor, "Nb d"], *, absolute: bool = False, block_rows: int = _BLOCK_ROWS
) -> tuple[Float[Tensor, " Na"], Int[Tensor, " Na"], Float[Tensor, " Nb"]]:
    """max_j cos(a_i, b_j) with its argmax j for every row of a, and max_i cos(a_i, b_j) for every row of b.

    Rows are normalised here. ``absolute=True`` uses |cos| (sign-free dictionaries). Blockwise: memory
    block_rows × Nb.
    """
    a, b = _unit_rows(a, "first dictionary"), _unit_rows(b, "second dictionary")
    if a.shape[1] != b.shape[1]:
        raise BadInputError(f"dictionaries live in different spaces: d = {a.shape[1]} vs {b.shape[1]}")
    best_a = torch.empty(a.shape[0])
    arg_a = torch.empty(a.shape[0], dtype=torch.long)
    best_b = torch.full((b.shape[0],), -torch.inf)
    for start in range(0, a.shape[0], block_rows):
        cos = a[start : start + block_rows] @ b.T
        if absolute:
            cos = cos.abs()
        best_a[start : start + block_rows], arg_a[start : start + block_rows] = cos.max(dim=1)
        best_b = torch.maximum(best_b, cos.max(dim=0).values)
    return best_a, arg_a, best_b


@dataclass
class RecoveryReport:
    """Recovery of N true features by M learned latents (see the module docstring for the formulas)."""

    n_true: int
    n_learned: int
    threshold: float
    mean_max_cos_true: float
    mean_max_cos_learned: float
    frac_recovered: float
    max_cos_true: Float[Tensor, " N"]  # best cosine of each true feature
    best_learned: Int[Tensor, " N"]  # the latent achieving it
    matched_true: Int[Tensor, " P"] | None = None  # one-to-one pairs, P = min(N, M)
    matched_learned: Int[Tensor, " P"] | None = None
    matched_cos: Float[Tensor, " P"] | None = None

    @property
    def mean_matched_cos(self) -> float:
        """Mean cosine over the one-to-one pairs (nan when no matching was computed)."""
        return float(self.matched_cos.mean()) if self.matched_cos is not None else float("nan")

    @property
    def frac_matched_recovered(self) -> float:
        """Fraction of true features whose one-to-one partner has cos ≥ threshold."""
        if self.matched_cos is None:
            return float("nan")
        return float((self.matched_cos >= self.threshold).sum()) / self.n_true

    def summary(self) -> dict[str, float]:
        return {
            "n_true": self.n_true,
            "n_learned": self.n_learned,
            "mean_max_cos_true": self.mean_max_cos_true,
            "mean_max_cos_learned": self.mean_max_cos_learned,
            f"frac_recovered@{self.threshold:g}": self.frac_recovered,
            "mean_matched_cos": self.mean_matched_cos,
            f"frac_matched_recovered@{self.threshold:g}": self.frac_matched_recovered,
        }


def recovery(
    true_dictionary: Float[Tensor, "N d"],
    learned_dictionary: Float[Tensor, "M d"],
    *,
    threshold: float = 0.9,
    match: bool = True,
    absolute: bool = False,
) -> RecoveryReport:
    """Score ``learned_dictionary`` (e.g. an SAE's W_dec, (d_sae, d)) against the true one (N, d).

    Either argument may also be an object holding its rows: a ``SyntheticTruth`` (``.dictionary``) or an
    SAE (``.W_dec``).

    Max cosines both ways, the fraction of true features with a latent at cos ≥ ``threshold``, and
    (``match=True``) the one-to-one matching maximising the summed cosine.
    """
    best_true, arg_true, best_learned = max_cosines(true_dictionary, learned_dictionary, absolute=absolute)
    report = RecoveryReport(
        n_true=best_true.numel(),
        n_learned=best_learned.numel(),
        threshold=threshold,
        mean_max_cos_true=float(best_true.double().mean()),
        mean_max_cos_learned=float(best_learned.double().mean()),
        frac_recovered=float((best_true >= threshold).double().mean()),
        max_cos_true=best_true,
        best_learned=arg_true,
    )
    if match:
        from scipy.optimize import linear_sum_assignment

        n, m = report.n_true, report.n_learned
        if n * m > MAX_MATCH_ENTRIES:
            raise BadInputError(
                f"one-to-one matching of {n} × {m} needs the full cosine matrix ({4 * n * m / 1e9:.1f} GB); "
                "pass match=False and use the max-cosine scores"
            )
        u, w = _unit_rows(true_dictionary, "true dictionary"), _unit_rows(learned_dictionary, "learned dictionary")
        cos = np.empty((n, m), dtype=np.float32)
        for start in range(0, n, _BLOCK_ROWS):
            block = u[start : start + _BLOCK_ROWS] @ w.T
            cos[start : start + _BLOCK_ROWS] = (block.abs() if absolute else block).numpy()
        rows, cols = linear_sum_assignment(cos, maximize=True)
        report.matched_true = torch.from_numpy(rows)
        report.matched_learned = torch.from_numpy(cols)
        report.matched_cos = torch.from_numpy(cos[rows, cols])
    return report

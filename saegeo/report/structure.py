"""An SAE's error and dense-latent structure on activations: in the report's one pass (``PassStructure``) and as
a library call of its own (``sae_structure``, two passes, the co-firing counted on every row).

``PassStructure(d, options)``  the report's part: the dark-matter sums fed every chunk's (x, x̂) as an
    ``SAEMetrics.row_observers`` entry; ``finish(...)`` gives {dark_matter, dense} for the SAE's section, the dense
    latents' co-firing counted on the report's uniform row sample, the position direction (the rows' regression on
    their position, ``CovariateDirection``, fed by the pass) aligned with the pairs' subspace (the pass cannot know the dense latents before
    its end, and a second pass would encode every row again).

``sae_structure(sae, acts, options=StructureOptions()) -> dict``
    pass 1 over the rows: the SAE's codes and error e = x − x̂; the dark-matter sums (saegeo.geometry.dark_matter:
    the share of e and of ‖e‖ linearly predictable from x, held out, with an sd) and every latent's firing count.
    Pass 2, only when dense latents exist: their co-firing counts. Then the antipodal pairs among the dense latents
    (saegeo.geometry.dense), the subspace their axes span, and the squared cosine of the activations' mean μ and
    of their top principal components with it (μ and the covariance come from the dark-matter sums: no third
    accumulator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from saegeo.config import BatchedStreamOptions, check, option
from saegeo.errors import BadInputError
from saegeo.geometry.dark_matter import (
    DEFAULT_FOLD_ROWS,
    DEFAULT_FOLDS,
    DEFAULT_RIDGE,
    DarkMatterAccumulator,
    dark_matter,
)
from saegeo.geometry.dense import (
    CovariateDirection,
    DenseCofiring,
    antipodal_pairs,
    dense_latents,
    pair_subspace,
    subspace_alignment,
)
from saegeo.progress import progress_bar


@dataclass
class StructureOptions(BatchedStreamOptions):
    """What ``sae_structure`` measures and how."""

    dense_rate: float = option(0.1, "a latent firing on at least this share of rows is dense", above=0, high=1)
    max_dense: int = option(256, "at most this many dense latents (the densest) enter the pair search", low=2)
    min_anticos: float = option(0.9, "a dense pair's decoder cosine must be at most minus this", low=0, high=1)
    max_cofire: float = option(
        0.1, "a dense pair fires together on at most this share of the rarer one's rows", low=0, high=1
    )
    top_components: int = option(3, "principal components of the activations aligned with the pairs' subspace", low=0)
    folds: int = option(DEFAULT_FOLDS, "held-out folds of the dark-matter regression", low=2)
    fold_rows: int = option(DEFAULT_FOLD_ROWS, "contiguous rows per fold block", low=1)
    ridge: float = option(DEFAULT_RIDGE, "ridge, relative to tr(C_xx)/d", low=0)
    batch_rows: int = option(1024, "rows encoded per batch", low=1)  # the dense codes of a batch: fewer rows
    max_tokens: int | None = option(None, "stop after this many rows (default: all)", low=1)

    def __post_init__(self) -> None:
        check(self)


class PassStructure:
    """Dark matter and dense-latent structure of one SAE in the report's pass (module docstring)."""

    def __init__(self, d: int, options: StructureOptions) -> None:
        self.options = options
        self.dark = DarkMatterAccumulator(d, n_folds=options.folds, fold_rows=options.fold_rows)

    def add(self, x: torch.Tensor, recon: torch.Tensor) -> None:
        """One chunk of rows in stream order and the SAE's (denormalised) reconstruction of them."""
        self.dark.add(x, x - recon.to(x.dtype))  # float32 rows give float32 products (DarkMatterAccumulator.add)

    def finish(
        self,
        fire_rate: torch.Tensor,
        sample_codes: Any | None,
        W_dec: torch.Tensor,
        W_enc: torch.Tensor | None,
        mean: torch.Tensor,
        components: list[list[float]],
        position: CovariateDirection | None = None,
    ) -> dict[str, Any]:
        """{"dark_matter": R² of the error vector and norm held out, ± sd, and the nonlinear share 1 − R²_vector;
        "dense": the dense latents (rate ≥ dense_rate over the pass), their antipodal pairs (co-firing from the
        ``sample_codes`` COO), the pairs' subspace and the squared cosine of μ, of the top principal
        ``components`` (rows of length d) and of the ``position`` direction (the rows' regression on their
        position, with the variance share it explains: "position_direction") with it}."""
        opts = self.options
        out: dict[str, Any] = {}
        if self.dark.rows_seen >= 2 * opts.folds:
            try:
                dm = dark_matter(self.dark, opts.ridge)
                out["dark_matter"] = {**dm.to_dict(), "nonlinear_share": dm.nonlinear_share}
            except BadInputError as err:
                out["dark_matter"] = {"error": str(err)}
        n_rows = max(1, int(self.dark.rows_seen))
        dense = dense_latents((fire_rate.double() * n_rows).round().long(), n_rows, opts.dense_rate)
        section: dict[str, Any] = {"rate": opts.dense_rate, "n_dense": int(dense.numel()), "latents": dense.tolist()}
        beta, section["position_direction"] = position.result() if position is not None else (None, None)
        dense = dense[: opts.max_dense]
        if dense.numel() < 2 or sample_codes is None or int(sample_codes.n_rows) < 2:
            section.update(pairs=[], subspace={"dim": 0})
            out["dense"] = section
            return out
        cofiring = DenseCofiring(dense)
        cofiring.add_coo(int(sample_codes.n_rows), sample_codes.rows, sample_codes.cols, sample_codes.values)
        pairs = antipodal_pairs(W_dec, cofiring, min_anticos=opts.min_anticos, max_cofire=opts.max_cofire, W_enc=W_enc)
        directions = {"mean": mean}
        for k, v in enumerate(components[: opts.top_components]):
            directions[f"pc{k + 1}"] = torch.tensor(v, dtype=torch.float64)
        if beta is not None:
            directions["position"] = beta
        section.update(
            n_searched=int(dense.numel()),
            cofiring_rows=int(sample_codes.n_rows),
            pairs=[p.to_dict() for p in pairs],
            subspace=subspace_alignment(pair_subspace(W_dec, pairs), directions),
        )
        out["dense"] = section
        return out


def sae_structure(sae: Any, acts: Any, options: StructureOptions | None = None) -> dict[str, Any]:
    """Dark matter and dense-latent structure of ``sae`` on the rows of ``acts`` (module docstring); JSON-safe."""
    from saegeo.activations.sources import open_rows
    from saegeo.sae.model import SAE

    opts = options or StructureOptions(progress=False)
    sae = SAE.load(sae)
    d, n_lat = sae.cfg.d_in, sae.cfg.d_sae
    rows = open_rows(acts, verify=opts.verify, skip_nonfinite=opts.skip_nonfinite)
    if rows.d is not None and rows.d != d:
        raise BadInputError(f"{acts}: activations have d={rows.d} but the SAE reads d={d}")
    acc = DarkMatterAccumulator(d, n_folds=opts.folds, fold_rows=opts.fold_rows)
    fire = torch.zeros(n_lat, dtype=torch.long)

    def batches():
        return progress_bar(
            rows.batches(opts.batch_rows, stop_row=opts.max_tokens)[0], enabled=opts.progress, desc="structure"
        )

    with torch.no_grad():
        for x in batches():
            x = torch.as_tensor(x, dtype=torch.float32)
            codes = sae.encode(x.to(sae.W_enc.dtype))
            x_hat = sae.decode(codes).to(torch.float32)
            acc.add(x.double(), x.double() - x_hat.double())  # float64 products: μ and Σ below come from these sums
            fire += (codes != 0).sum(0)  # signed codes (AbsTopK) fire below 0 too
    n = acc.rows_seen
    if n < 2:
        raise BadInputError(f"{acts}: needs at least 2 rows, got {n}")
    result: dict[str, Any] = {"n_rows": n, "dark_matter": dark_matter(acc, opts.ridge).to_dict()}

    dense = dense_latents(fire, n, opts.dense_rate)
    result["dense"] = {"rate": opts.dense_rate, "n_dense": int(dense.numel()), "latents": dense.tolist()}
    dense = dense[: opts.max_dense]
    if dense.numel() < 2:
        result["dense"].update(pairs=[], subspace={"dim": 0})
        return result
    cofiring = DenseCofiring(dense)
    with torch.no_grad():
        for x in batches():
            cofiring.add(sae.encode(torch.as_tensor(x, dtype=torch.float32).to(sae.W_enc.dtype)))
    W_dec, W_enc = sae.W_dec.detach(), sae.W_enc.detach()
    pairs = antipodal_pairs(W_dec, cofiring, min_anticos=opts.min_anticos, max_cofire=opts.max_cofire, W_enc=W_enc)
    basis = pair_subspace(W_dec, pairs)
    # μ and Σ from the dark-matter sums (shifted by the first batch's mean): Σ = (XᵀX − n x̄x̄ᵀ)/(n − 1)
    total_n = float(acc.n.sum())
    sum_x, xx = acc.sum_x.sum(0), acc.xx.sum(0)
    mean_shifted = sum_x / total_n
    mu = acc.shift_x + mean_shifted
    cov = (xx - total_n * torch.outer(mean_shifted, mean_shifted)) / (total_n - 1)
    directions = {"mean": mu}
    if opts.top_components:
        _, vectors = torch.linalg.eigh(cov)
        for k in range(min(opts.top_components, d)):
            directions[f"pc{k + 1}"] = vectors[:, -1 - k]
    result["dense"].update(
        n_searched=int(dense.numel()),
        pairs=[p.to_dict() for p in pairs],
        subspace=subspace_alignment(basis, directions),
    )
    return result

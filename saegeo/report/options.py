"""The options of the report's commands (report, check, latents, sweep) and the flags' thresholds.

Torch-free on purpose: the command line builds its flags from these dataclasses and checks a value a user gave
before any model or tensor library is imported (benchmarks/startup_bench.py). The code that uses them lives
beside: report.py, check.py, latents.py, sweep.py, flags.py (which re-export them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from saegeo.config import (
    DEFAULT_BLOCK_ROWS,
    ZERO_ROW_REL_NORM,
    BatchedStreamOptions,
    DeviceOption,
    StreamOptions,
    check,
    option,
)
from saegeo.errors import BadInputError

SEVERITIES = ("info", "warning", "error")


@dataclass
class FlagThresholds:
    """Thresholds of every flag. Defaults are conservative: a clean space or a healthy SAE raises nothing."""

    # mean-direction features: a latent that fires on ≥ this fraction of tokens ...
    mean_direction_min_frequency: float = 0.5
    # ... with |cos(decoder row, activation mean μ)| ≥ this;
    mean_direction_min_cos: float = 0.5
    # or, when the cone of the reconstructions minus b_dec is material (their measured A ≥
    # cone_min_anisotropy: the codes carry an offset; without a cone c_i = x/‖M‖² is noise), the latents
    # with cone share c_i ≥ mean_direction_min_cone_share and the fewest top-c_i latents that together
    # carry cone_cover of the cone (an offset smeared over many latents).
    mean_direction_min_cone_share: float = 0.1
    cone_min_anisotropy: float = 0.1
    cone_cover: float = 0.5
    # offset not absorbed: ‖b_dec − μ‖/‖μ‖ ≥ this (warning; error at offset_error_distance) ...
    offset_min_distance: float = 0.5
    offset_error_distance: float = 0.9
    # ... when the mean matters at all: outlier severity γ = ‖μ‖/√tr Σ ≥ this.
    offset_min_outlier_severity: float = 0.5
    # inputs that look whitened (docs/design.md "Flags"; calibrated in tests/report/test_flags.py): in sample, mean share
    # ‖μ‖²/tr S ≤ whitened_max_mean_share, λ_max ≤ whitened_max_edge_ratio × the MP upper edge and a spectrum
    # narrower than sampling noise allows (λ_max/λ_min ≤ 1 + narrow_fraction × (the MP edge ratio − 1)): Σ̂ = I
    # exactly. With a transform fitted on other rows, Σ̂ ≈ I plus that fit's error: mean share ≤
    # whitened_oos_max_mean_share, λ_max between whitened_max_edge_ratio and whitened_oos_max_edge_ratio × the MP
    # edge and variance per direction tr Σ/d within whitened_unit_variance_tol of 1 (a fit on m rows leaves
    # ≈ m/(m − d)). Clean iid N(0, 1) rows (λ_max at the edge, a spread as wide as MP) are neither.
    whitened_max_mean_share: float = 1e-3
    whitened_max_edge_ratio: float = 1.1
    whitened_unit_variance_tol: float = 0.5
    whitened_narrow_fraction: float = 0.5
    whitened_oos_max_mean_share: float = 1e-2
    whitened_oos_max_edge_ratio: float = 10.0
    # whitening in a config: the noise amplification √(λ_max/λ_min) the summary calls huge
    whitening_max_amplification: float = 100.0
    # wrong null: the sign-aware null exceeds the assumed baseline by ≥ this, and A is ≥ wrong_null_min_z
    # null-sds above the baseline (so reading against the baseline would call it a cone)
    wrong_null_min_gap: float = 0.05
    wrong_null_min_z: float = 3.0
    # amplification inconsistency: the measured A of x̂ − b_dec lies outside the per-latent law's interval
    # [A_het (moment form, exact E[x·y]/E‖x‖² of independent codes), A_het_mean_cosine (their mean cosine, from the
    # row sample)] by more than amplification_z · √(sd_measured² + sd_law²) + amplification_model_error · law, law
    # the nearer end: sampling error (U-statistic sds; tokens of one sequence are not independent, so these are low
    # bounds) plus the stated model error, the departure from independent latents not called a failure (TopK's
    # fixed L0 alone makes codes dependent). The interval, not one form: with dependent codes the norm fluctuations
    # that separate the two forms are themselves unknown (demo b_dec := 0: measured 0.267, forms 0.282 and 0.313);
    amplification_z: float = 3.0
    amplification_model_error: float = 0.1
    # the flag is a warning only where there is a cone to explain: measured A or the law's upper end ≥
    # cone_min_anisotropy; below it (demo b_dec := mean: measured 0.0065, law 0.0027–0.0038) it is info
    # the cause named is co-firing when |cofiring_share| (the co-firing part of E‖x̂ − b_dec‖²) ≥ this, else rates
    amplification_cofiring_share: float = 0.05
    # dead latents (no fire over the pass): warning above this fraction, error above dead_error_fraction
    dead_max_fraction: float = 0.01
    dead_error_fraction: float = 0.2
    # dense latents: fire on > dense_frequency of tokens; warning above dense_max_fraction of latents
    dense_frequency: float = 0.5
    dense_max_fraction: float = 0.0
    # bad rows: zero-norm or skipped non-finite rows above this fraction of rows
    bad_rows_max_fraction: float = 0.0
    # dictionary-only: |cos(u_i, b_dec or ū)| ≥ this
    dictionary_min_cos: float = 0.9
    # offset-dominated cone: A is ≥ offset_cone_min_z null-sds (null_z) and ≥ offset_cone_min_excess above the
    # sign-aware null, the mean explains ≥ offset_cone_min_explained of A (1 − A_centred/A on the row sample; without
    # a sample (‖μ‖/E‖x‖)²/A), and the mean is material: share ‖μ‖²/tr S ≥ offset_cone_min_mean_share
    offset_cone_min_z: float = 3.0
    offset_cone_min_excess: float = 0.05
    offset_cone_min_explained: float = 0.5
    offset_cone_min_mean_share: float = 0.05
    # anisotropy invisible to A: A within its null band (|null_z| < invisible_max_abs_z, or |A − null − bias| <
    # invisible_max_excess) but the centred spectrum is concentrated: erank/noise erank < invisible_max_erank_ratio,
    # or top-1 ≥ max(invisible_min_top1_over_uniform/d, invisible_min_top1)
    invisible_max_abs_z: float = 3.0
    invisible_max_excess: float = 0.02
    invisible_max_erank_ratio: float = 0.5
    invisible_min_top1_over_uniform: float = 10.0
    invisible_min_top1: float = 0.25
    # massive activations: rows with ‖x‖ > massive_row_ratio × the median norm carrying ≥ massive_min_share of
    # Σ‖x‖², or a coordinate whose RMS is > massive_coordinate_ratio × the mean coordinate RMS
    massive_row_ratio: float = 10.0
    massive_min_share: float = 0.25
    massive_coordinate_ratio: float = 20.0
    # ... or the first position of each window (BOS / attention sinks; measured in the artifact pass over a store)
    # carrying ≥ massive_first_position_share of tr Σ while it is at most massive_first_position_rows of the rows
    massive_first_position_share: float = 0.5
    massive_first_position_rows: float = 0.1
    # mixed populations (on the row sample): the 2-means split of the PC1 projections explains ≥ mixed_min_split_share
    # of their variance (Gaussian: 2/π = 0.64, uniform: 0.75) with ≥ mixed_min_cluster_fraction of rows on the
    # smaller side, or 2-means on the rows (smaller cluster also ≥ mixed_min_cluster_fraction: a few massive rows
    # are massive_activations) leaves ≥ mixed_min_kmeans_share of the centred sum of squares between
    # clusters and ≥ mixed_min_kmeans_excess × what one Gaussian with this spectrum gives ((2/π)·top-1)
    mixed_min_split_share: float = 0.8
    mixed_min_cluster_fraction: float = 0.05
    mixed_min_kmeans_share: float = 0.5
    mixed_min_kmeans_excess: float = 1.3
    # how many guilty latents a flag lists
    max_latents: int = 20
    # artifact direction: a top principal direction with |corr| > this with log token frequency, position or ‖x‖
    artifact_min_abs_corr: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __post_init__(self) -> None:
        check(self)


@dataclass
class MatchOptions:
    """Thresholds of `activations_match_flags`."""

    max_rows: int = option(65536, "rows read (from the start) for the scale, offset and special-row measures", low=1)
    fve_rows: int = option(4096, "rows re-encoded to test the alternative scale", low=0)
    scale_error_ratio: float = option(
        2.0, "E‖x‖ vs the SAE's recorded norm off by more than this factor: error", above=1
    )
    scale_hint_ratio: float = option(
        3.0, "‖μ‖/‖b_dec‖ (no recorded norm) off by more than this factor: test x/ratio against x", above=1
    )
    scale_fve_gain: float = option(
        0.2, "the FVE of x/ratio above that of x by more than this: a scale error (b_dec alone is no evidence)", low=0
    )
    fit_accept_fve: float = option(
        0.65,
        "names missing or disagreeing: the SAE's FVE on the sampled rows at or above this accepts the pair, below "
        "fit_refuse_fve refuses it, between is a warning (docs/design.md 'Do an SAE and a store belong together')",
        low=-1e9,
        high=1,
    )
    fit_refuse_fve: float = option(0.0, "see fit_accept_fve", low=-1e9, high=1)
    massive_row_factor: float = option(10.0, "rows with ‖x‖ > this × median ‖x‖ are massive-activation rows", above=1)
    centred_warn: float = option(
        0.05, "E|x·1|/(√d E‖x‖) above this where the SAE expects centred writing weights", low=0
    )
    assume_same_model: bool = option(False, "skip the model comparison (said in the notes)")

    def __post_init__(self) -> None:
        check(self)
        if self.fit_refuse_fve > self.fit_accept_fve:
            raise BadInputError(
                f"fit_refuse_fve {self.fit_refuse_fve:g} is above fit_accept_fve {self.fit_accept_fve:g}"
            )


@dataclass
class CheckOptions(StreamOptions, DeviceOption):
    """Thresholds of the dictionary-only checks (the mean-direction one is FlagThresholds.dictionary_min_cos)."""

    duplicate_cos: float = option(0.99, "pairs with cos(w_i, w_j) above this are near-duplicates", low=-1, high=1)
    zero_row_rel_norm: float = option(ZERO_ROW_REL_NORM, "‖w_i‖ ≤ this × median ‖w‖ counts as a zero row", low=0)
    misaligned_cos: float = option(
        0.0, "latents with cos(encoder column, decoder row) below this are misaligned", low=-1, high=1
    )
    misaligned_warn_fraction: float = option(
        0.01, "above this fraction of latents the flag is a warning, else info", low=0, high=1
    )
    duplicate_error_fraction: float = option(
        0.01, "latents in duplicate pairs above this fraction: error", low=0, high=1
    )
    block_rows: int = option(
        DEFAULT_BLOCK_ROWS, "rows per block of the duplicate search (memory ~ block² floats)", low=1
    )
    max_pairs_listed: int = option(50, "near-duplicate pairs listed in the result", low=0)
    nearest_exact_rows: int = option(
        16384, "nearest-neighbour cosine of every latent up to this many latents (d_sae²·d work), else sampled", low=2
    )
    nearest_sample: int = option(
        2048, "latents drawn (with replacement) for the nearest-neighbour cosines above nearest_exact_rows", low=2
    )
    assume_same_model: bool = option(
        False, "with --acts: take the store's model as the SAE's, whatever names and fingerprints say"
    )
    thresholds: FlagThresholds = option(factory=FlagThresholds, help="of the flags", flatten=True)
    match: MatchOptions = option(factory=MatchOptions, help="with activations: activations_match_flags")

    def __post_init__(self) -> None:
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The latent table's nearest neighbour of every latent up to this width: 65,536 × 2,304 is 2·10¹³ flops (minutes
# on 2 cores, about what encoding 16k rows costs at that width); 262,144 would be 3·10¹⁴ (about an hour on 2 cores),
# so above it only the carded latents get neighbours and the table says so.
NEIGHBOUR_TABLE_MAX = 65_536
NEIGHBOUR_TABLE_HELP = (
    "the latent table's nearest neighbour of every latent (N²·d work) up to this many latents; above it only the "
    "carded latents get neighbours"
)


@dataclass
class ReportOptions(BatchedStreamOptions, DeviceOption):
    """How the pass runs and how its numbers are read. All have sane defaults."""

    max_tokens: int | None = option(None, "stop after this many rows (None: all)", low=1)
    cosine_sample_rows: int = option(
        2048, "reservoir of rows for the pairwise-cosine histogram (k(k−1)/2 pairs)", low=0
    )
    histogram_bins: int = option(100, "bins of the pairwise-cosine histogram", low=1, high=10**7)
    assumed_null: float = option(
        0.0, "the baseline a reader compares A with unless told (wrong-null flag)", low=-1, high=1
    )
    seed: int = option(0, "seeds the cosine reservoir", low=0)
    artifact_components: int = option(
        3, "top principal directions in the artifact test (stores only; 0: skip it)", low=0
    )
    latent_cards: bool = option(
        True, "the per-latent table and the cards (top contexts, histogram, neighbours) of the latents flags name"
    )
    latents: tuple[int, ...] = option((), "cards for these latents too (ids, checked against every SAE)", low=0)
    latent_contexts: int = option(20, "top activating contexts kept per latent", low=0, high=10_000)
    context_tokens: int = option(16, "preceding tokens of the same window shown with each context", low=0, high=4096)
    neighbour_table_max: int = option(NEIGHBOUR_TABLE_MAX, NEIGHBOUR_TABLE_HELP, low=0)
    dark_matter: bool = option(
        False,
        "per SAE: the error's linearly predictable share (5-fold ridge sums: 2·d² float64 multiply-adds a row, "
        "their cost in benchmarks/README.md) and the dense latents' antipodal pairs",
    )
    thresholds: FlagThresholds = option(
        factory=FlagThresholds, help="of every flag ([report.thresholds])", flatten=True
    )

    def __post_init__(self) -> None:
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# the latent table's numeric columns (saegeo.report.latent_cards.TABLE_COLUMNS, in its order), which --by ranks
LATENT_SUMMARY_COLUMNS = ("rate", "mean_activation", "mean_sq_activation", "cos_mu", "cone_share", "decoder_norm")
LATENT_RELATION_COLUMNS = ("nn_cos", "norm_corr", "position_corr", "log_frequency_corr")
ByColumn = Literal[LATENT_SUMMARY_COLUMNS + LATENT_RELATION_COLUMNS]  # type: ignore[valid-type]


@dataclass
class LatentsOptions(BatchedStreamOptions, DeviceOption):
    """`saegeo latents SAE --acts STORE`: which latents get cards and how the pass runs."""

    latents: tuple[int, ...] = option((), "the latents to show (ids; default: the top ones by --by)", low=0)
    top: int = option(10, "without --latents: this many latents with the largest --by", low=1, high=100_000)
    by: ByColumn = option("rate", "the column --top ranks by (largest first)")
    contexts: int = option(20, "top activating contexts per latent", low=0, high=10_000)
    context_tokens: int = option(16, "preceding tokens of the same window shown with each context", low=0, high=4096)
    neighbours: bool = option(True, "nearest latents by decoder cosine (N²·d work: --no-neighbours skips it)")
    neighbour_table_max: int = option(NEIGHBOUR_TABLE_MAX, NEIGHBOUR_TABLE_HELP, low=0)
    max_tokens: int | None = option(None, "stop after this many rows (None: all)", low=1)
    dense_frequency: float = option(0.5, "a latent firing on more than this fraction of tokens is dense", low=0, high=1)

    def __post_init__(self) -> None:
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepOptions(BatchedStreamOptions):
    """`saegeo sweep`: what each store's row measures; with ``model``, which hooks are cached first and where."""

    model: str | None = option(None, "cache first: model to run (as in `saegeo cache --model`)")
    hooks: str = option(
        "all-resid",
        "with --model: 'all-resid' (blocks.0.hook_resid_pre + every blocks.L.hook_resid_post) or a comma list",
    )
    corpus: str = option("default", "with --model: corpus (as in `saegeo cache`)")
    context: int = option(128, "with --model: tokens per window", low=2)
    max_tokens: int | None = option(None, "tokens per layer (with --model: tokens cached)", low=1)
    cache_dir: str = option("artifacts/acts/sweep", "with --model: where the stores go")
    max_types: int | None = option(None, "keep the most frequent V token types, pool the rest (default: all)", low=1)
    artifact_components: int = option(
        3, "top principal directions in the artifact test (0: skip it)", low=0, old_flags=("--artifact-k",)
    )
    out: str | None = option(None, "directory for summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html")
    json: str | None = option(None, "write the sweep JSON here")
    overwrite: bool = option(False, "replace output files that exist already (refused otherwise)")

    def __post_init__(self) -> None:
        check(self)

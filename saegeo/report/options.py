"""The options of the report's commands (report, check, latents, sweep) and the flags' thresholds.

Torch-free on purpose: the command line builds its flags from these dataclasses and checks a value a user gave
before any model or tensor library is imported (benchmarks/startup_bench.py). The code that uses them lives
beside: geometry_report.py, dictionary_check.py, latent_cards.py, layer_sweep.py; the thresholds come from flags/.
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
from saegeo.report.flags import SEVERITIES, thresholds_class  # noqa: F401  (SEVERITIES: its old home)

# every threshold of every flag, generated from the flag registry (each flag module declares its own)
FlagThresholds = thresholds_class()


@dataclass
class GeometryOptions(BatchedStreamOptions):
    """`saegeo geometry FILES...`: how the rows are read and what is written."""

    key: str | None = option(
        None, "tensor name in .safetensors/.pt files (default: 'activations', else the only 2-D or 3-D one)"
    )
    json: str | None = option(None, "write the full result (all eigenvalues, top eigenvectors) as JSON here")
    overwrite: bool = option(False, "replace output files that exist already (refused otherwise)")
    artifact_components: int = option(
        3,
        "top principal directions in the artifact test (stores only; 0: skip it); the JSON keeps max(10, this)",
        low=0,
        old_flags=("--top-k",),
    )
    float64: bool = option(False, "form the batch grams in float64 (slower; default: float32 on shifted rows)")
    pool: bool = option(False, "pool stores of different models or hooks into one accumulator (refused without it)")
    thresholds: FlagThresholds = option(factory=FlagThresholds, help="of the flags", flatten=True)

    def __post_init__(self) -> None:
        check(self)


@dataclass
class MatchOptions:
    """What `activations_match_flags` reads of the rows (its thresholds are the activations_mismatch flag's)."""

    max_rows: int = option(65536, "rows read (from the start) for the scale, offset and special-row measures", low=1)
    fve_rows: int = option(4096, "rows re-encoded to test the alternative scale", low=0)
    assume_same_model: bool = option(False, "skip the model comparison (said in the notes)")

    def __post_init__(self) -> None:
        check(self)


@dataclass
class CheckOptions(StreamOptions, DeviceOption):
    """Thresholds of the dictionary-only checks (the mean-direction one is FlagThresholds.dictionary_min_cos)."""

    duplicate_cos: float = option(0.99, "pairs with cos(w_i, w_j) above this are near-duplicates", low=-1, high=1)
    zero_row_rel_norm: float = option(ZERO_ROW_REL_NORM, "‖w_i‖ ≤ this × median ‖w‖ counts as a zero row", low=0)
    misaligned_cos: float = option(
        0.0, "latents with cos(encoder column, decoder row) below this are misaligned", low=-1, high=1
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
        "per SAE: the error's linearly predictable share (5-fold ridge sums: ~1.6·d² float32 multiply-adds a row, "
        "10·d² float64 numbers held; their cost in benchmarks/README.md), the dense latents' antipodal pairs and "
        "the position direction",
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
    thresholds: FlagThresholds = option(
        factory=FlagThresholds, help="of the flags (the dense column reads dense_frequency)", flatten=True
    )

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
    saes: str | None = option(
        None,
        "a directory of per-layer SAEs, DIR/<hook> (e.g. DIR/blocks.3.hook_resid_post): each layer's row gains its "
        "SAE's decoder spectrum power law α",
    )
    out: str | None = option(None, "directory for summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html")
    json: str | None = option(None, "write the sweep JSON here")
    overwrite: bool = option(False, "replace output files that exist already (refused otherwise)")
    thresholds: FlagThresholds = option(factory=FlagThresholds, help="of the flags (artifact_direction)", flatten=True)

    def __post_init__(self) -> None:
        check(self)

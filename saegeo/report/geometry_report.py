"""geometry_report: one streaming pass over the activations (and any SAEs) -> GeometryReport.

Per batch x (rows never kept, memory independent of the number of tokens):
  * the activation GeometryAccumulator (offset, A, spectrum, MP, IsoScore, γ, rogue dims, sign null);
  * a reservoir sample of rows (Algorithm R, seeded) for the histogram of pairwise cosines;
  * per SAE: ``saegeo.sae.metrics.SAEMetrics`` (the trainer's held-out evaluation is the same accumulator):
    codes with decoder norms folded in (a_i·‖W_dec,i‖) for the amplification law's CodeMomentAccumulator
    (K = mean L0, q, r, per-latent firing and E[a_i], the mean-cosine ratio); FVE = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²;
    and the unit-vector sums of x̂ − b_dec, x − b_dec (and x, from the accumulator) whose mean pairwise
    cosines are A = (n‖m̂‖² − 1)/(n − 1).
Before the pass: the dictionary geometry of the unit decoder rows u_i (A_dict, ‖ū‖², their own spectrum;
``saegeo.geometry.dictionary.dictionary_geometry``). After it: b_dec against μ, the amplification law beside
the three measured A's (the per-latent law A_het and its mean-cosine form, the co-firing share of
E‖x̂ − b_dec‖² and its top pairs from the row sample re-encoded, the one-rate forms as references), cone shares
c_i = E[a_i](u_i·M)/‖M‖² (M = Σ E[a_i]u_i) and cos(u_i, μ); then, once, the flags and the diagnosis.

The report is assembled once, from everything it shows: the SAEs with their configs (a directory's cfg.json
is its provenance), their spliced evaluation, a run config, and flags raised elsewhere (``saegeo check``'s
dictionary-only checks and activations_mismatch: an error there withholds that SAE's WITHHELD_METRICS).

Public API
----------
``ReportOptions``                 batch size, token cap, cosine sample, thresholds, assumed null, ...
``GeometryReport`` / ``SAEGeometry``  dataclasses; ``to_dict``/``from_dict``, ``to_json``/``load`` (schema-versioned).
``geometry_report(acts, sae=None, *, options=None, config=None, splice=None, flags=(), notes=(), closing_notes=())
-> GeometryReport``
``compute_flags(report, thresholds=None) -> list[Flag]``  (re)flag a report from its numbers alone (the flags given to
geometry_report from elsewhere are not among them).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.activations.sources import open_rows
from saegeo.activations.store import store_exclusions
from saegeo.config import from_dict
from saegeo.errors import BadInputError, FormatError
from saegeo.geometry import GeometryAccumulator, activation_geometry
from saegeo.geometry.accumulate import as_rows
from saegeo.geometry.amplification import (
    anisotropy_sampling_sd,
    cofiring_pairs,
    cofiring_share,
    cone_shares,
    dictionary_anisotropy,
    exact_moment_prediction,
    heterogeneous_moment_prediction,
    independent_codes_anisotropy,
    independent_second_moment,
    mean_cosine_prediction,
    textbook_prediction,
)
from saegeo.geometry.dense import CovariateDirection
from saegeo.geometry.diagnosis import sample_diagnostics
from saegeo.geometry.dictionary import dictionary_geometry
from saegeo.geometry.measures import ActivationGeometry, FieldDict, fields_of, signed_null_test
from saegeo.geometry.sample import RowReservoir
from saegeo.geometry.transforms import Whitening
from saegeo.io import dump_json, json_safe
from saegeo.progress import progress_bar
from saegeo.report.display import columns_frame, flag_counts, flags_frame, names, notebook_html, pandas, short
from saegeo.report.flags import (
    ACTIVATIONS_MISMATCH,
    WITHHELD_FLAGS,
    WITHHELD_METRICS,
    Flag,
    activation_diagnosis,
    config_whitens,
    flag_inputs,
    run_flags,
    sort_flags,
)
from saegeo.report.latent_cards import (
    ASKED,
    LATENTS_SCHEMA_VERSION,
    LatentCard,
    LatentCollector,
    LatentsOptions,
    context_source,
    named_latents,
    parse_latent_ids,
    top_by,
)
from saegeo.report.nesting import PrefixSums, nesting_levels
from saegeo.report.options import FlagThresholds, ReportOptions
from saegeo.report.structure import PassStructure, StructureOptions
from saegeo.sae.formats import CFG_FILENAME
from saegeo.sae.metrics import SAEMetrics
from saegeo.sae.model import SAE
from saegeo.sae.train import read_training_log

SCHEMA_VERSION = 3  # report.json's layout: raised with each change a reader must know of (CHANGELOG.md)
COFIRING_LATENTS = 256  # co-firing pairs are looked for among the latents with the largest E[a_i²]
# codes of both signs: the cone shares are read only when Â of x̂ − b_dec is outside the signed null at the one-sided
# tail of 3 normal sds (above it M = Σ E[a_i]u_i is within its noise and c_i = E[a_i](u_i·M)/‖M‖² names no latent);
# the tail is the χ²-mixture's, not z's: z ≥ 3 happens 1–2 % of the time under the null (docs/statistics.md §9)
SIGNED_CONE_MAX_P = 0.00135


# =========================================================================== report dataclasses
@dataclass
class SAEGeometry:
    """Everything the pass measured about one SAE. Per-latent lists have d_sae entries."""

    name: str
    d_in: int
    d_sae: int
    architecture: str | None
    k: int | None
    b_dec_init: str | None  # from saegeo provenance when known
    n_tokens: int
    # reconstruction
    fve: float | None  # 1 − Σ‖x − x̂‖²/Σ‖x − x̄‖²
    mse: float  # Σ‖x − x̂‖²/(n·d)
    # codes (decoder norms folded in)
    mean_l0: float  # K
    q: float  # K/d_sae
    r: float | None  # E[a|a≠0]²/E[a²|a≠0] (signed codes: with their signs)
    n_dead: int  # never fired in the pass
    n_dense: int  # fired on > dense_frequency of tokens
    firing_frequency: list[float]
    mean_activation: list[float]  # E[a_i] over all tokens (zeros included)
    cos_decoder_mean: list[float]  # cos(u_i, μ)
    cone_shares: list[float] | None  # c_i (None when the codes have no cone: M = 0)
    # dictionary geometry of the unit decoder rows
    a_dict: float
    dict_mean_sq_norm: float  # ‖ū‖²
    decoder_norms: dict[str, float]  # min, mean, max, std of ‖W_dec,i‖
    n_zero_decoder_rows: int
    dictionary_spectrum: dict[str, Any]  # eigenvalues, erank, top-1, IsoScore, MP edges of the u_i
    # b_dec against the activation mean
    b_dec_norm: float
    b_dec_distance_to_mean: float | None  # ‖b_dec − μ‖/‖μ‖
    b_dec_cos_mean: float | None
    # the amplification law beside the measured A's, with the null A of x̂ − b_dec is read against (null_value,
    # null_sd, null_z, null_p, negative_code_share; its kind is cone_null)
    amplification: dict[str, float | None]
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # the latent pairs that make the co-firing term, largest share first: {i, j, share, joint_rate, cos}
    cofiring_pairs: list[dict[str, float]] | None = None
    # the SAE spliced into the model (saegeo.sae.evaluate): CE loss clean/spliced/ablated, recovered, KL
    splice: dict[str, Any] | None = None
    # metrics set to None because the activations are not this SAE's (activations_mismatch error; WITHHELD_METRICS)
    withheld: list[str] = field(default_factory=list)
    # latent cards (saegeo.report.latent_cards): one per latent a flag names or asked for, and every latent's columns
    latents: list[dict[str, Any]] = field(default_factory=list)
    latent_table: dict[str, list] | None = None
    latent_info: dict[str, Any] | None = None
    # the SAE directory's training_log.jsonl, thinned (`training_curve`): {tokens, loss, fve, l0, dead: lists}
    training_curve: dict[str, list] | None = None
    # fve, mse and mean_l0 above are over every row read, the SAE's training rows included; when its provenance
    # records this store's held-out rows (saegeo train: the last N rows), the same read-outs over those rows alone:
    # {first_row, n_tokens, fve, mse, mean_l0} (None when not recorded, or not computable: heldout_first_row)
    heldout: dict[str, Any] | None = None
    # (saegeo.report.structure.PassStructure) the error's linearly predictable share, held out, ± sd
    dark_matter: dict[str, Any] | None = None
    # a Matryoshka SAE: one record per nesting level (saegeo.report.nesting): width, FVE, L0, dead share, A_dict,
    # cone share, the K·A_dict law and the measured A of the prefix's x̂_ℓ − b_dec
    levels: list[dict[str, Any]] | None = None
    # the dense latents, their antipodal pairs and the subspace they span against μ and the top PCs
    dense_structure: dict[str, Any] | None = None
    # which null A of x̂ − b_dec is read against (docs/statistics.md §9): "signed" (codes of both signs: 0, with an
    # sd and z in amplification) or "sign-aware" (codes ≥ 0: q·r); None in reports made before it was recorded
    cone_null: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SAEGeometry:
        return cls(**dict(d))

    @property
    def flags(self) -> list[Flag]:
        """The flags of the report holding this section that concern this SAE ([] for a section on its own)."""
        report = getattr(self, "_report", None)
        return [f for f in report.flags if f.subject == self.name] if report is not None else []

    def card(self, latent: int) -> LatentCard:
        """The card of one latent (top contexts, histogram, neighbours): the report keeps one for each latent a
        flag names or ``ReportOptions.latents`` asked for."""
        for c in self.latents:
            if c["id"] == latent:
                return LatentCard(self.name, c)
        have = [c["id"] for c in self.latents]
        raise KeyError(
            f"SAE {self.name!r} has no card for latent {latent!r} (cards: {have or 'none'}); ask for it with "
            "ReportOptions(latents=(...)) or `saegeo report --latents`"
        )

    @property
    def cards(self) -> list[LatentCard]:
        """Every card the report keeps for this SAE."""
        return [LatentCard(self.name, c) for c in self.latents]

    def latents_frame(self) -> Any:
        """Every latent's row as a DataFrame indexed by latent id: the per-latent table (TABLE_COLUMNS) when the
        report made one, else the columns every section has (firing rate, E[a], cos(u_i, μ), cone share)."""
        table = self.latent_table or {
            "id": list(range(self.d_sae)),
            "rate": self.firing_frequency,
            "mean_activation": self.mean_activation,
            "cos_mu": self.cos_decoder_mean,
            "cone_share": self.cone_shares if self.cone_shares is not None else [None] * self.d_sae,
        }
        return columns_frame(table, index="id").rename_axis("latent")

    def __repr__(self) -> str:
        a = self.amplification.get("measured_recon_minus_b_dec")
        arch = f"{self.architecture or '?'}" + (f" k={self.k}" if self.k else "")
        return (
            f"<SAEGeometry {self.name!r}: {arch}, {self.d_sae:,} latents × d={self.d_in}, {self.n_tokens:,} tokens · "
            f"FVE {short(self.fve)} · L0 {short(self.mean_l0, 1)} · dead {self.n_dead:,} · A(x̂ − b_dec) {short(a)} · "
            f"flags: {flag_counts(self.flags)}>"
        )

    def _repr_html_(self) -> str:
        return notebook_html(self)

    def top_latents(self, by: str = "cone_shares", n: int = 10) -> list[int]:
        """Indices of the n latents with the largest value of a per-latent list (default: cone share)."""
        values = getattr(self, by)
        if values is None:
            return []
        return torch.tensor(values, dtype=torch.float64).argsort(descending=True)[:n].tolist()


@dataclass
class GeometryReport:
    """The whole report; ``to_json`` / ``GeometryReport.load`` round-trip it exactly (schema_version)."""

    schema_version: int
    source: dict[str, Any]  # what was read: kind, path, model, hook, d, n_tokens
    activations: ActivationGeometry  # the typed object activation_geometry() returns (report.json: its to_dict())
    cosine_histogram: dict[str, Any]  # edges, counts, n_rows, n_pairs, sample_mean
    saes: list[SAEGeometry]
    flags: list[Flag]
    options: dict[str, Any]
    config: dict[str, Any] | None = None  # a run/preprocessing config given by the caller
    whitening_cost: dict[str, Any] | None = None  # Whitening.fit report when some config whitens
    seconds: float | None = None
    tokens_per_second: float | None = None
    saegeo_version: str = ""
    notes: list[str] = field(default_factory=list)
    artifact: dict[str, Any] | None = (
        None  # the artifact test (saegeo.report.store_measures.artifact_pass), stores only
    )
    # numbers read from the uniform row sample (geometry.diagnosis.sample_diagnostics): centred A, PC1 split, k-means
    sample_diagnostics: dict[str, Any] | None = None
    # offset → shape → artifact → fix: [{step, finding, read: {name: number}}] (flags.activation_diagnosis)
    diagnosis: list[dict[str, Any]] = field(default_factory=list)
    # a store cached with exclusions: its manifest's rule and sums (what the excluded rows and the
    # first position carried: saegeo.activations.cache.exclusion_shares)
    exclusions: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # one shape for one thing: a report made here or read from report.json holds the dataclass (which also
        # reads by key, as the JSON does; a name that is not a field is an error, not a None)
        self.activations = ActivationGeometry.from_dict(self.activations)
        for s in self.saes:  # each section reads its flags from the report (SAEGeometry.flags; not in its JSON)
            s._report = self

    def thresholds(self) -> FlagThresholds:
        """The thresholds the report was flagged with (its options; the defaults for a key it lacks)."""
        return from_dict(FlagThresholds, self.options.get("thresholds"))

    def __repr__(self) -> str:
        g, src = self.activations, self.source
        what = " ".join(str(src[k]) for k in ("model", "hook") if src.get(k))
        saes = f"{len(self.saes)} SAE(s): {names([s.name for s in self.saes])}" if self.saes else "no SAE"
        return (
            f"<GeometryReport{' ' + what if what else ''}: {src.get('n_tokens', g.n):,} tokens × d={g.d} · "
            f"A = {short(g.anisotropy)} (null {short(g.sign.null)}) · erank {short(g.effective_rank, 1)} · "
            f"{saes} · flags: {flag_counts(self.flags)}>"
        )

    def _repr_html_(self) -> str:
        return notebook_html(self)

    def latents(self, sae: str | int | None = None) -> Any:
        """One SAE's per-latent table as a DataFrame indexed by latent id (``sae``: its name or position; None:
        the only or first SAE), e.g. ``report.latents().sort_values("cone_share", ascending=False)``."""
        if not self.saes:
            raise KeyError("the report has no SAE: geometry_report(acts, sae=...) measures one")
        section = self.saes[sae] if isinstance(sae, int) else self.saes[0] if sae is None else self.sae_named(sae)
        return section.latents_frame()

    def to_pandas(self) -> Any:
        """The SAEs side by side as a DataFrame: one row per SAE, its headline numbers as columns (the numbers
        behind the report's SAE table; per-latent lists are in ``latents()``)."""
        rows = {}
        for s in self.saes:
            amp = s.amplification
            rows[s.name] = {
                "architecture": s.architecture,
                "k": s.k,
                "d_in": s.d_in,
                "d_sae": s.d_sae,
                "n_tokens": s.n_tokens,
                "fve": s.fve,
                "mse": s.mse,
                "mean_l0": s.mean_l0,
                "n_dead": s.n_dead,
                "n_dense": s.n_dense,
                "b_dec_distance_to_mean": s.b_dec_distance_to_mean,
                "b_dec_cos_mean": s.b_dec_cos_mean,
                "a_dict": s.a_dict,
                "dict_mean_sq_norm": s.dict_mean_sq_norm,
                **{f"heldout.{k}": v for k, v in (s.heldout or {}).items()},
                **{f"amplification.{k}": v for k, v in amp.items()},
                **{f"splice.{k}": v for k, v in (s.splice or {}).items() if not isinstance(v, (dict, list))},
                "flags": flag_counts(s.flags),
            }
        return pandas().DataFrame.from_dict(rows, orient="index").rename_axis("sae")

    def flags_frame(self) -> Any:
        """The flags as a DataFrame (one row per flag, its evidence as columns)."""
        return flags_frame(self.flags)

    @property
    def sae(self) -> SAEGeometry | None:
        """The (first) SAE section, or None."""
        return self.saes[0] if self.saes else None

    def sae_named(self, name: str) -> SAEGeometry:
        for s in self.saes:
            if s.name == name:
                return s
        raise KeyError(f"no SAE named {name!r}; report has {[s.name for s in self.saes]}")

    def flag_names(self, subject: str | None = None) -> list[str]:
        return [f.name for f in self.flags if subject is None or f.subject == subject]

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["activations"] = self.activations.to_dict()
        out["saes"] = [s.to_dict() for s in self.saes]
        out["flags"] = [f.to_dict() for f in self.flags]
        return json_safe(out)

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = 1) -> str:
        return dump_json(self.to_dict(), path, indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GeometryReport:
        d = dict(d)
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise FormatError(
                f"report schema_version {version!r} is not supported (this saegeo reads {SCHEMA_VERSION}); "
                "regenerate the report with this version"
            )
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["saes"] = [SAEGeometry.from_dict(s) for s in d.get("saes", [])]
        d["flags"] = [Flag.from_dict(f) for f in d.get("flags", [])]
        return cls(**d)

    @classmethod
    def load(cls, path: str | os.PathLike) -> GeometryReport:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as err:
            raise FormatError(f"{path}: cannot read a saegeo report ({err})") from None


def load_report(path: str | os.PathLike) -> GeometryReport:
    """A report written by `write_report` or `saegeo report`: its report.json, or the directory holding it."""
    path = Path(path)
    return GeometryReport.load(path / "report.json" if path.is_dir() else path)


# =========================================================================== streaming helpers
_Reservoir = RowReservoir  # the former private name (tests)


_COSINE_BLOCK_ROWS = 512


def cosine_histogram(rows: Float[Tensor, "k d"], bins: int = 100) -> dict[str, Any]:
    """Histogram over [−1, 1] of the k(k−1)/2 pairwise cosines of ``rows`` (zero rows dropped), and their mean
    (‖Σx̂_i‖² − k)/(k(k − 1))."""
    x = rows.to(torch.float64)
    x = x[x.norm(dim=1) > 0]
    k = x.shape[0]
    edges = torch.linspace(-1.0, 1.0, bins + 1, dtype=torch.float64)
    if k < 2:
        return {"edges": edges.tolist(), "counts": [0] * bins, "n_rows": k, "n_pairs": 0, "sample_mean": None}
    unit = x / x.norm(dim=1, keepdim=True)
    # the pairs i < j by blocks of rows: each block pair once (half the products of the full gram, no k × k matrix)
    counts = torch.zeros(bins, dtype=torch.float64)
    for lo in range(0, k, _COSINE_BLOCK_ROWS):
        left = unit[lo : lo + _COSINE_BLOCK_ROWS]
        for right_lo in range(lo, k, _COSINE_BLOCK_ROWS):
            cos = left @ unit[right_lo : right_lo + _COSINE_BLOCK_ROWS].T
            if right_lo == lo:
                iu = torch.triu_indices(*cos.shape, offset=1)
                cos = cos[iu[0], iu[1]]
            counts += torch.histc(cos.clamp_(-1.0, 1.0), bins=bins, min=-1.0, max=1.0)
    unit_sum = unit.sum(dim=0)
    return {
        "edges": edges.tolist(),
        "counts": [int(c) for c in counts.tolist()],
        "n_rows": k,
        "n_pairs": k * (k - 1) // 2,
        "sample_mean": (float(unit_sum @ unit_sum) - k) / (k * (k - 1)),  # Σ_{i≠j} x̂_i·x̂_j = ‖Σx̂_i‖² − k
    }


# =========================================================================== SAEs
def _resolve_sae(obj: Any) -> tuple[Any, dict[str, Any], str | None]:
    """SAE, path, id or peer object -> (module with encode/decode/W_dec/b_dec, its config dict, default name), through
    the one conversion (`SAE.load`). An object it does not take (a custom module, or a peer
    architecture saegeo does not reproduce) that has its own encode, decode, W_dec and b_dec is measured through
    those."""
    try:
        module = SAE.load(obj)
    except (BadInputError, FormatError):
        if isinstance(obj, (str, os.PathLike)) or not all(
            hasattr(obj, a) for a in ("encode", "decode", "W_dec", "b_dec")
        ):
            raise
        module = obj
    # an SAE read from a local directory (the command lines load each SAE once and pass the object) is the path
    source = obj if isinstance(obj, (str, os.PathLike)) else _local_source(module)
    if source is not None:
        cfg_file = Path(source) / CFG_FILENAME
        config: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}  # read by SAE.load
        return module, config, Path(source).name
    cfg = getattr(obj, "cfg", None)
    if hasattr(cfg, "to_dict"):
        config = dict(cfg.to_dict())
    elif cfg is not None and hasattr(cfg, "__dataclass_fields__"):
        config = asdict(cfg)
    elif isinstance(cfg, Mapping):
        config = dict(cfg)
    else:
        config = {}
    return module, config, None


def _local_source(module: Any) -> str | None:
    """The local directory an SAE object was read from (its format_info.source), or None."""
    source = getattr(getattr(module, "format_info", None), "source", None)
    return str(source) if isinstance(module, SAE) and source and Path(str(source)).is_dir() else None


def _named_saes(sae: Any) -> list[tuple[str, Any]]:
    if sae is None:
        return []
    if isinstance(sae, Mapping):
        return [(str(k), v) for k, v in sae.items()]
    if isinstance(sae, (list, tuple)):
        return [(f"sae{i}", s) for i, s in enumerate(sae)]
    return [("", sae)]


_HELDOUT = re.compile(r"last (\d+) rows in store order")


def heldout_first_row(config: Mapping[str, Any], store: Any) -> int | None:
    """The global index of the first row an SAE's training held out of ``store``, when its provenance (cfg.json's
    saegeo.data, written by `saegeo train`) says it trained on this very store (the same shards, by sha256) and held
    out its last N rows: n_tokens − N. None when the SAE records no such thing (SAELens and the other libraries
    record no rows) or ``store`` is not that store."""
    data = ((config or {}).get("saegeo") or {}).get("data") or {}
    if store is None or data.get("source") != "store" or not isinstance(data.get("heldout"), str):
        return None
    if data.get("shard_sha256") != [s.sha256 for s in store.shards] or data.get("n_tokens") != store.n_tokens:
        return None
    m = _HELDOUT.fullmatch(data["heldout"])
    return store.n_tokens - int(m.group(1)) if m and int(m.group(1)) > 0 else None


class _SAEPass:
    """The per-SAE part of the one pass (see the module docstring)."""

    def __init__(
        self,
        name: str,
        module: Any,
        config: dict[str, Any],
        device: str,
        *,
        latent_contexts: int | None = None,
        first_row: int = 0,
        heldout_from: int | None = None,
        structure: StructureOptions | None = None,
        levels: bool = True,
    ):
        self.name, self.module, self.config = name, module, config
        if hasattr(module, "to"):
            module.to(torch.device(device))
        self.d_sae, self.d_in = module.W_dec.shape
        self.dictionary = dictionary_geometry(module.W_dec.detach().cpu())  # float64 gram: the spectrum is exact
        self.metrics = SAEMetrics(module, mean_sq_norm=self.dictionary.mean_sq_norm, device=device)
        # latent cards: the top rows and histogram of every latent (first_row: the global index of the first row)
        self.latents = None if latent_contexts is None else LatentCollector(self.d_sae, latent_contexts, first_row)
        if self.latents is not None:
            self.metrics.code_observers.append(self.latents)
        # the rows the SAE's training held out (global index ≥ heldout_from) measured apart too: they are encoded
        # twice, a held-out fraction's extra cost, so that the report can say which rows each figure is over
        self.row, self.heldout_from = first_row, heldout_from
        self.heldout = None if heldout_from is None else SAEMetrics(module, device=device)
        self.structure = None if structure is None else PassStructure(self.d_in, structure)
        if self.structure is not None:
            self.metrics.row_observers.append(self.structure)
        # a Matryoshka SAE's nesting levels, measured in the same pass (not merged across ranks: `levels` off there;
        # an input-normalising SAE's prefixes would need its denormalisation: none is Matryoshka)
        cfg = getattr(module, "cfg", None)
        widths = getattr(cfg, "matryoshka_widths", None)
        self.prefixes = None
        if levels and widths and getattr(cfg, "input_normalization", "none") == "none":
            self.prefixes = PrefixSums(widths, module.W_dec, module.b_dec, device)
            self.metrics.code_observers.append(self.prefixes.codes)
            self.metrics.row_observers.append(self.prefixes.rows)

    def add(self, x: Tensor, positions: Tensor | None = None, log_frequency: Tensor | None = None) -> None:
        """One batch of rows, with their positions and their tokens' log frequencies where the source has them."""
        if self.latents is not None:  # the norm-detector columns: each latent's activation against ‖x‖, position, log f
            covariates = {"norm": torch.linalg.vector_norm(x.double(), dim=1).cpu()}
            if positions is not None:
                covariates["position"] = torch.as_tensor(positions).cpu()
            if log_frequency is not None:
                covariates["log_frequency"] = log_frequency
            self.latents.begin_batch(covariates)
        self.metrics.add(x)
        if self.heldout is not None and self.row + x.shape[0] > self.heldout_from:
            self.heldout.add(x[max(self.heldout_from - self.row, 0) :])
        self.row += x.shape[0]

    def finish(
        self,
        geo: dict[str, Any],
        thresholds: FlagThresholds,
        sample: Tensor | None = None,
        seed: int = 0,
        position: CovariateDirection | None = None,
    ) -> SAEGeometry:
        """The SAE section; ``sample`` (the report's uniform row sample) gives the per-latent law's mean-cosine
        form and the co-firing pairs; ``position`` (the rows regressed on their position) the dense structure's
        position direction."""
        m, dg = self.metrics, self.dictionary
        codes = m.codes
        freq, mean_code = codes.firing_frequency, codes.mean_code
        notes = []
        if dg.n_zero:
            notes.append(f"{dg.n_zero} decoder row(s) are zero: excluded from the dictionary geometry")
        w_dec = self.module.W_dec.detach().cpu()
        K, q = codes.K, codes.q
        r = codes.r if codes.l0_sum > 0 else None
        amplification = {
            "K": K,
            "q": q,
            "r": r,
            "a_dict": dg.a_dict,
            "mean_sq_norm": dg.mean_sq_norm,
            "textbook": textbook_prediction(K, dg.a_dict),
            "exact_moment": exact_moment_prediction(K, q, r, dg.mean_sq_norm) if r is not None else None,
            "mean_cosine": mean_cosine_prediction(codes.expected_ratio, dg.mean_sq_norm) if r is not None else None,
            "measured_recon_minus_b_dec": m.recon_unit.anisotropy(),
            "measured_recon_minus_b_dec_sd": anisotropy_sampling_sd(
                m.recon_unit.unit_sum, m.recon_unit_scatter, m.recon_unit.n
            ),
            "measured_x_minus_b_dec": m.input_unit.anisotropy(),
            "measured_x": geo.get("anisotropy"),
        }
        amplification.update(self._cone_null(w_dec, notes))
        shares = None
        p_value = amplification.get("null_p")
        if codes.signed and (p_value is None or p_value > SIGNED_CONE_MAX_P):
            notes.append(
                f"codes of both signs with no preferred direction: A of x̂ − b_dec is within the signed null "
                f"(z = {short(amplification['null_z'], 1)}, p = {short(p_value)} > {SIGNED_CONE_MAX_P:g}), so "
                "Σ E[a_i]·u_i is noise and no latent has a cone share"
            )
        else:
            try:
                shares = cone_shares(mean_code, w_dec).tolist()
            except BadInputError:
                notes.append("no latent fired: cone shares are undefined")
        pairs = sampled = None
        if r is not None:  # the per-latent law and the co-firing term (E‖x̂ − b_dec‖² > 0 once a latent fired)
            second = m.recon_second_moment
            mean_sq_code = codes.mean_sq_code
            amplification.update(
                A_het=heterogeneous_moment_prediction(mean_code, mean_sq_code, w_dec),
                second_moment=second,
                independent_second_moment=independent_second_moment(mean_code, mean_sq_code, w_dec),
                cofiring_share=cofiring_share(second, mean_code, mean_sq_code, w_dec),
            )
            if sample is not None and sample.shape[0] >= 3:
                sampled = m.sample_codes(sample)
                a_mc, a_mc_sd = independent_codes_anisotropy(sampled, w_dec, seed=seed)
                pairs, top_share = cofiring_pairs(
                    sampled,
                    mean_code,
                    mean_sq_code,
                    w_dec,
                    second,
                    n_latents=COFIRING_LATENTS,
                    n_pairs=thresholds.max_latents,
                    sign=1.0 if amplification["cofiring_share"] >= 0 else -1.0,
                )
                amplification.update(
                    A_het_mean_cosine=a_mc,
                    A_het_mean_cosine_sd=a_mc_sd,
                    cofiring_share_top_latents=top_share,
                    n_sample_rows=int(sample.shape[0]),
                )
        cfg = getattr(self.module, "cfg", None)
        saegeo_block = self.config.get("saegeo", {}) if isinstance(self.config, Mapping) else {}
        b_dec = m.b_dec_against_mean()
        architecture = getattr(cfg, "activation", None) or self.config.get("architecture")
        info = getattr(self.module, "format_info", None)
        saved_by_saegeo = info if info is not None and info.written_by == "saegeo" else None
        metadata = self.config.get("metadata") if isinstance(self.config, Mapping) else None
        trained_as = (
            saegeo_block.get("trained_as")
            or getattr(saved_by_saegeo, "architecture", None)
            or (metadata.get("training_architecture") if isinstance(metadata, Mapping) else None)  # SAELens' own
        )
        if trained_as not in (None, architecture):  # a BatchTopK or Matryoshka SAE saved as jumprelu
            architecture = f"{trained_as} (saved as {architecture})"
        structure = {}
        if self.structure is not None:
            structure = self.structure.finish(
                freq,
                sampled,
                w_dec,
                self.module.W_enc.detach().cpu() if getattr(self.module, "W_enc", None) is not None else None,
                m.mean,
                geo.get("top_eigenvectors") or [],
                position,
            )
        return SAEGeometry(
            dark_matter=structure.get("dark_matter"),
            dense_structure=structure.get("dense"),
            name=self.name,
            d_in=self.d_in,
            d_sae=self.d_sae,
            architecture=architecture,
            k=getattr(cfg, "k", None)
            or self.config.get("k")
            or saegeo_block.get("training_k")
            or getattr(saved_by_saegeo, "training_k", None),
            b_dec_init=saegeo_block.get("b_dec_init"),
            n_tokens=m.n,
            fve=m.fve,
            mse=m.mse,
            mean_l0=K,
            q=q,
            r=r,
            n_dead=int((freq == 0).sum()),
            n_dense=int((freq > thresholds.dense_frequency).sum()),
            firing_frequency=freq.tolist(),
            mean_activation=mean_code.tolist(),
            cos_decoder_mean=m.decoder_mean_cosines().tolist(),
            cone_shares=shares,
            cone_null="signed" if codes.signed else "sign-aware",
            a_dict=dg.a_dict,
            dict_mean_sq_norm=dg.mean_sq_norm,
            decoder_norms={k: dg.norm_stats[k] for k in ("min", "mean", "max", "std")},
            n_zero_decoder_rows=dg.n_zero,
            dictionary_spectrum={**dg.spectrum, "offset": dg.mean_sq_norm**0.5, "anisotropy": dg.a_dict},
            b_dec_norm=b_dec["b_dec_norm"],
            b_dec_distance_to_mean=b_dec["b_dec_dist_to_mean"],
            b_dec_cos_mean=b_dec["b_dec_cos_mean"],
            amplification=amplification,
            config=json_safe(self.config),
            notes=notes,
            cofiring_pairs=pairs,
            training_curve=training_curve(info.source) if info is not None and info.source else None,
            heldout=self._heldout(),
            levels=None if self.prefixes is None else nesting_levels(self.prefixes, m.centred_ss, freq, shares, w_dec),
        )

    def _cone_null(self, w_dec: Tensor, notes: list[str]) -> dict[str, float | None]:
        """The null A of x̂ − b_dec is read against (docs/statistics.md §9), and for codes of both signs the law's
        one-rate forms on the oriented dictionary (each latent's row and codes flipped to a mean code ≥ 0).

        Codes ≥ 0: the sign-aware null q·r, the cone the codes' sign makes with an untilted dictionary (no null_sd or
        null_z: the law is read against the measured A, not tested). Codes of both signs: the signed null, E Â = 0 and
        Var Â = 2 tr C²/(n(n − 1)) for rows whose law is unchanged by y → −y, with its z."""
        codes, m = self.metrics.codes, self.metrics
        if not codes.signed:
            r = codes.r if codes.l0_sum > 0 else None
            return {"null_value": codes.q * r if r is not None else None, "negative_code_share": 0.0}
        test = signed_null_test(m.recon_unit.unit_sum, m.recon_unit_scatter, m.recon_unit.n)
        out = {
            "null_value": 0.0,
            "null_sd": test.sd,
            "null_z": test.z,
            "null_p": test.p_value,
            "negative_code_share": codes.negative_share,
            "textbook": None,
            "mean_cosine": None,
        }
        notes.append(
            "codes of both signs: a latent's row and its codes may flip together without changing x̂, so the law's "
            "one-rate forms read the oriented dictionary (a_dict_oriented, r̃); the textbook form (non-negative "
            "Exp(1) codes) and the one-rate mean-cosine form (streamed before the orientation is known) are not "
            "defined for them"
        )
        try:
            a_dict, mean_sq = dictionary_anisotropy(w_dec * codes.orientation.to(w_dec.dtype)[:, None])
        except BadInputError:
            return out
        r = codes.oriented_r
        out.update(
            a_dict_oriented=a_dict,
            mean_sq_norm_oriented=mean_sq,
            r_oriented=r,
            exact_moment=exact_moment_prediction(codes.K, codes.q, r, mean_sq) if codes.l0_sum > 0 else None,
        )
        return out

    def _heldout(self) -> dict[str, Any] | None:
        h = self.heldout
        if h is None or h.n == 0:
            return None
        return {"first_row": self.heldout_from, "n_tokens": h.n, "fve": h.fve, "mse": h.mse, "mean_l0": h.codes.K}


CURVE_KEYS = ("tokens", "loss", "fve", "l0", "dead")
CURVE_POINTS = 200  # the report keeps at most this many records of a training log (evenly spaced, the last kept)


def training_curve(sae_path: str | os.PathLike, max_points: int = CURVE_POINTS) -> dict[str, list] | None:
    """The curves of the training_log.jsonl in an SAE's directory (saegeo.sae.train), or None when it has none
    (or the SAE is not a directory): {key: values} for tokens, loss, fve, l0 and dead, at most `max_points`
    records (every ⌈n/max_points⌉-th, the last always kept)."""
    path = Path(sae_path)
    records = read_training_log(path) if path.is_dir() else []
    if not records:
        return None
    stride = -(-len(records) // max_points)
    kept = records[::stride] if (len(records) - 1) % stride == 0 else records[::stride] + [records[-1]]
    return {key: [r.get(key) for r in kept] for key in CURVE_KEYS}


# =========================================================================== the pass
def _merge_ranks(
    acc: GeometryAccumulator | None, reservoir: RowReservoir | None, passes: list[_SAEPass], n_skipped: int
) -> tuple[GeometryAccumulator | None, RowReservoir | None, int]:
    """torch.distributed: combine every rank's partial pass in rank order (Chan's merge for the
    accumulators, float64 sums for the rest); every rank ends with the single-process totals."""
    from saegeo import distributed

    acc, reservoir = distributed.merge_across_ranks(acc), distributed.merge_across_ranks(reservoir)
    for p in passes:
        # the SAE is not part of the state that travels; the decoder read-outs need it back
        p.metrics = SAEMetrics.from_state_dict(distributed.merge_across_ranks(p.metrics).state_dict(), sae=p.module)
        if p.latents is not None:
            p.latents.merge_ranks()
    return acc, reservoir, distributed.sum_across_ranks(n_skipped)


def geometry_report(
    acts: Any,
    sae: Any = None,
    *,
    options: ReportOptions | None = None,
    config: Mapping[str, Any] | None = None,
    splice: Mapping[str, Mapping[str, Any]] | None = None,
    flags: Sequence[Flag] = (),
    notes: Sequence[str] = (),
    closing_notes: Sequence[str] = (),
) -> GeometryReport:
    """One streaming pass over ``acts`` computing the activation geometry and, for each SAE, its codes,
    dictionary geometry, b_dec against μ, the amplification law and cone shares; then, once, the flags and the
    activation diagnosis.

    acts: (n, d) tensor/array | ActivationStore | store path | iterable of (m, d) batches (or of
    (activations, codes) tuples, e.g. ``SuperpositionGenerator.batches``).
    sae: None | SAE object (saegeo or SAELens-like: encode, decode, W_dec, b_dec) | directory |
    a mapping name -> either (several SAEs measured in the same pass, shown side by side).
    config: a preprocessing / run config; one that whitens before the SAE is flagged with its cost.
    splice: name -> `splice_eval_many` result, shown in that SAE's column.
    flags: raised elsewhere about these SAEs (a dictionary check, activations_mismatch), merged with the report's
    own (which supersede a given flag of the same name and subject); an activations_mismatch error withholds that
    SAE's WITHHELD_METRICS and the flags computed from them. notes, then the withheld notes, then closing_notes
    follow the pass's own notes.
    Memory: O(d² + k_sample·d + Σ d_sae + batch·d), independent of the number of tokens; an SAE's dense
    (rows × d_sae) codes exist ``encode_block_rows(d_sae)`` rows at a time (ENCODE_BLOCK_BYTES, saegeo.sae.metrics),
    whatever batch_rows.
    """
    from saegeo import __version__

    opts = options or ReportOptions()
    from saegeo import distributed

    ctx = distributed.init_from_env()  # None unless launched by torchrun with several ranks
    with distributed.all_ranks_or_none("opening the activations"):
        # the one reader: shards verified (unless --no-verify), its NaN policy on every batch (skip_nonfinite)
        rows = open_rows(acts, verify=opts.verify, skip_nonfinite=opts.skip_nonfinite)
        if ctx is not None and rows.store is not None:
            distributed.check_same_store(rows.store)
        # token ids and positions ride along where the source has them (a store, a (batch, pos, d) array): the
        # latent table's position_corr and log_frequency_corr columns, the dense structure's position direction
        with_positions = (opts.latent_cards or opts.dark_matter) and (rows.store is not None or rows.window is not None)
        log_frequency = token_log_frequency(rows.store, opts.max_tokens) if opts.latent_cards else None
        batches, first_row = rows.batches(
            opts.batch_rows,
            *((ctx.rank, ctx.world_size) if ctx else ()),
            stop_row=opts.max_tokens,
            metadata=with_positions,
        )
        skipped_before = rows.n_nonfinite_skipped  # Rows opened by a caller may have been read before
    source = dict(rows.describe)
    total = opts.max_tokens if opts.max_tokens is not None else rows.n_rows
    device = distributed.resolve_device(opts.device)
    passes: list[_SAEPass] = []
    # an iterator under torch.distributed has no global row numbers: keep the ranks' sample indices apart
    sample_start = first_row if ctx is None or source["kind"] != "iterator" else ctx.rank << 40
    for name, obj in _named_saes(sae):
        module, cfg, default_name = _resolve_sae(obj)
        sae_name = name or default_name or "sae"
        parse_latent_ids(opts.latents, int(module.W_dec.shape[0]), sae_name)  # before the pass: a bad id is refused
        contexts = opts.latent_contexts if opts.latent_cards else None
        # held-out rows are found by global row index: one process reading a store in order
        heldout_from = heldout_first_row(cfg, rows.store) if ctx is None else None
        structure = (
            StructureOptions(progress=False, fold_rows=_fold_rows(total)) if opts.dark_matter and not ctx else None
        )
        passes.append(
            _SAEPass(
                sae_name,
                module,
                cfg,
                opts.device,
                latent_contexts=contexts,
                first_row=sample_start,
                heldout_from=heldout_from,
                structure=structure,
                levels=ctx is None,
            )
        )

    acc: GeometryAccumulator | None = None
    reservoir: RowReservoir | None = None
    position: CovariateDirection | None = None  # the rows' regression on position, for the dense structure
    bar = None
    if opts.progress and (ctx is None or ctx.is_main):
        bar = progress_bar(total=total, unit="tok", unit_scale=True, desc="report", dynamic_ncols=True)
    t0 = time.perf_counter()
    with distributed.all_ranks_or_none("streaming the activations"):  # a failing rank ends every rank
        for batch in batches:  # screened by the reader; max_tokens is its stop_row
            batch, ids, positions = batch if with_positions else (batch, None, None)
            x = as_rows(batch).to(device)  # the accumulators follow the batches: float64 sums on the device
            if acc is None:
                if x.shape[0] == 0:
                    continue  # every row of the first batch skipped as non-finite
                d = int(x.shape[1])
                acc = GeometryAccumulator(d, row_start=sample_start)
                reservoir = RowReservoir(opts.cosine_sample_rows, d, opts.seed, start=sample_start)
                for p in passes:
                    if p.d_in != d:
                        raise BadInputError(f"SAE {p.name!r} has d_in = {p.d_in} but the activations have d = {d}")
                if positions is not None and any(p.structure is not None for p in passes):
                    position = CovariateDirection(d)
            acc.add(x)
            if position is not None:
                position.add(x, positions)
            reservoir.add(x)
            row_log_frequency = None if log_frequency is None or ids is None else log_frequency[ids]
            for p in passes:
                p.add(x, positions, row_log_frequency)
            if bar is not None:
                bar.update(x.shape[0])
    if bar is not None:
        bar.close()
    n_skipped = rows.n_nonfinite_skipped - skipped_before
    if ctx is not None:
        acc, reservoir, n_skipped = _merge_ranks(acc, reservoir, passes, n_skipped)
    if acc is None or acc.n == 0:
        raise BadInputError("geometry_report: no rows were read (empty store, tensor or iterator?)")
    acc.n_nonfinite_skipped += n_skipped  # the rows were dropped before the accumulator saw them
    acc.to("cpu")  # the eigen-decompositions and read-outs below run on the float64 CPU copy
    seconds = time.perf_counter() - t0
    geometry = activation_geometry(acc, top_k_eigvecs=max(10, opts.artifact_components))
    geo = geometry.to_dict()
    # what sums cannot see, from the uniform row sample: the cone of centred rows, population splits
    top = torch.tensor(geo["top_eigenvectors"][0], dtype=torch.float64) if geo["top_eigenvectors"] else None
    sampled = json_safe(sample_diagnostics(reservoir.sample(), acc.mean, top))
    saes = [p.finish(geo, opts.thresholds, reservoir.sample(), opts.seed, position) for p in passes]
    withheld_notes = []
    for s in saes:
        if s.heldout is not None and n_skipped:  # a skipped row shifts every later index: the split is unknown
            s.heldout = None
            s.notes.append(f"no held-out figures: {n_skipped} non-finite row(s) skipped shift the rows' indices")
        s.splice = json_safe(dict(splice[s.name])) if splice and s.name in splice else None
        mismatch = next((f for f in flags if f.name == ACTIVATIONS_MISMATCH and f.subject == s.name), None)
        if mismatch is not None and mismatch.severity == "error":
            withheld_notes.append(_withhold(s, mismatch))
    artifact, artifact_note = _artifact_test(rows, geometry, opts, distributed=ctx is not None)
    source.update(d=acc.d, n_tokens=acc.n)

    whitening_cost = None
    if any(config_whitens(c) for c in [config] + [s.config for s in saes]):
        try:
            whitening_cost = Whitening.fit(acc, sample=reservoir.sample()).report.to_dict()
        except BadInputError as err:
            whitening_cost = {"error": str(err)}
    report = GeometryReport(
        schema_version=SCHEMA_VERSION,
        source=json_safe(source),
        activations=geo,  # the JSON-safe form, made the dataclass by __post_init__: a fresh report reads as a loaded one
        cosine_histogram=cosine_histogram(reservoir.sample(), opts.histogram_bins),
        saes=saes,
        flags=[],
        options=json_safe(opts.to_dict()),
        config=json_safe(dict(config)) if config else None,
        whitening_cost=whitening_cost,
        seconds=seconds,
        tokens_per_second=acc.n / seconds if seconds > 0 else None,
        saegeo_version=__version__,
        notes=[
            *geo.get("notes", []),
            *([artifact_note] if artifact_note else []),
            *notes,
            *withheld_notes,
            *closing_notes,
        ],
        artifact=artifact,
        sample_diagnostics=sampled,
        exclusions=store_exclusions(rows.store),
    )
    report.flags = _report_flags(report, flags, opts.thresholds)
    report.diagnosis = activation_diagnosis(flag_inputs(geo, artifact, sampled), report.flags, opts.thresholds)
    if opts.latent_cards and passes:  # after the flags: the cards are of the latents they name
        store, text, note = context_source(rows, n_skipped, ctx is not None and source["kind"] == "iterator")
        for s, p in zip(saes, passes):
            withheld = p.latents.fill(
                s,
                p.metrics,
                p.module.W_dec.detach().cpu(),
                named_latents(report.flags, s.name, opts.latents),
                store=store,
                text=text,
                context_tokens=opts.context_tokens,
                dense_frequency=opts.thresholds.dense_frequency,
                neighbour_table_max=opts.neighbour_table_max,
                note=note,
            )
            if withheld:  # which neighbour search ran is said where the user reads the report
                report.notes.append(f"SAE {s.name!r}: {withheld}")
        # again with the per-latent tables just filled (the latents stage), in the order a saved report re-flags
        report.flags = _report_flags(report, flags, opts.thresholds)
    return report


def token_log_frequency(store: Any, stop_row: int | None = None) -> Tensor | None:
    """log f_t = log(c_t / n) of every token id t, c_t its count among the n store rows a pass reads (the first
    ``stop_row``; ``ActivationStore.token_counts``: non-finite rows the pass skips still count); None without a store
    or token ids. Unseen ids get −inf and are never looked up."""
    counts = None if store is None else store.token_counts(stop_row)
    if counts is None or int(counts.sum()) == 0:
        return None
    return (counts.double() / float(counts.sum())).log()


def _fold_rows(total: int | None) -> int:
    """Contiguous rows per dark-matter fold block: 1,024, or fewer when the pass reads too few rows for every fold
    to get two blocks (a 4,096-row store would leave one fold empty)."""
    from saegeo.geometry.dark_matter import DEFAULT_FOLD_ROWS, DEFAULT_FOLDS

    return DEFAULT_FOLD_ROWS if not total else max(1, min(DEFAULT_FOLD_ROWS, total // (2 * DEFAULT_FOLDS)))


def latents_report(acts: Any, sae: Any, options: LatentsOptions | None = None, *, name: str | None = None) -> dict:
    """`saegeo latents`: one pass of ``sae`` over ``acts`` (its metrics, top-k and histograms only: no activation
    geometry, no flags) and the latents.json document with the cards of ``options.latents`` (or of the top
    ``options.top`` by ``options.by``) and the table of every latent."""
    from saegeo import __version__

    opts = options or LatentsOptions()
    module, cfg, default_name = _resolve_sae(sae)
    sae_name = name or default_name or "sae"
    d_sae = int(module.W_dec.shape[0])
    asked = parse_latent_ids(opts.latents, d_sae, sae_name)
    if not asked and opts.by == "nn_cos" and (not opts.neighbours or d_sae > opts.neighbour_table_max):
        raise BadInputError(
            f"--by nn_cos ranks every latent's nearest-neighbour cosine, which is not computed for SAE {sae_name!r} "
            f"({d_sae:,} latents; --no-neighbours or above --neighbour-table-max {opts.neighbour_table_max:,}): "
            f"pass --neighbour-table-max {d_sae} and not --no-neighbours (N²·d work), or rank by another column"
        )
    rows = open_rows(acts, verify=opts.verify, skip_nonfinite=opts.skip_nonfinite)
    with_positions = rows.store is not None or rows.window is not None  # position_corr, log_frequency_corr
    log_frequency = token_log_frequency(rows.store, opts.max_tokens) if with_positions else None
    batches, first_row = rows.batches(opts.batch_rows, stop_row=opts.max_tokens, metadata=with_positions)
    skipped_before = rows.n_nonfinite_skipped
    p = _SAEPass(sae_name, module, cfg, opts.device, latent_contexts=opts.contexts, first_row=first_row)
    bar = None
    if opts.progress:
        total = opts.max_tokens if opts.max_tokens is not None else rows.n_rows
        bar = progress_bar(total=total, unit="tok", unit_scale=True, desc="latents", dynamic_ncols=True)
    t0 = time.perf_counter()
    for batch in batches:
        batch, ids, positions = batch if with_positions else (batch, None, None)
        x = torch.as_tensor(batch).to(opts.device)
        if x.shape[-1] != p.d_in:
            raise BadInputError(f"SAE {sae_name!r} has d_in = {p.d_in} but the activations have d = {x.shape[-1]}")
        p.add(x, positions, None if log_frequency is None or ids is None else log_frequency[ids])
        if bar is not None:
            bar.update(x.shape[0])
    if bar is not None:
        bar.close()
    if p.metrics.n == 0:
        raise BadInputError("saegeo latents: no rows were read (empty store, tensor or iterator?)")
    seconds = time.perf_counter() - t0
    section = p.finish({}, opts.thresholds)
    store, text, note = context_source(rows, rows.n_nonfinite_skipped - skipped_before, False)
    if asked:
        why: Any = {i: [ASKED] for i in asked}
    else:
        why = lambda table: {i: [f"top:{opts.by}"] for i in top_by(table, opts.by, opts.top)}  # noqa: E731
    p.latents.fill(
        section,
        p.metrics,
        module.W_dec.detach().cpu(),
        why,
        store=store,
        text=text,
        context_tokens=opts.context_tokens,
        dense_frequency=opts.thresholds.dense_frequency,
        neighbours=opts.neighbours,
        neighbour_table_max=opts.neighbour_table_max,
        note=note,
    )
    return json_safe(
        {
            "schema_version": LATENTS_SCHEMA_VERSION,
            "kind": "latents",
            "saegeo_version": __version__,
            "source": {**rows.describe, "n_tokens": section.n_tokens},
            "options": opts.to_dict(),
            "seconds": seconds,
            "saes": [
                {
                    "name": sae_name,
                    "d_sae": d_sae,
                    "n_tokens": section.n_tokens,
                    "latent_info": section.latent_info,
                    "latents": section.latents,
                    "latent_table": section.latent_table,
                }
            ],
        }
    )


def _withhold(section: SAEGeometry, flag: Flag) -> str:
    """Set the metrics that ``flag`` (an activations_mismatch error) makes meaningless to None in ``section``;
    returns the note saying so (also added to the section's notes)."""
    for key in WITHHELD_METRICS:
        value = getattr(section, key)
        setattr(section, key, {k: None for k in value} if isinstance(value, dict) else None)
    section.withheld = list(WITHHELD_METRICS)
    section.heldout = None  # the same figures over fewer rows
    note = (
        f"withheld for {section.name}: {', '.join(WITHHELD_METRICS)} "
        f"({ACTIVATIONS_MISMATCH}: {', '.join(flag.evidence['causes'])})"
    )
    section.notes.append(note)
    return note


def _artifact_test(
    rows: Any, geometry: Any, opts: ReportOptions, *, distributed: bool
) -> tuple[dict | None, str | None]:
    """The artifact test needs token ids and positions: it runs (a second streamed pass) only on a store."""
    if opts.artifact_components < 1:
        return None, None
    if rows.store is None:
        return None, (
            f"artifact test not run: the source is a {rows.kind}, which has no token ids or positions "
            "(pass an activation store)"
        )
    from saegeo.report.store_measures import artifact_accumulator, artifact_pass, artifact_result

    if not distributed:
        return artifact_pass(
            rows, geometry, k=opts.artifact_components, batch_rows=opts.batch_rows, max_tokens=opts.max_tokens
        ), None
    if opts.max_tokens is not None:
        return None, "artifact test not run: max_tokens under torch.distributed (run it on one process)"
    from saegeo import distributed as dist

    ctx = dist.current()
    with dist.all_ranks_or_none("the artifact test"):
        part = artifact_accumulator(
            rows,
            geometry,
            k=opts.artifact_components,
            batch_rows=opts.batch_rows,
            rank=ctx.rank,
            world_size=ctx.world_size,
        )
    return artifact_result(dist.merge_across_ranks(part)), None


def _report_flags(report: GeometryReport, given: Sequence[Flag], t: FlagThresholds) -> list[Flag]:
    """The report's own flags (compute_flags), then those ``given`` from elsewhere (the verdict) it did not raise."""
    own = compute_flags(report, t)
    have = {(f.name, f.subject) for f in own}
    return sort_flags(own + [f for f in given if (f.name, f.subject) not in have])


def _latent_flags(s: SAEGeometry, t: FlagThresholds) -> list[Flag]:
    """The registry's latents stage on one SAE's per-latent table (none before the report fills it)."""
    if s.latent_table is None:
        return []
    return run_flags("latents", t, sae=FieldDict(s.to_dict(), fields_of(SAEGeometry), "SAEGeometry"))


def compute_flags(report: GeometryReport, thresholds: FlagThresholds | None = None) -> list[Flag]:
    """All flags of a report, from its numbers alone (so a saved report can be re-flagged), most severe first: the
    registry's activations, artifact, sae, latents and config stages (saegeo.report.flags)."""
    t = thresholds or report.thresholds()
    assumed = float(report.options.get("assumed_null", 0.0))
    geo = flag_inputs(report.activations.to_dict(), report.artifact, report.sample_diagnostics)
    flags = run_flags("activations", t, geo=geo, assumed_null=assumed, feeds_dictionary=bool(report.saes))
    flags += run_flags("artifact", t, artifact=report.artifact, subject="activations")
    for s in report.saes:
        section = FieldDict(s.to_dict(), fields_of(SAEGeometry), "SAEGeometry")
        own = run_flags("sae", t, sae=section, geo=geo)
        flags += [f for f in own if not (s.withheld and f.name in WITHHELD_FLAGS)]  # computed from withheld metrics
        flags += _latent_flags(s, t)
        flags += run_flags("config", t, config=s.config, geo=geo, whitening_cost=report.whitening_cost, subject=s.name)
    if report.config:
        flags += run_flags(
            "config", t, config=report.config, geo=geo, whitening_cost=report.whitening_cost, subject="config"
        )
    return sort_flags(flags)

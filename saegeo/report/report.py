"""geometry_report: one streaming pass over the activations (and any SAEs) -> GeometryReport.

Per batch x (rows never kept, memory independent of the number of tokens):
  * the activation GeometryAccumulator (offset, A, spectrum, MP, IsoScore, γ, rogue dims, sign null);
  * a reservoir sample of rows (Algorithm R, seeded) for the histogram of pairwise cosines;
  * per SAE: codes = encode(x) with decoder norms folded in (a_i·‖W_dec,i‖), fed to the amplification
    law's CodeMomentAccumulator (K = mean L0, q, r, per-latent firing and E[a_i], the mean-cosine ratio);
    Σ‖x − x̂‖² for FVE = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²; and the unit-vector sums of x̂ − b_dec, x − b_dec
    (and x, from the accumulator) whose mean pairwise cosines are A = (n‖m̂‖² − 1)/(n − 1).
After the pass: the dictionary geometry of the unit decoder rows u_i (A_dict, ‖ū‖², their own spectrum),
b_dec against μ, the three forms of the amplification law beside the three measured A's, cone shares
c_i = E[a_i](u_i·M)/‖M‖² (M = Σ E[a_i]u_i) and cos(u_i, μ); then the flags.

Public API
----------
``ReportOptions``                 batch size, token cap, cosine sample, thresholds, assumed null, ...
``GeometryReport`` / ``SAEGeometry``  dataclasses; ``to_dict``/``from_dict``, ``to_json``/``load`` (schema-versioned).
``geometry_report(acts, sae=None, *, batch_size=None, options=None, config=None) -> GeometryReport``
``compute_flags(report, thresholds=None) -> list[Flag]``  (re)flag a report from its numbers alone.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from saegeo.io import dump_json, json_safe, refuse_unknown_keys
from saegeo.activations.sources import open_rows
from saegeo.errors import BadInputError, FormatError
from saegeo.geometry import GeometryAccumulator, activation_geometry
from saegeo.geometry.accumulate import as_rows
from saegeo.geometry.amplification import (
    CodeMomentAccumulator,
    cone_shares,
    dictionary_anisotropy,
    exact_moment_prediction,
    mean_cosine_prediction,
    textbook_prediction,
)
from saegeo.geometry.measures import anisotropy_from_unit_mean
from saegeo.geometry.transforms import Whitening
from saegeo.sae.formats import CFG_FILENAME, load_dictionary
from saegeo.report.flags import (
    Flag,
    FlagThresholds,
    activation_flags,
    config_flags,
    config_whitens,
    sae_flags,
    sort_flags,
)

SCHEMA_VERSION = 1


# =========================================================================== options
@dataclass
class ReportOptions:
    """How the pass runs and how its numbers are read. All have sane defaults."""

    batch_size: int = 8192
    max_tokens: int | None = None  # stop after this many rows (None: all)
    cosine_sample_rows: int = 2048  # reservoir of rows for the pairwise-cosine histogram (k(k−1)/2 pairs)
    histogram_bins: int = 100
    skip_nonfinite: bool = False  # False: a NaN/inf row is an error naming batch and row; True: skip and count
    assumed_null: float = 0.0  # the baseline a reader compares A with unless told (wrong-null flag)
    seed: int = 0
    device: str = "cpu"  # where the SAEs encode
    progress: bool = True
    thresholds: FlagThresholds = field(default_factory=FlagThresholds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ReportOptions":
        d = refuse_unknown_keys(cls, d, "report option")
        if "thresholds" in d and not isinstance(d["thresholds"], FlagThresholds):
            d["thresholds"] = FlagThresholds.from_dict(d["thresholds"])
        return cls(**d)


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
    r: float | None  # E[a|a>0]²/E[a²|a>0]
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
    # the amplification law beside the measured A's
    amplification: dict[str, float | None]
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # the SAE spliced into the model (saegeo.sae.splice): CE loss clean/spliced/ablated, recovered, KL
    splice: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SAEGeometry":
        return cls(**dict(d))

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
    activations: dict[str, Any]  # ActivationGeometry.to_dict()
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
    # a store cached with exclusions: its manifest's rule and sums (what the excluded rows and the
    # first position carried: saegeo.activations.cache.exclusion_shares)
    exclusions: dict[str, Any] | None = None

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
        out["saes"] = [s.to_dict() for s in self.saes]
        out["flags"] = [f.to_dict() for f in self.flags]
        return json_safe(out)

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = 1) -> str:
        return dump_json(self.to_dict(), path, indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GeometryReport":
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
    def load(cls, path: str | os.PathLike) -> "GeometryReport":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as err:
            raise FormatError(f"{path}: cannot read a saegeo report ({err})") from None


# =========================================================================== streaming helpers
class _UnitMean:
    """Σ x/‖x‖ over nonzero rows: enough for A = (n‖m̂‖² − 1)/(n − 1) without a d×d gram."""

    def __init__(self, d: int):
        self.unit_sum = torch.zeros(d, dtype=torch.float64)
        self.n = 0

    def add(self, x: Tensor) -> None:
        norms = torch.linalg.vector_norm(x, dim=1)
        nonzero = norms > 0
        inv_norm = torch.where(nonzero, 1.0 / torch.where(nonzero, norms, 1.0), 0.0)
        self.unit_sum += (inv_norm @ x).to("cpu", torch.float64)  # one matvec per batch, as in the accumulator
        self.n += int(nonzero.sum())

    def anisotropy(self) -> float | None:
        return anisotropy_from_unit_mean(self.unit_sum / self.n, self.n) if self.n >= 2 else None


def _row_priority(seed: int, index: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random uint64 per (seed, global row index): splitmix64 of index·φ + splitmix64(seed)."""
    def splitmix(z: np.ndarray) -> np.ndarray:
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        salt = splitmix(np.array([seed % 2**64], dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
        return splitmix(index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + salt)


@dataclass
class _COO:
    """Nonzero codes of a batch (the shape CodeMomentAccumulator.add reads)."""

    n_rows: int
    rows: Tensor
    cols: Tensor
    values: Tensor


class _Reservoir:
    """Uniform sample of k rows from a stream, seeded; memory k·d.

    Bottom-k sampling: keep the k rows with the smallest priority h(seed, global row index). A row's
    priority depends only on its position in the stream, never on how the stream was cut, so partial
    samples merge exactly: ranks that each stream part of a store (torch.distributed, ``start`` = the
    global index of their first row) end with the single-process sample.
    """

    def __init__(self, k: int, d: int, seed: int, start: int = 0):
        self.k, self.d, self.seed, self.seen = int(k), int(d), int(seed), int(start)
        self.rows = torch.zeros(0, d, dtype=torch.float32)
        self.priority = np.zeros(0, dtype=np.uint64)

    def add(self, x: Tensor) -> None:
        m = x.shape[0]
        priority = _row_priority(self.seed, np.arange(self.seen, self.seen + m, dtype=np.uint64))
        self.seen += m
        if self.k == 0 or m == 0:
            return
        if len(self.priority) == self.k:  # full: only rows that beat the current k-th can enter
            take = priority < self.priority[-1]
            priority, x = priority[take], x[torch.from_numpy(take).to(x.device)]
        self._keep(np.concatenate([self.priority, priority]), torch.cat([self.rows, x.detach().to("cpu", torch.float32)]))

    def _keep(self, priority: np.ndarray, rows: Tensor) -> None:
        order = np.argsort(priority, kind="stable")[: self.k]  # sorted: the k smallest, in priority order
        self.priority, self.rows = priority[order], rows[torch.from_numpy(order)]

    def merge(self, other: "_Reservoir") -> "_Reservoir":
        """The sample of both streams together (their rows must have distinct global indices)."""
        self._keep(np.concatenate([self.priority, other.priority]), torch.cat([self.rows, other.rows]))
        self.seen = max(self.seen, other.seen)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"k": self.k, "d": self.d, "seed": self.seed, "seen": self.seen, "rows": self.rows,
                "priority": self.priority}

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, Any]) -> "_Reservoir":
        res = cls(sd["k"], sd["d"], sd["seed"], sd["seen"])
        res.rows, res.priority = sd["rows"].clone(), np.asarray(sd["priority"], dtype=np.uint64).copy()
        return res

    def sample(self) -> Tensor:
        return self.rows


def cosine_histogram(
    rows: Float[Tensor, "k d"], bins: int = 100
) -> dict[str, Any]:
    """Histogram over [−1, 1] of the k(k−1)/2 pairwise cosines of ``rows`` (zero rows dropped)."""
    x = rows.to(torch.float64)
    x = x[x.norm(dim=1) > 0]
    k = x.shape[0]
    edges = torch.linspace(-1.0, 1.0, bins + 1, dtype=torch.float64)
    if k < 2:
        return {"edges": edges.tolist(), "counts": [0] * bins, "n_rows": k, "n_pairs": 0, "sample_mean": None}
    unit = x / x.norm(dim=1, keepdim=True)
    iu = torch.triu_indices(k, k, offset=1)
    cos = (unit @ unit.T)[iu[0], iu[1]].clamp(-1.0, 1.0)
    counts = torch.histc(cos, bins=bins, min=-1.0, max=1.0)
    return {"edges": edges.tolist(), "counts": [int(c) for c in counts.tolist()], "n_rows": k,
            "n_pairs": int(cos.numel()), "sample_mean": float(cos.mean())}


# =========================================================================== SAEs
def _resolve_sae(obj: Any) -> tuple[Any, dict[str, Any], str | None]:
    """SAE object or directory -> (module with encode/decode/W_dec/b_dec, its config dict, default name)."""
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        module = load_dictionary(path)  # any format; a cfg.json it read is valid JSON
        cfg_file = path / CFG_FILENAME
        config: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        return module, config, path.name
    for attr in ("encode", "decode", "W_dec", "b_dec"):
        if not hasattr(obj, attr):
            raise BadInputError(
                f"geometry_report: the SAE object lacks {attr!r}; pass a saegeo/SAELens SAE or a directory"
            )
    cfg = getattr(obj, "cfg", None)
    if hasattr(cfg, "to_dict"):
        config = dict(cfg.to_dict())
    elif cfg is not None and hasattr(cfg, "__dataclass_fields__"):
        config = asdict(cfg)
    elif isinstance(cfg, Mapping):
        config = dict(cfg)
    else:
        config = {}
    return obj, config, None


def _named_saes(sae: Any) -> list[tuple[str, Any]]:
    if sae is None:
        return []
    if isinstance(sae, Mapping):
        return [(str(k), v) for k, v in sae.items()]
    if isinstance(sae, (list, tuple)):
        return [(f"sae{i}", s) for i, s in enumerate(sae)]
    return [("", sae)]


class _SAEPass:
    """The per-SAE part of the one pass (see the module docstring)."""

    def __init__(self, name: str, module: Any, config: dict[str, Any], device: str):
        self.name, self.module, self.config = name, module, config
        self.device = torch.device(device)
        if hasattr(module, "to"):
            module.to(self.device)
        w = module.W_dec.detach().to("cpu", torch.float64)
        self.d_sae, self.d_in = w.shape
        self.norms = w.norm(dim=1)
        self.alive_rows = self.norms > 0
        self.unit = torch.where(self.alive_rows[:, None], w / self.norms.clamp_min(1e-300)[:, None], 0.0)
        self.notes: list[str] = []
        n_zero = int((~self.alive_rows).sum())
        if n_zero:
            self.notes.append(f"{n_zero} decoder row(s) are zero: excluded from the dictionary geometry")
        self.a_dict, self.mean_sq_norm = dictionary_anisotropy(self.unit[self.alive_rows], normalize=False)
        self.b_dec = module.b_dec.detach().to(self.device, torch.float32)
        cfg = getattr(module, "cfg", None)
        self.rescaled = bool(getattr(cfg, "rescale_acts_by_decoder_norm", False))
        # saegeo TopK: encode_topk/decode_sparse give the same codes and x̂ without the dense code matrix
        self.sparse_topk = getattr(cfg, "activation", None) == "topk" and hasattr(module, "encode_topk") \
            and hasattr(module, "decode_sparse")
        self.fold = self.norms.to(self.device, torch.float32)
        self.codes = CodeMomentAccumulator(self.d_sae, mean_sq_norm=self.mean_sq_norm)
        self.recon_unit, self.centred_unit = _UnitMean(self.d_in), _UnitMean(self.d_in)
        self.sse, self.n = 0.0, 0

    @torch.inference_mode()
    def add(self, x: Tensor) -> None:
        x = x.to(self.device, torch.float32)
        # SAEs with input normalisation (OpenAI LayerNorm, SAELens layer_norm / constant_norm_rescale) decode in
        # the normalised space: the cone is measured there, the FVE on the denormalised reconstruction.
        x_normalized, norm_state = self.module.normalize_input(x) if hasattr(self.module, "normalize_input") \
            else (x, None)
        if self.sparse_topk:  # gather only the k active decoder rows: no (batch, d_sae) matrix at all
            values, indices = self.module.encode_topk(x)
            recon = self.module.decode_sparse(values, indices)
            folded = values if self.rescaled else values * self.fold[indices]
            rows = torch.arange(x.shape[0], device=x.device).repeat_interleave(indices.shape[1])
            self.codes.add(_COO(x.shape[0], rows.cpu(), indices.flatten().cpu(), folded.flatten().float().cpu()))
        else:
            codes = self.module.encode(x)
            recon = self.module.decode(codes)
            # the law's codes: the weights of the unit rows u_i in x̂ − b_dec
            folded = codes if self.rescaled else codes * self.fold
            self.codes.add(folded.float().cpu())
        self.recon_unit.add(recon - self.b_dec)
        self.centred_unit.add(x_normalized - self.b_dec)
        if norm_state is not None:
            recon = self.module.denormalize(recon, norm_state)
        self.sse += float((x - recon).square().sum(dtype=torch.float64))
        self.n += x.shape[0]

    def finish(self, acc: GeometryAccumulator, geo: dict[str, Any], thresholds: FlagThresholds) -> SAEGeometry:
        mu = acc.mean
        mu_norm = float(mu.norm())
        n, d = self.n, self.d_in
        centred_ss = geo["total_variance"] * n
        freq = self.codes.firing_frequency
        mean_code = self.codes.mean_code
        cos_mean = (self.unit @ mu) / mu_norm if mu_norm > 0 else torch.zeros(self.d_sae, dtype=torch.float64)
        notes = list(self.notes)
        try:
            shares = cone_shares(mean_code, self.unit, normalize=False).tolist()
        except BadInputError:
            shares = None
            notes.append("no latent fired: cone shares are undefined")
        # the dictionary's own spectrum, from the same accumulator as the activations'
        dict_acc = GeometryAccumulator(d, gram_dtype=torch.float64)
        dict_acc.add(self.unit[self.alive_rows])
        dgeo = activation_geometry(dict_acc, top_k_eigvecs=0)
        dictionary_spectrum = {k: dgeo.to_dict()[k] for k in (
            "eigenvalues", "top1_share", "top10_share", "effective_rank", "participation_ratio",
            "numerical_rank", "isoscore", "mp_upper_edge", "mp_lower_edge", "n_spikes", "noise_effective_rank",
            "offset", "anisotropy")}
        b = self.b_dec.to("cpu", torch.float64)
        K, q = self.codes.K, self.codes.q
        r = self.codes.r if self.codes.l0_sum > 0 else None
        amplification = {
            "K": K, "q": q, "r": r, "a_dict": self.a_dict, "mean_sq_norm": self.mean_sq_norm,
            "textbook": textbook_prediction(K, self.a_dict),
            "exact_moment": exact_moment_prediction(K, q, r, self.mean_sq_norm) if r is not None else None,
            "mean_cosine": mean_cosine_prediction(self.codes.expected_ratio, self.mean_sq_norm) if r is not None else None,
            "measured_recon_minus_b_dec": self.recon_unit.anisotropy(),
            "measured_x_minus_b_dec": self.centred_unit.anisotropy(),
            "measured_x": geo.get("anisotropy"),
        }
        cfg = getattr(self.module, "cfg", None)
        saegeo_block = self.config.get("saegeo", {}) if isinstance(self.config, Mapping) else {}
        norms = self.norms
        return SAEGeometry(
            name=self.name, d_in=d, d_sae=self.d_sae,
            architecture=getattr(cfg, "activation", None) or self.config.get("architecture"),
            k=getattr(cfg, "k", None) or self.config.get("k"),
            b_dec_init=saegeo_block.get("b_dec_init"),
            n_tokens=n,
            fve=1.0 - self.sse / centred_ss if centred_ss > 0 else None,
            mse=self.sse / (n * d),
            mean_l0=K, q=q, r=r,
            n_dead=int((freq == 0).sum()),
            n_dense=int((freq > thresholds.dense_frequency).sum()),
            firing_frequency=freq.tolist(), mean_activation=mean_code.tolist(),
            cos_decoder_mean=cos_mean.tolist(), cone_shares=shares,
            a_dict=self.a_dict, dict_mean_sq_norm=self.mean_sq_norm,
            decoder_norms={"min": float(norms.min()), "mean": float(norms.mean()), "max": float(norms.max()),
                           "std": float(norms.std()) if norms.numel() > 1 else 0.0},
            n_zero_decoder_rows=int((~self.alive_rows).sum()),
            dictionary_spectrum=dictionary_spectrum,
            b_dec_norm=float(b.norm()),
            b_dec_distance_to_mean=float((b - mu).norm()) / mu_norm if mu_norm > 0 else None,
            b_dec_cos_mean=float(b @ mu) / (float(b.norm()) * mu_norm) if mu_norm > 0 and float(b.norm()) > 0 else None,
            amplification=amplification,
            config=json_safe(self.config),
            notes=notes,
        )


# =========================================================================== the pass
def _nonfinite_rows(x: Tensor) -> Tensor:
    """Rows holding a NaN/inf. The row sums screen cheaply; only a non-finite sum is looked at entry-wise."""
    suspect = ~torch.isfinite(x.sum(dim=1))
    if not suspect.any():
        return suspect
    return (~torch.isfinite(x)).any(dim=1)


def _merge_ranks(
    acc: GeometryAccumulator | None, reservoir: _Reservoir | None, passes: list[_SAEPass], n_skipped: int
) -> tuple[GeometryAccumulator | None, _Reservoir | None, int]:
    """torch.distributed: combine every rank's partial pass in rank order (Chan's merge for the
    accumulators, float64 sums for the rest); every rank ends with the single-process totals."""
    from saegeo import distributed

    acc, reservoir = distributed.merge_across_ranks(acc), distributed.merge_across_ranks(reservoir)
    for p in passes:
        p.codes = distributed.merge_across_ranks(p.codes)
        for unit in (p.recon_unit, p.centred_unit):
            unit.unit_sum, unit.n = distributed.sum_across_ranks(unit.unit_sum), distributed.sum_across_ranks(unit.n)
        p.sse, p.n = distributed.sum_across_ranks(p.sse), distributed.sum_across_ranks(p.n)
    return acc, reservoir, distributed.sum_across_ranks(n_skipped)


def geometry_report(
    acts: Any,
    sae: Any = None,
    *,
    batch_size: int | None = None,
    options: ReportOptions | None = None,
    config: Mapping[str, Any] | None = None,
) -> GeometryReport:
    """One streaming pass over ``acts`` computing the activation geometry and, for each SAE, its codes,
    dictionary geometry, b_dec against μ, the amplification law and cone shares; then the flags.

    acts: (n, d) tensor/array | ActivationStore | store path | iterable of (m, d) batches (or of
    (activations, codes) tuples, e.g. ``SuperpositionGenerator.batches``).
    sae: None | SAE object (saegeo or SAELens-like: encode, decode, W_dec, b_dec) | directory |
    a mapping name -> either (several SAEs measured in the same pass, shown side by side).
    config: a preprocessing / run config; one that whitens before the SAE is flagged with its cost.
    Memory: O(d² + k_sample·d + Σ d_sae + batch), independent of the number of tokens.
    """
    from saegeo import __version__

    opts = options or ReportOptions()
    if batch_size is not None:
        opts = ReportOptions.from_dict({**asdict(opts), "thresholds": opts.thresholds, "batch_size": batch_size})
    if opts.batch_size < 1:
        raise BadInputError(f"batch_size must be ≥ 1, got {opts.batch_size}")
    from saegeo import distributed

    ctx = distributed.init_from_env()  # None unless launched by torchrun with several ranks
    with distributed.all_ranks_or_none("opening the activations"):
        rows = open_rows(acts)
        if ctx is not None and rows.store is not None:
            distributed.check_same_store(rows.store)
        batches, first_row = rows.batches(opts.batch_size, *((ctx.rank, ctx.world_size) if ctx else ()))
    source = dict(rows.describe)
    total = opts.max_tokens if opts.max_tokens is not None else rows.n_rows
    passes: list[_SAEPass] = []
    for name, obj in _named_saes(sae):
        module, cfg, default_name = _resolve_sae(obj)
        passes.append(_SAEPass(name or default_name or "sae", module, cfg, opts.device))

    acc: GeometryAccumulator | None = None
    reservoir: _Reservoir | None = None
    n_skipped = 0
    bar = None
    if opts.progress and (ctx is None or ctx.is_main):
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="tok", unit_scale=True, desc="report", dynamic_ncols=True)
    t0 = time.perf_counter()
    seen = first_row  # global row index (a rank's share starts at its first row)
    # an iterator under torch.distributed has no global row numbers: keep the ranks' sample indices apart
    sample_start = first_row if ctx is None or source["kind"] != "iterator" else ctx.rank << 40
    with distributed.all_ranks_or_none("streaming the activations"):  # a failing rank ends every rank
        for index, batch in enumerate(batches):
            x = as_rows(batch)
            if opts.max_tokens is not None:
                x = x[: max(0, opts.max_tokens - seen)]
            if x.shape[0] == 0:
                break
            if acc is None:
                d = int(x.shape[1])
                acc = GeometryAccumulator(d)
                reservoir = _Reservoir(opts.cosine_sample_rows, d, opts.seed, start=sample_start)
                for p in passes:
                    if p.d_in != d:
                        raise BadInputError(f"SAE {p.name!r} has d_in = {p.d_in} but the activations have d = {d}")
            bad = _nonfinite_rows(x)
            if bad.any():
                row = int(bad.nonzero()[0])
                if not opts.skip_nonfinite:
                    where = f" of {source['path']}" if source.get("path") else ""
                    raise BadInputError(
                        f"non-finite value (NaN or inf) in batch {index}{where}, row {row} (global row {seen + row}); "
                        f"{int(bad.sum())} such row(s) in this batch. Fix the producer, or pass skip_nonfinite=True "
                        "(CLI: --skip-nonfinite) to skip and count them."
                    )
                n_skipped += int(bad.sum())
                x = x[~bad]
            seen += int(bad.numel())
            acc.add(x)
            reservoir.add(x)
            for p in passes:
                p.add(x)
            if bar is not None:
                bar.update(int(bad.numel()))
            if opts.max_tokens is not None and seen >= opts.max_tokens:
                break
    if bar is not None:
        bar.close()
    if ctx is not None:
        acc, reservoir, n_skipped = _merge_ranks(acc, reservoir, passes, n_skipped)
    if acc is None or acc.n == 0:
        raise BadInputError("geometry_report: no rows were read (empty store, tensor or iterator?)")
    acc.n_nonfinite_skipped += n_skipped  # the rows were dropped before the accumulator saw them
    seconds = time.perf_counter() - t0
    geo = activation_geometry(acc).to_dict()
    saes = [p.finish(acc, geo, opts.thresholds) for p in passes]
    source.update(d=acc.d, n_tokens=acc.n)

    whitening_cost = None
    if any(config_whitens(c) for c in [config] + [s.config for s in saes]):
        try:
            whitening_cost = Whitening.fit(acc).report.to_dict()
        except BadInputError as err:
            whitening_cost = {"error": str(err)}
    report = GeometryReport(
        schema_version=SCHEMA_VERSION, source=json_safe(source), activations=geo,
        cosine_histogram=cosine_histogram(reservoir.sample(), opts.histogram_bins),
        saes=saes, flags=[], options=json_safe(opts.to_dict()),
        config=json_safe(dict(config)) if config else None, whitening_cost=whitening_cost,
        seconds=seconds, tokens_per_second=acc.n / seconds if seconds > 0 else None,
        saegeo_version=__version__, notes=list(geo.get("notes", [])),
        exclusions=_store_exclusions(rows.store),
    )
    report.flags = compute_flags(report, opts.thresholds)
    return report


def _store_exclusions(store: Any) -> dict[str, Any] | None:
    extra = getattr(store, "manifest", {}).get("extra", {}) if store is not None else {}
    if not extra.get("exclusion_rule") or not extra.get("excluded"):
        return None
    return json_safe({"exclusion_rule": extra["exclusion_rule"], "excluded": extra["excluded"]})


def add_splice(report: GeometryReport, results: Mapping[str, Mapping[str, Any]]) -> GeometryReport:
    """Attach `splice_eval_many` results (name -> result) to the report's SAE columns."""
    for s in report.saes:
        if s.name in results:
            s.splice = json_safe(dict(results[s.name]))
    return report


def compute_flags(report: GeometryReport, thresholds: FlagThresholds | None = None) -> list[Flag]:
    """All flags of a report, from its numbers alone (so a saved report can be re-flagged), most severe first."""
    t = thresholds or FlagThresholds.from_dict(report.options.get("thresholds"))
    assumed = float(report.options.get("assumed_null", 0.0))
    geo = report.activations
    flags = activation_flags(geo, thresholds=t, assumed_null=assumed, feeds_dictionary=bool(report.saes))
    for s in report.saes:
        flags += sae_flags(s.to_dict(), geo, thresholds=t)
        flags += config_flags(s.config, geo, report.whitening_cost, thresholds=t, subject=s.name)
    if report.config:
        flags += config_flags(report.config, geo, report.whitening_cost, thresholds=t, subject="config")
    return sort_flags(flags)

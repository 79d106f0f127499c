"""Ground-truth superposition: x = b + Σ_i a_i u_i + ε, streamed for any n, with the truth kept.

- Dictionary: N unit directions u_i = t·c + √(1−t²)·z_i in R^d, with c a random unit "common
  direction" and z_i random unit vectors orthogonal to c, so every u_i has cosine exactly t (the
  tilt) with c and A_dict ≈ t²; tilt 0 takes plain random unit vectors (full rank). A target A_dict is hit exactly by solving for t: since z̄ ⟂ c,
  ‖ū‖² = t² + (1−t²)‖z̄‖². ``dictionary="identity"`` takes u_i = e_i (N = d).
- Codes: feature i fires with probability q_i (one rate q, or Zipf-like q_i ∝ (i+1)^−s with mean
  q); magnitudes iid from Exp(1), |N(0,1)|, LogNormal(0, σ) or the constant 1. Optional
  co-firing groups: consecutive features 0..G·g−1 form G groups of g that fire together (one
  event per group, rate = the group's mean rate; magnitudes stay independent).
- Offset b: ‖b‖ = offset × RMS norm of the signal Σ a_i u_i, random direction. Noise ε: isotropic
  Gaussian with E‖ε‖² = (noise × RMS signal norm)².
- ``whiten=True`` outputs (x − E x)·W with W = Cov(x)^−1/2 (ZCA) from the exact population
  covariance: the "whitened" regime, the generative model (``truth``) is the one before W.

Rows are generated in fixed blocks of ``BLOCK_ROWS``, each from its own seed (seed, block index),
so row i is the same whatever the batch size, any range can be regenerated without the rows
before it, and nothing but the current block is held. Codes come as ``SparseCodes`` (COO: row,
feature, value of the nonzero entries), whose size scales with the number of active features,
not with N; ``.to_dense()`` gives the (B, N) matrix when that is affordable.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float, Int
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from saegeo.config import BATCH_ROWS, parse_dtype
from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import anisotropy_from_unit_mean
from saegeo.geometry.amplification import dictionary_anisotropy
from saegeo.io import atomic_write, dump_json
from saegeo.progress import progress_bar
from saegeo.synthetic.options import PRESETS, SyntheticConfig, preset  # noqa: F401  (re-exported: their old home)

BLOCK_ROWS = 1024
MAGNITUDES = ("exp", "half_normal", "log_normal", "constant")
_STREAM_DICTIONARY, _STREAM_ROWS = 0, 1


def magnitude_moments(law: str, log_normal_sigma: float = 1.0) -> tuple[float, float]:
    """E[a|a>0] and E[a²|a>0] of a magnitude law: Exp(1) 1, 2; |N(0,1)| √(2/π), 1;
    LogNormal(0, σ) e^{σ²/2}, e^{2σ²}; constant 1, 1. r = E[a]²/E[a²]."""
    if law == "exp":
        return 1.0, 2.0
    if law == "half_normal":
        return math.sqrt(2.0 / math.pi), 1.0
    if law == "log_normal":
        s2 = log_normal_sigma**2
        return math.exp(s2 / 2.0), math.exp(2.0 * s2)
    if law == "constant":
        return 1.0, 1.0
    raise BadInputError(f"unknown magnitude law {law!r}; choose one of {MAGNITUDES}")


def _seed(*keys: int) -> int:
    """A 63-bit torch seed from integer keys (independent streams per (seed, stream, block))."""
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def _generator(*keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*keys))


def _random_unit(n: int, d: int, gen: torch.Generator) -> Float[Tensor, "n d"]:
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return z / z.norm(dim=1, keepdim=True)


def _bernoulli_positions(n_rows: int, n_features: int, rate: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(row, feature) of the ones of an n_rows × n_features iid Bernoulli(rate) matrix, row-major order.

    Gaps between successive ones of a Bernoulli process are Geometric(rate): 1 + ⌊log U/log(1−rate)⌋.
    """
    total = n_rows * n_features
    log_keep = math.log1p(-rate)
    expected = total * rate
    chunks, reached = [], torch.tensor(-1, dtype=torch.float64)
    while True:
        draws = int(expected + 6 * math.sqrt(expected) + 16)
        u = 1.0 - torch.rand(draws, generator=gen, dtype=torch.float64)  # (0, 1]
        gaps = torch.floor(torch.log(u) / log_keep) + 1.0
        positions = reached + gaps.cumsum(0)
        chunks.append(positions)
        reached = positions[-1]
        if reached >= total:
            break
    positions = torch.cat(chunks)
    positions = positions[positions < total].long()
    return positions // n_features, positions % n_features


# --------------------------------------------------------------------------- codes
@dataclass
class SparseCodes:
    """Nonzero codes of a batch in COO form: ``values[j]`` is a[rows[j], cols[j]]; rows sorted."""

    n_rows: int
    n_features: int
    rows: Int[Tensor, " nnz"]
    cols: Int[Tensor, " nnz"]
    values: Float[Tensor, " nnz"]

    def to_dense(self) -> Float[Tensor, "B N"]:
        dense = torch.zeros(self.n_rows, self.n_features, dtype=self.values.dtype)
        dense[self.rows, self.cols] = self.values
        return dense

    @property
    def l0(self) -> Int[Tensor, " B"]:
        """Number of active features per row."""
        return torch.bincount(self.rows, minlength=self.n_rows)

    def slice(self, start: int, stop: int) -> SparseCodes:
        """Rows [start, stop) as their own batch."""
        lo, hi = torch.searchsorted(self.rows, torch.tensor([start, stop])).tolist()
        return SparseCodes(
            stop - start, self.n_features, self.rows[lo:hi] - start, self.cols[lo:hi], self.values[lo:hi]
        )

    @staticmethod
    def cat(parts: list[SparseCodes]) -> SparseCodes:
        offsets = np.cumsum([0] + [p.n_rows for p in parts[:-1]])
        return SparseCodes(
            sum(p.n_rows for p in parts),
            parts[0].n_features,
            torch.cat([p.rows + int(o) for p, o in zip(parts, offsets)]),
            torch.cat([p.cols for p in parts]),
            torch.cat([p.values for p in parts]),
        )


# --------------------------------------------------------------------------- truth
@dataclass
class SyntheticTruth:
    """The generative model behind the rows, with the population quantities the laws need."""

    config: SyntheticConfig
    dictionary: Float[Tensor, "N d"]  # unit rows u_i (float32, what the rows are made of)
    common_direction: Float[Tensor, " d"]  # c (zero for the identity dictionary)
    tilt: float  # the tilt actually used (solved when target_a_dict is set)
    a_dict: float  # mean pairwise cosine of the u_i
    mean_sq_norm: float  # ‖ū‖²
    rates: Float[Tensor, " N"]  # marginal firing probability q_i per feature
    groups: Int[Tensor, "G g"]  # feature indices of the co-firing groups (G may be 0)
    offset: Float[Tensor, " d"]  # b
    noise_std: float  # per-coordinate sd of ε
    signal_rms: float  # √E‖Σ a_i u_i‖²
    whitening: Float[Tensor, "d d"] | None = None  # W: outputs are (x − population_mean)·W
    population_mean: Float[Tensor, " d"] = field(default=None)  # type: ignore[assignment]  # E x before whitening

    @property
    def magnitude(self) -> str:
        return self.config.magnitude

    @property
    def magnitude_moments(self) -> tuple[float, float]:
        return magnitude_moments(self.config.magnitude, self.config.log_normal_sigma)

    @property
    def r(self) -> float:
        """E[a|a>0]²/E[a²|a>0] of the magnitude law."""
        m1, m2 = self.magnitude_moments
        return m1 * m1 / m2

    @property
    def K(self) -> float:
        """Expected number of active features per row, Σ q_i."""
        return float(self.rates.sum())

    @property
    def q(self) -> float:
        return self.K / self.rates.numel()

    @property
    def mean_code(self) -> Float[Tensor, " N"]:
        """E[a_i] = q_i·E[a|a>0]."""
        return self.rates.double() * self.magnitude_moments[0]

    def covariance(self) -> Float[Tensor, "d d"]:
        """Exact population covariance of x before whitening (float64):
        Uᵀ diag(Var a_i) U + Σ_groups Cov_g (s_g s_gᵀ − Σ_{i∈g} u_i u_iᵀ) + σ²I, s_g = Σ_{i∈g} u_i."""
        m1, m2 = self.magnitude_moments
        u = self.dictionary.double()
        q = self.rates.double()
        var = q * m2 - (q * m1) ** 2
        cov = u.T @ (var[:, None] * u)
        for members in self.groups:
            qg = float(q[members[0]])
            ug = u[members]
            sg = ug.sum(0)
            cov += qg * (1 - qg) * m1 * m1 * (torch.outer(sg, sg) - ug.T @ ug)
        cov += self.noise_std**2 * torch.eye(u.shape[1], dtype=torch.float64)
        return cov

    def save(self, path: str | os.PathLike) -> Path:
        """Write the truth as one safetensors file (tensors + the config as JSON metadata)."""
        path = Path(path)
        tensors = {
            "dictionary": self.dictionary.contiguous(),
            "common_direction": self.common_direction.contiguous(),
            "rates": self.rates.contiguous(),
            "groups": self.groups.contiguous(),
            "offset": self.offset.contiguous(),
            "population_mean": self.population_mean.contiguous(),
        }
        if self.whitening is not None:
            tensors["whitening"] = self.whitening.contiguous()
        meta = {
            "config": dump_json(asdict(self.config), indent=None),  # strict JSON, like every file saegeo writes
            "scalars": dump_json(
                dict(
                    tilt=self.tilt,
                    a_dict=self.a_dict,
                    mean_sq_norm=self.mean_sq_norm,
                    noise_std=self.noise_std,
                    signal_rms=self.signal_rms,
                    r=self.r,
                    K=self.K,
                ),
                indent=None,
            ),
            "format": "saegeo.synthetic.truth/1",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, safetensors_bytes(tensors, metadata=meta))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> SyntheticTruth:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != "saegeo.synthetic.truth/1":
            raise BadInputError(f"{path}: not a saegeo synthetic truth file (metadata format {meta.get('format')!r})")
        tensors = load_file(str(path))
        scalars = json.loads(meta["scalars"])
        return cls(
            config=SyntheticConfig(**json.loads(meta["config"])),
            dictionary=tensors["dictionary"],
            common_direction=tensors["common_direction"],
            tilt=scalars["tilt"],
            a_dict=scalars["a_dict"],
            mean_sq_norm=scalars["mean_sq_norm"],
            rates=tensors["rates"],
            groups=tensors["groups"],
            offset=tensors["offset"],
            noise_std=scalars["noise_std"],
            signal_rms=scalars["signal_rms"],
            whitening=tensors.get("whitening"),
            population_mean=tensors["population_mean"],
        )


def _rates(cfg: SyntheticConfig) -> Float[Tensor, " N"]:
    if not 0.0 < cfg.rate <= 1.0:
        raise BadInputError(f"rate must be in (0, 1], got {cfg.rate}")
    if cfg.rate_law == "uniform":
        return torch.full((cfg.n_features,), float(cfg.rate), dtype=torch.float64)
    if cfg.rate_law == "zipf":
        weights = torch.arange(1, cfg.n_features + 1, dtype=torch.float64) ** -cfg.zipf_exponent
        rates = weights * (cfg.rate * cfg.n_features / weights.sum())
        if rates.max() > 1.0:
            raise BadInputError(
                f"zipf rates with mean {cfg.rate} and exponent {cfg.zipf_exponent} give feature 0 a rate "
                f"{float(rates.max()):.3g} > 1; lower the rate or the exponent"
            )
        return rates
    raise BadInputError(f"rate_law must be 'uniform' or 'zipf', got {cfg.rate_law!r}")


def _tilted_dictionary(cfg: SyntheticConfig, gen: torch.Generator) -> tuple[Tensor, Tensor, float]:
    """Unit rows t·c + √(1−t²)·z_i with z_i ⟂ c; the tilt solved from target_a_dict if given."""
    n, d = cfg.n_features, cfg.d
    if d < 2:
        raise BadInputError("a tilted dictionary needs d >= 2")
    common = _random_unit(1, d, gen)[0]
    gaussian = torch.randn(n, d, generator=gen, dtype=torch.float64)
    z = gaussian - torch.outer(gaussian @ common, common)
    z /= z.norm(dim=1, keepdim=True)
    if cfg.target_a_dict is not None:
        target = float(cfg.target_a_dict)
        if not 0.0 < target < 1.0:
            raise BadInputError(f"target_a_dict must be in (0, 1), got {target}")
        z_mean_sq = float(z.mean(0).square().sum())
        target_mean_sq = (1.0 + (n - 1) * target) / n
        tilt_sq = (target_mean_sq - z_mean_sq) / (1.0 - z_mean_sq)
        if tilt_sq < 0.0:
            floor = anisotropy_from_unit_mean(z.mean(0), n)
            if abs(floor - target) > 0.05 * target:
                raise BadInputError(
                    f"target_a_dict={target:g} is below what {n} random directions in R^{d} give with no tilt "
                    f"({floor:.3g}); use a larger target or tilt=0"
                )
            tilt_sq = 0.0
        tilt = math.sqrt(tilt_sq)
    else:
        tilt = float(cfg.tilt)
        if not 0.0 <= tilt <= 1.0:
            raise BadInputError(f"tilt must be in [0, 1], got {tilt}")
    if tilt == 0.0:  # plain random directions: rows kept ⟂ c would span only d − 1 dimensions
        return gaussian / gaussian.norm(dim=1, keepdim=True), common, 0.0
    rows = tilt * common + math.sqrt(1.0 - tilt * tilt) * z
    return rows, common, tilt


class SuperpositionGenerator:
    """Seeded streaming source of (activations, codes) with known truth (see the module docstring)."""

    def __init__(self, config: SyntheticConfig | None = None, **overrides):
        cfg = replace(config or SyntheticConfig(), **overrides)
        if cfg.magnitude not in MAGNITUDES:
            raise BadInputError(f"unknown magnitude law {cfg.magnitude!r}; choose one of {MAGNITUDES}")
        if cfg.d < 1 or cfg.n_features < 2:
            raise BadInputError(f"need d >= 1 and n_features >= 2 (got d={cfg.d}, n_features={cfg.n_features})")
        self.config = cfg
        gen = _generator(cfg.seed, _STREAM_DICTIONARY)
        if cfg.dictionary == "identity":
            if cfg.n_features != cfg.d or cfg.tilt != 0.0 or cfg.target_a_dict is not None:
                raise BadInputError("the identity dictionary needs n_features == d and no tilt")
            rows64, common, tilt = torch.eye(cfg.d, dtype=torch.float64), torch.zeros(cfg.d, dtype=torch.float64), 0.0
        elif cfg.dictionary == "random":
            rows64, common, tilt = _tilted_dictionary(cfg, gen)
        else:
            raise BadInputError(f"dictionary must be 'random' or 'identity', got {cfg.dictionary!r}")
        rates = _rates(cfg)
        if cfg.n_groups * cfg.group_size > cfg.n_features or (cfg.n_groups and cfg.group_size < 2):
            raise BadInputError(
                f"{cfg.n_groups} co-firing groups of {cfg.group_size} need group_size >= 2 and at most "
                f"{cfg.n_features} features"
            )
        groups = torch.arange(cfg.n_groups * cfg.group_size).reshape(cfg.n_groups, cfg.group_size)
        for members in groups:  # a group fires as one event: its members share the group's mean rate
            rates[members] = rates[members].mean()
        dictionary = rows64.float()
        a_dict, mean_sq_norm = dictionary_anisotropy(dictionary)
        truth = SyntheticTruth(
            config=cfg,
            dictionary=dictionary,
            common_direction=common.float(),
            tilt=tilt,
            a_dict=a_dict,
            mean_sq_norm=mean_sq_norm,
            rates=rates.float(),
            groups=groups,
            offset=torch.zeros(cfg.d),
            noise_std=0.0,
            signal_rms=0.0,
        )
        # E‖Σ a_i u_i‖² = tr Cov + ‖E x‖², Cov without noise (noise_std is 0 here).
        signal_mean = truth.mean_code @ dictionary.double()
        m1, m2 = truth.magnitude_moments
        q = rates
        trace = float((q * m2 - (q * m1) ** 2).sum())
        for members in groups:
            ug = dictionary[members].double()
            qg = float(q[members[0]])
            trace += qg * (1 - qg) * m1 * m1 * (float(ug.sum(0).square().sum()) - len(members))
        truth.signal_rms = math.sqrt(trace + float(signal_mean.square().sum()))
        offset_direction = _random_unit(1, cfg.d, gen)[0]
        truth.offset = (cfg.offset * truth.signal_rms * offset_direction).float()
        truth.noise_std = cfg.noise * truth.signal_rms / math.sqrt(cfg.d)
        truth.population_mean = (signal_mean + truth.offset.double()).float()
        if cfg.whiten:
            eigval, eigvec = torch.linalg.eigh(truth.covariance())
            floor = eigval.max() * 1e-10  # a rank-deficient model (N < d, no noise) stays finite
            truth.whitening = ((eigvec / eigval.clamp_min(floor).sqrt()) @ eigvec.T).float()
        self.truth = truth
        self._dense_codes = float(rates.mean()) > 0.1  # dense matmul beats sparse above ~10% density
        # One sparse rate, no groups: draw only the firing positions (O(B·N·q) instead of O(B·N) work).
        self._uniform_sparse = cfg.rate_law == "uniform" and not cfg.n_groups and cfg.rate <= 0.1

    # ------------------------------------------------------------------ rows
    def block(self, index: int) -> tuple[Float[Tensor, "B d"], SparseCodes]:
        """Rows [index·BLOCK_ROWS, (index+1)·BLOCK_ROWS): activations and their codes."""
        cfg, truth = self.config, self.truth
        gen = _generator(cfg.seed, _STREAM_ROWS, index)
        n = BLOCK_ROWS
        if self._uniform_sparse:
            rows, cols = _bernoulli_positions(n, cfg.n_features, float(truth.rates[0]), gen)
        else:
            fires = torch.rand(n, cfg.n_features, generator=gen) < truth.rates
            if cfg.n_groups:
                grouped = cfg.n_groups * cfg.group_size
                events = torch.rand(n, cfg.n_groups, generator=gen) < truth.rates[truth.groups[:, 0]]
                fires[:, :grouped] = events.repeat_interleave(cfg.group_size, dim=1)
            rows, cols = fires.nonzero(as_tuple=True)
        values = self._magnitudes(rows.numel(), gen)
        codes = SparseCodes(n, cfg.n_features, rows, cols, values)
        if self._dense_codes:
            x = codes.to_dense() @ truth.dictionary
        else:  # gather-and-sum of the active rows only (as sparsify's decoder): ~K·d work per row
            starts = torch.zeros(n, dtype=torch.long)
            starts[1:] = codes.l0.cumsum(0)[:-1]
            x = torch.nn.functional.embedding_bag(
                cols, truth.dictionary, offsets=starts, per_sample_weights=values, mode="sum"
            )
        if cfg.offset:
            x += truth.offset
        if truth.noise_std:
            x += truth.noise_std * torch.randn(n, cfg.d, generator=gen)
        if truth.whitening is not None:
            x = (x - truth.population_mean) @ truth.whitening
        return x, codes

    def _magnitudes(self, n: int, gen: torch.Generator) -> Float[Tensor, " n"]:
        law = self.config.magnitude
        if law == "exp":
            return torch.empty(n).exponential_(1.0, generator=gen)
        if law == "half_normal":
            return torch.randn(n, generator=gen).abs_()
        if law == "log_normal":
            return torch.randn(n, generator=gen).mul_(self.config.log_normal_sigma).exp_()
        return torch.ones(n)

    def batches(
        self, n: int, batch_size: int = 4096, *, start: int = 0, progress: bool = False
    ) -> Iterator[tuple[Float[Tensor, "B d"], SparseCodes]]:
        """Yield rows [start, start + n) as (activations (B, d) float32, SparseCodes) batches.

        Only the current block and batch are held; the rows do not depend on ``batch_size``.
        """
        if n < 0 or start < 0 or batch_size < 1:
            raise BadInputError(f"need n >= 0, start >= 0, batch_size >= 1 (got {n}, {start}, {batch_size})")
        bar = None
        if progress:
            bar = progress_bar(total=n, unit="row", desc="synth", dynamic_ncols=True)
        stop = start + n
        pending_x: list[Tensor] = []
        pending_codes: list[SparseCodes] = []
        pending = 0
        for index in range(start // BLOCK_ROWS, -(-stop // BLOCK_ROWS)):
            x, codes = self.block(index)
            lo = max(start - index * BLOCK_ROWS, 0)
            hi = min(stop - index * BLOCK_ROWS, BLOCK_ROWS)
            pending_x.append(x[lo:hi])
            pending_codes.append(codes.slice(lo, hi))
            pending += hi - lo
            while pending >= batch_size or (pending and index * BLOCK_ROWS + hi == stop):
                take = min(batch_size, pending)
                x_all = torch.cat(pending_x) if len(pending_x) > 1 else pending_x[0]
                c_all = SparseCodes.cat(pending_codes) if len(pending_codes) > 1 else pending_codes[0]
                yield x_all[:take], c_all.slice(0, take)
                if bar is not None:
                    bar.update(take)
                pending -= take
                pending_x = [x_all[take:]] if pending else []
                pending_codes = [c_all.slice(take, take + pending)] if pending else []
        if bar is not None:
            bar.close()

    def activations(
        self, n: int, batch_size: int = 4096, *, start: int = 0, progress: bool = False
    ) -> Iterator[Float[Tensor, "B d"]]:
        """Only the activations of ``batches`` (what a store, a trainer or a report consumes)."""
        for x, _ in self.batches(n, batch_size, start=start, progress=progress):
            yield x

    def sample(self, n: int, *, start: int = 0) -> tuple[Float[Tensor, "n d"], SparseCodes]:
        """Rows [start, start + n) in memory (small n: tests and plots)."""
        if n < 1:
            raise BadInputError(f"sample needs n >= 1, got {n}")
        return next(self.batches(n, n, start=start))

    def write_safetensors(self, path: str | os.PathLike, n: int, *, dtype: str = "float32") -> Path:
        """Write n rows as one safetensors file (key ``activations``) and the truth beside it as
        ``<stem>.truth.safetensors``. The rows are held in memory: for large n use ``write_store``."""
        torch_dtype = getattr(torch, parse_dtype(dtype))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        x = torch.cat(list(self.activations(n, BATCH_ROWS))).to(torch_dtype)
        meta = {"synthetic": dump_json(asdict(self.config), indent=None)}
        atomic_write(path, safetensors_bytes({"activations": x}, metadata=meta))
        return self.truth.save(path.with_name(path.stem + ".truth.safetensors"))

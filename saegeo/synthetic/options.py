"""The options of `saegeo synth`: the generator's SyntheticConfig, its presets and SynthOptions (what is written).

Torch-free on purpose: the command line builds its flags from them and checks a value a user gave before torch is
imported (benchmarks/startup_bench.py). superposition.py generates from them (and re-exports them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from saegeo.config import StorageDtype, check, option, require_memory
from saegeo.errors import BadInputError


@dataclass
class SyntheticConfig:
    """Everything that defines a synthetic data set; the same config and seed give the same rows."""

    d: int = option(512, "activation dimension", low=1)
    n_features: int = option(4096, "dictionary size N", low=2)
    dictionary: Literal["random", "identity"] = option(
        "random", "random (tilted toward a common direction) or identity (u_i = e_i, N = d)"
    )
    tilt: float = option(0.0, "cosine of every u_i with the common direction c; A_dict ≈ tilt²", low=0, high=1)
    target_a_dict: float | None = option(
        None, "solve the tilt for this dictionary anisotropy A_dict (overrides tilt)", above=0, below=1
    )
    rate: float = option(0.02, "mean firing probability q", above=0, high=1)
    rate_law: Literal["uniform", "zipf"] = option("uniform", "per-feature firing rates")
    zipf_exponent: float = option(1.0, "exponent of the zipf rate law", low=0)
    magnitude: Literal["exp", "half_normal", "log_normal", "constant"] = option("exp", "magnitude law of active codes")
    log_normal_sigma: float = option(1.0, "σ of the log_normal magnitude law", above=0)
    n_groups: int = option(0, "co-firing groups of consecutive features", low=0)
    group_size: int = option(2, "features per co-firing group", low=1)
    offset: float = option(0.0, "‖b‖ relative to the RMS norm of Σ a_i u_i", low=0)
    noise: float = option(0.0, "RMS norm of ε relative to the RMS norm of Σ a_i u_i", low=0)
    whiten: bool = option(False, "whiten the rows (flat spectrum, zero mean)")
    seed: int = option(0, "seeds the dictionary and the rows", low=0)

    def __post_init__(self) -> None:
        check(self)
        # the dictionary is built in float64 and kept in float32 beside it
        require_memory(12 * self.d * self.n_features, f"a synthetic dictionary of {self.n_features} x {self.d}")


Preset = Literal["isotropic", "tilted", "large_offset", "dense_relu", "whitened"]

PRESETS: dict[str, dict] = {
    # Regimes the report must recognise. Each is a set of overrides of SyntheticConfig.
    "isotropic": dict(tilt=0.0),  # isotropic dictionary, sparse Exp codes: A = the sign null q/2
    "tilted": dict(tilt=0.3),  # tilted dictionary: the K·A_dict amplification
    "large_offset": dict(tilt=0.0, offset=3.0),  # a constant b three times the signal's norm
    "dense_relu": dict(dictionary="identity", rate=0.5, magnitude="half_normal"),  # x = ReLU(N(0, I))
    "whitened": dict(tilt=0.3, whiten=True),  # tilted superposition whitened: flat spectrum, zero mean
}


def preset(name: str, **overrides) -> SyntheticConfig:
    """A SyntheticConfig for a named regime (``PRESETS``), with any field overridden.

    For the identity dictionary N is set to d unless given. Overrides that are None are ignored
    (so CLI options left unset keep the preset's values).
    """
    if name not in PRESETS:
        raise BadInputError(f"unknown synthetic preset {name!r}; choose one of {sorted(PRESETS)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    fields = {**PRESETS[name], **given}
    if fields.get("dictionary") == "identity" and "n_features" not in given:
        fields["n_features"] = fields.get("d", SyntheticConfig.d)
    return SyntheticConfig(**fields)


@dataclass
class SynthOptions:
    """`saegeo synth`: the rows written and where; the generator's fields come from the preset (SyntheticConfig)."""

    n: int = option(help="number of rows (tokens)", low=1)
    out: str = option(help="store directory to create, or FILE.safetensors for one file (rows held in memory)")
    preset: Preset = option("isotropic", "regime; the SyntheticConfig options override it")
    dtype: StorageDtype = option("float32", "storage dtype")
    shard_rows: int = option(65536, "rows per shard", low=1)
    overwrite: bool = option(False, "replace an existing store at --out")

    def __post_init__(self) -> None:
        check(self)

"""Flags: each names one geometric pathology, with the numbers that show it and one sentence of advice.

Every flag is one module of this package, found by discovery (``pkgutil`` over the package: adding a flag is one new
file and its test). A module registers its flag with ``@flag(...)``: its name, the stage whose quantities it reads
(and which of them), its thresholds as an options dataclass (``saegeo.config.option`` fields with help text) and its
severity bands. The commands raise flags only through ``run_flags(stage, thresholds, **inputs)``:

  activations   ``ActivationGeometry.to_dict()`` (+ the row sample's diagnostics and the first position)  report, geometry
  artifact      ``ArtifactAccumulator.correlations()``                                       report, sweep, geometry
  sae           one SAE section of a report (``SAEGeometry.to_dict()``) against the activations     report, check --acts
  latents       one SAE section's per-latent table (``latent_table``), once the report has filled it  report, check --acts
  config        a run or SAE config that may whiten before the SAE                                report, check
  dictionary    what ``check_dictionary`` measured on the weights alone                check, check --acts, report --sae, latents
  match         what ``check --acts`` measured of the SAE on the rows (do they belong together?)      the same
  recorded      the SAE's recorded training metrics against the same rows                            the same

Every threshold of every flag is a field of one ``FlagThresholds`` generated from the registry (field names are
unique across it and start with their flag's words); the commands that raise flags take them as
``--<threshold-name>`` options and as a ``thresholds`` table of their config (docs/design.md, Flags).

Public API
----------
``Flag``                         name, severity (info | warning | error), evidence {str: number}, advice, latents, subject.
``flag(...)`` / ``FlagSpec``     register a flag function / what the registry holds about it.
``registry()``                   every FlagSpec, in run order (stage, then order).
``run_flags(stage, t, **inputs)``  the flags of one stage, in run order; ``raised_by(flag)`` the spec that raised one.
``thresholds_class()``           the generated FlagThresholds dataclass.
``flags_table()``                the flags table of docs/design.md, from the registry.
``activation_flags`` / ``artifact_flags`` / ``sae_flags`` / ``config_flags`` / ``dictionary_flags``  one stage each.
``flag_inputs`` / ``activation_diagnosis`` / ``config_whitens``   the activation stage's inputs, the diagnosis steps,
                                 which key of a config asks for whitening.

Torch-free on import (the command line builds its options from ``FlagThresholds`` before any tensor library loads):
the flag modules import torch inside their functions.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from saegeo.config import check, option

SEVERITIES = ("info", "warning", "error")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
STAGES = ("activations", "artifact", "sae", "latents", "config", "dictionary", "match", "recorded")

# Flag names (stable identifiers: tests, JSON and the renderers use them). A new flag may keep its name in its module.
MEAN_DIRECTION = "mean_direction_features"
OFFSET_NOT_ABSORBED = "offset_not_absorbed"
WHITENING = "whitening_misuse"
WRONG_NULL = "wrong_null"
AMPLIFICATION = "amplification_inconsistency"
DEAD = "dead_latents"
DENSE = "dense_latents"
RANK = "rank_deficiency"
BAD_ROWS = "bad_input_rows"
ARTIFACT = "artifact_direction"
OFFSET_CONE = "offset_dominated_cone"
INVISIBLE = "anisotropy_invisible_to_A"
MASSIVE = "massive_activations"
MIXED = "mixed_populations"
ACTIVATIONS_MISMATCH = "activations_mismatch"
# an activations_mismatch error withholds these metrics of the SAE section (None) and the flags computed from them
WITHHELD_METRICS = ("fve", "amplification", "cone_shares")
WITHHELD_FLAGS = (AMPLIFICATION, MEAN_DIRECTION)
FLAG_INPUT_EXTRAS = ("sample_diagnostics", "first_position")  # what flag_inputs adds to the activation geometry


@dataclass
class Flag:
    """One finding: what (name, summary), how bad (severity), the numbers (evidence), what to do (advice)."""

    name: str
    severity: str  # one of SEVERITIES
    evidence: dict[str, float | int | None]
    advice: str  # one sentence
    summary: str = ""  # one line with the key numbers, for the terminal
    latents: list[int] | None = None  # the guilty latents, most guilty first
    subject: str = "activations"  # "activations", an SAE's name, or "config"

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} not in {SEVERITIES}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Flag:
        return cls(**dict(d))


def sort_flags(flags: list[Flag]) -> list[Flag]:
    """Most severe first; stable otherwise (so the run order of the registry decides among equals)."""
    return sorted(flags, key=lambda f: -_RANK[f.severity])


def rounded(x: float | None, digits: int = 4) -> float | None:
    """Round for evidence (None and non-finite stay None)."""
    if x is None or not math.isfinite(float(x)):
        return None
    return round(float(x), digits) if abs(float(x)) >= 1e-3 else float(f"{float(x):.4g}")


def f3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


# =========================================================================== the registry
@dataclass
class CommonThresholds:
    """Thresholds every flag reads."""

    max_latents: int = option(20, "how many guilty latents a flag lists", low=0)


@dataclass(frozen=True)
class FlagSpec:
    """What the registry knows about one flag function."""

    name: str  # the flag it raises
    stage: str  # one of STAGES: which inputs it is given
    reads: tuple[str, ...]  # the quantities of its stage it reads
    options: type | None  # its thresholds (a dataclass of saegeo.config.option fields), or None
    bands: tuple[tuple[str, str], ...]  # (severity, when) for each severity it can take
    when: str  # when it fires, with the defaults (the "fires when" column of docs/design.md)
    order: int  # its place in the run order of its stage (the report lists flags most severe first, then this)
    run: Callable[..., Any]  # run(q, t) -> Flag | list[Flag] | None; q the stage's inputs, t the FlagThresholds
    label: str = ""  # the name as the table shows it, when a name has several specs ("whitening_misuse (config)")
    module: str = ""
    # dictionary stage: the activation-based flag of the same name replaces it when activations are read
    superseded_by_activations: bool = False


_SPECS: list[FlagSpec] = []


def flag(
    name: str,
    *,
    stage: str,
    reads: tuple[str, ...],
    bands: Mapping[str, str],
    when: str,
    order: int,
    options: type | None = None,
    label: str = "",
    superseded_by_activations: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated ``run(q, t)`` as flag ``name`` of ``stage`` (see the module docstring)."""
    if stage not in STAGES:
        raise ValueError(f"flag {name!r}: stage {stage!r} not in {STAGES}")
    if not bands or set(bands) - set(SEVERITIES):
        raise ValueError(f"flag {name!r}: bands {sorted(bands)} must be severities of {SEVERITIES}")

    def register(run: Callable[..., Any]) -> Callable[..., Any]:
        spec = FlagSpec(
            name=name,
            stage=stage,
            reads=tuple(reads),
            options=options,
            bands=tuple((s, bands[s]) for s in reversed(SEVERITIES) if s in bands),
            when=when,
            order=order,
            run=run,
            label=label,
            module=run.__module__,
            superseded_by_activations=superseded_by_activations,
        )
        _SPECS[:] = [s for s in _SPECS if (s.module, s.run.__name__) != (spec.module, run.__name__)] + [spec]
        return run

    return register


@functools.cache
def registry() -> tuple[FlagSpec, ...]:
    """Every registered flag, in run order: every module of this package not starting with ``_`` is imported."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    specs = sorted(_SPECS, key=lambda s: (STAGES.index(s.stage), s.order, s.name))
    seen: dict[tuple[str, int], str] = {}
    for s in specs:
        if (s.stage, s.order) in seen:
            raise ValueError(f"flags {seen[(s.stage, s.order)]!r} and {s.name!r} share order {s.order} in {s.stage}")
        seen[(s.stage, s.order)] = s.name
    return tuple(specs)


def specs_of(stage: str) -> tuple[FlagSpec, ...]:
    return tuple(s for s in registry() if s.stage == stage)


def threshold_fields() -> list[tuple[str, type | None, dataclasses.Field]]:
    """(owner flag, its options class, field) of every threshold: the common ones, then each flag's in run order.
    A name twice is refused (one home for each threshold); one options class may serve a family of flags."""
    out: list[tuple[str, type | None, dataclasses.Field]] = [
        ("", CommonThresholds, f) for f in dataclasses.fields(CommonThresholds)
    ]
    owner = {f.name: "all flags" for f in dataclasses.fields(CommonThresholds)}
    classes: set[type] = set()
    for spec in registry():
        if spec.options is None or spec.options in classes:
            continue
        classes.add(spec.options)
        for f in dataclasses.fields(spec.options):
            if f.name in owner:
                raise ValueError(f"threshold {f.name!r} of {spec.name} is already {owner[f.name]}'s")
            owner[f.name] = spec.name
            out.append((spec.name, spec.options, f))
    return out


def _copy(f: dataclasses.Field) -> dataclasses.Field:
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
    return dataclasses.field(default=f.default, metadata=f.metadata)


@functools.cache
def thresholds_class() -> type:
    """FlagThresholds: one field per threshold of every registered flag (``threshold_fields``), each checked against
    its bounds whenever one is made, and by its flag's options class where that adds a check (``__post_init__``)."""
    import typing

    rows = threshold_fields()
    fields = [(f.name, typing.get_type_hints(cls)[f.name], _copy(f)) for _, cls, f in rows]

    def __post_init__(self: Any) -> None:
        check(self)
        for cls in dict.fromkeys(cls for _, cls, _ in rows if cls is not CommonThresholds):
            cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    def to_dict(self: Any) -> dict[str, Any]:
        return asdict(self)

    cls = dataclasses.make_dataclass(
        "FlagThresholds",
        fields,
        namespace={"__post_init__": __post_init__, "to_dict": to_dict},
    )
    cls.__module__ = "saegeo.report.options"  # where it is bound: pickling and reprs find it there
    cls.__doc__ = (
        "Thresholds of every flag, generated from the registry (saegeo.report.flags). Defaults are conservative: "
        "a clean space or a healthy SAE raises nothing."
    )
    return cls


def run_flags(stage: str, thresholds: Any = None, **inputs: Any) -> list[Flag]:
    """The flags of ``stage`` on ``inputs`` (its quantities, see the module docstring), in run order."""
    t = thresholds if thresholds is not None else thresholds_class()()
    flags: list[Flag] = []
    for spec in specs_of(stage):
        for found in _as_list(spec.run(inputs, t)):
            found._raised_by = spec  # not a field: the JSON is unchanged; sae_verdict keeps flags by their stage
            flags.append(found)
    return flags


def raised_by(found: Flag) -> FlagSpec | None:
    """The registry entry that raised ``found`` in this process (None for a flag read back from JSON): one name may
    have several (``whitening_misuse`` of the inputs, of a config, folded into the weights)."""
    return getattr(found, "_raised_by", None)


def flags_table() -> str:
    """The flags table of docs/design.md: every flag, when it fires, its severity bands and its thresholds."""
    lines = ["| flag | fires when (defaults) | severity | thresholds (defaults) |", "|---|---|---|---|"]
    seen: set[type] = set()
    for spec in sorted(registry(), key=lambda s: (STAGES.index(s.stage), s.order)):
        opts = ""
        if spec.options is not None and spec.options not in seen:
            seen.add(spec.options)
            opts = ", ".join(f"`{f.name}` {_shown(f)}" for f in dataclasses.fields(spec.options))
        elif spec.options is not None:
            opts = "as above"
        bands = "; ".join(f"{s}: {w}" for s, w in spec.bands)
        lines.append(f"| `{spec.name}`{spec.label and ' ' + spec.label} | {spec.when} | {bands} | {opts} |")
    return "\n".join(lines)


def _shown(f: dataclasses.Field) -> str:
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return f"{value:g}" if isinstance(value, float) else str(value)


# =========================================================================== one stage each (the old entry points)
def _thresholds(thresholds: Any) -> Any:
    return thresholds if thresholds is not None else thresholds_class()()


def checked(geo: Mapping[str, Any] | None) -> Any:
    """The flags read ``geo`` through a FieldDict: a key no ActivationGeometry (or flag_inputs) carries raises."""
    from saegeo.geometry.measures import checked_geometry

    return None if geo is None else checked_geometry(geo, extra=FLAG_INPUT_EXTRAS)


def flag_inputs(
    activations: Mapping[str, Any],
    artifact: Mapping[str, Any] | None,
    sample_diagnostics: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``geo`` mapping the activation / SAE / config flags read: the activation geometry, the row sample's
    diagnostics (when a report drew one) and what position 0 carries (from the artifact pass over a store)."""
    return checked(
        {
            **activations,
            "sample_diagnostics": sample_diagnostics,
            "first_position": (artifact or {}).get("first_position"),
        }
    )


def activation_flags(
    geo: Mapping[str, Any], *, thresholds: Any = None, assumed_null: float = 0.0, feeds_dictionary: bool = False
) -> list[Flag]:
    """The activations stage (``geo`` = ``ActivationGeometry.to_dict()``). ``assumed_null``: the baseline a reader
    compares A with unless told (0); ``feeds_dictionary``: an SAE reads these activations."""
    return run_flags(
        "activations",
        _thresholds(thresholds),
        geo=checked(geo),
        assumed_null=assumed_null,
        feeds_dictionary=feeds_dictionary,
    )


def artifact_flags(
    artifact: Mapping[str, Any] | None, *, thresholds: Any = None, subject: str = "activations"
) -> list[Flag]:
    """The artifact stage (``artifact`` = ``ArtifactAccumulator.correlations()``)."""
    return run_flags("artifact", _thresholds(thresholds), artifact=artifact, subject=subject)


def sae_flags(sae: Mapping[str, Any], geo: Mapping[str, Any], *, thresholds: Any = None) -> list[Flag]:
    """The SAE stage: one SAE section of a report (``SAEGeometry.to_dict()``) against the activations' ``geo``."""
    return run_flags("sae", _thresholds(thresholds), sae=sae, geo=checked(geo))


def config_flags(
    config: Mapping[str, Any] | None,
    geo: Mapping[str, Any] | None = None,
    whitening_cost: Mapping[str, Any] | None = None,
    *,
    thresholds: Any = None,
    subject: str = "config",
) -> list[Flag]:
    """The config stage: a config that whitens before the SAE (``whitening_cost``: ``Whitening.fit(acc).report``)."""
    return run_flags(
        "config",
        _thresholds(thresholds),
        config=config,
        geo=checked(geo),
        whitening_cost=whitening_cost,
        subject=subject,
    )


def dictionary_flags(
    W_dec: Any,
    b_dec: Any = None,
    *,
    thresholds: Any = None,
    subject: str = "dictionary",
    norms: Any = None,
    block_rows: int = 4096,
) -> list[Flag]:
    """The dictionary-only mean-direction flag (latents whose unit decoder row is parallel to b_dec, or to ū when
    b_dec is zero), from the weights alone; ``saegeo.report.dictionary_check.check_dictionary`` runs the whole stage."""
    t = _thresholds(thresholds)
    q = {"W_dec": W_dec, "b_dec": b_dec, "subject": subject, "direction_norms": norms, "block_rows": block_rows}
    return [f for s in specs_of("dictionary") if s.name == MEAN_DIRECTION for f in _as_list(s.run(q, t))]


def _as_list(found: Any) -> list[Flag]:
    return [found] if isinstance(found, Flag) else list(found or [])


def config_whitens(config: Mapping[str, Any] | None) -> str | None:
    """The key path of a config that asks for whitening before the SAE, or None (see whitening_misuse)."""
    from saegeo.report.flags.whitening_misuse import config_whitens as whitens

    return whitens(config)


def activation_diagnosis(
    geo: Mapping[str, Any], flags: list[Flag] | None = None, thresholds: Any = None
) -> list[dict[str, Any]]:
    """The textbook's order — offset → shape → artifact → fix — as steps {step, finding, read: {name: number}}."""
    from saegeo.report.flags._diagnosis import activation_diagnosis as diagnosis

    return diagnosis(geo, flags, _thresholds(thresholds))


def __getattr__(name: str) -> Any:
    if name == "FlagThresholds":  # its old home
        return thresholds_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

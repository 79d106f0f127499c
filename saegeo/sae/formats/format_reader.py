"""What a format reader is, and the registry that finds them.

A reader module (one per library: saelens.py, sparsify.py, ...) calls `register_format(FormatReader(...))` at
import: its name, the reader function, the layout text that error messages show, how a folder or a lone file is
recognised as its own, the facts its files record beyond the shared `FormatInfo` fields (a dataclass), the SAELens
conversion functions (hub releases) whose files it reads, and, where the library has one, the reader of its SAE
objects in memory. `format_readers()` imports every module of saegeo.sae.formats once (pkgutil), so a new format
is one new module; a reader registered from anywhere else (a test, a notebook) is found the same way.
`SAE.load`, `saegeo check` and `saegeo report --sae` reach readers only through this registry.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from saegeo.errors import BadInputError, FormatError
from saegeo.sae.architectures import SAEConfig

PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt")


@dataclass
class FormatInfo:
    """What a loader read from a dictionary's files beyond its encode/decode: provenance, and the facts
    `saegeo check` needs about how its inputs must be prepared. None: the format does not say. What only one format
    records (a dictionary_learning dict_class, a sparsify normalize_decoder, ...) is its reader's `facts` dataclass,
    held in `facts` and read as an attribute of this record all the same (info.dict_class)."""

    format: str = "saegeo"  # a registered format's name ("saelens", "sparsify", ...; format_names()) or "saegeo"
    source: str | None = None  # the file or directory it was loaded from
    written_by: str | None = None  # "saegeo" for directories saegeo wrote
    model_name: str | None = None
    model_fingerprint: dict | None = None  # what the training store's model is (models.model_fingerprint)
    hook_name: str | None = None
    source_dtype: str | None = None  # dtype(s) of the stored weights (they are loaded as float32)
    hub_id: str | None = None  # the hub id it was resolved from (SAE.load("org/repo[/sub]" or a release id))
    release: dict | None = None  # a SAELens release id's {release, repo_id, path, registry: "saegeo" or the yaml}
    config_overrides: dict | None = None  # the release's config_overrides, applied as SAELens applies them
    # what the activations must be (SAELens metadata; `saegeo check --acts` compares them with the store)
    hook_head_index: int | None = None  # one attention head of a hook_z activation
    model_from_pretrained_kwargs: dict | None = None  # e.g. {"center_writing_weights": false}
    exclude_special_tokens: bool | list | None = None  # BOS / special-token rows left out of training
    prepend_bos: bool | None = None
    context_size: int | None = None
    expected_input_norm: float | None = None  # E‖x‖ of the training inputs (Llama Scope's norm of "in")
    normalize_activations: str | None = None  # SAELens: inputs must be scaled by a factor the files may not hold
    folded_scaling_factor: dict[str, float] | None = None  # {min, max} of a finetuning factor folded into W_dec
    # what training recorded about itself (SAELens metadata l0, num_dead_features, explained_variance; k of a
    # BatchTopK saved as JumpReLU): `saegeo check --acts` holds them against the rows
    recorded_metrics: dict | None = None
    transcoder: bool = False  # reconstructs another activation than it reads (no b_dec subtraction)
    threshold: float | None = None  # one global inference threshold (BatchTopK / Matryoshka)
    threshold_unset: bool = False  # that threshold is -1: never set in training, codes are dense
    training_k: int | None = None  # BatchTopK k used in training (inference uses the threshold)
    facts: Any = None  # the format's own facts (its FormatReader.facts dataclass), or None

    def __getattr__(self, name: str) -> Any:
        # only reached for names that are not fields: a format's own fact, or that fact's default when this
        # dictionary is of another format (info.dict_class is None for a SAELens SAE)
        if name.startswith("__") or name == "facts":
            raise AttributeError(name)
        facts = self.__dict__.get("facts")
        if facts is not None and name in {f.name for f in dataclasses.fields(facts)}:
            return getattr(facts, name)
        for reader in format_readers():
            for f in dataclasses.fields(reader.facts) if reader.facts is not None else ():
                if f.name == name:
                    return None if f.default is dataclasses.MISSING else f.default
        raise AttributeError(f"FormatInfo has no field or format fact {name!r}")

    def to_dict(self) -> dict:
        """The fields that are set (not None / False), the format's own facts among them, for reports."""
        found = {k: getattr(self, k) for k in (f.name for f in dataclasses.fields(self)) if k != "facts"}
        if self.facts is not None:
            found.update(asdict(self.facts))
        return {k: _plain(v) for k, v in found.items() if v is not None and v is not False}


def _plain(value: Any) -> Any:
    return asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


@dataclass
class Dictionary:
    """What a reader returns: the SAEConfig, its tensors by SAE attribute name (W_enc (d_in, d_sae), W_dec
    (d_sae, d_in), b_enc, b_dec[, threshold]; any float dtype, checked finite) and what the files said.
    `saegeo.sae.model.SAE.load` builds the SAE from it."""

    cfg: SAEConfig
    tensors: dict[str, Any]
    info: FormatInfo


@dataclass(frozen=True)
class FormatReader:
    """One published format, as its module registers it.

    name           FormatInfo.format of what it reads ("saelens")
    read           read(path) -> Dictionary, path the folder or the file detection named
    layout         the files, for messages: "saelens: cfg.json + sae_weights.safetensors"
    files          one SAE's files inside its folder (a hub release downloads these; given as a path, any of them
                   that is not a pickle stands for its folder)
    marker         the files whose presence makes a folder this format (default: all of `files`)
    claims_folder  claims_folder(names in the folder) -> bool, replacing `marker` where a name test is not enough
    claims_file    claims_file(path, state_keys) -> 0 (not this format) or how sure (1 a weak guess, 2 the
                   format's own keys, 3 certain) for a lone file; state_keys() reads a pickle's keys once
    facts          a dataclass of what only this format's files record (FormatInfo.facts)
    conversions    SAELens conversion_func names (None: SAELens' own loader) whose release files this reads
    releases       releases() -> {release name: hub.release_entry(...)}: the releases saegeo knows without sae_lens
    read_release   read_release(path, config_overrides) where the release's overrides change how files are read
    read_object    read_object(obj) -> Dictionary or None: the library's SAE object in memory
    object_kinds   what read_object accepts, for the message when nothing does
    priority       detection order (lower first; ties of claims_file go to the lower)"""

    name: str
    read: Callable[[Path], Dictionary]
    layout: str
    files: tuple[str, ...] = ()
    marker: tuple[str, ...] | None = None
    claims_folder: Callable[[set[str]], bool] | None = None
    claims_file: Callable[[Path, Callable[[], set[str]]], int] | None = None
    facts: type | None = None
    conversions: tuple[str | None, ...] = ()
    releases: Callable[[], dict[str, dict]] | None = None
    read_release: Callable[[Path, dict], Dictionary] | None = None
    read_object: Callable[[Any], Dictionary | None] | None = None
    object_kinds: str = ""
    priority: int = 100

    def claims(self, names: set[str]) -> bool:
        """Whether a folder holding these file names is in this format."""
        if self.claims_folder is not None:
            return self.claims_folder(names)
        needed = self.marker if self.marker is not None else self.files
        return bool(needed) and set(needed) <= names


_READERS: dict[str, FormatReader] = {}
_DISCOVERED: list[bool] = []


def register_format(reader: FormatReader) -> FormatReader:
    """Make `reader` the reader of its format (registering a name again replaces it: a test or a notebook
    redefining it). Its facts may not reuse a FormatInfo field name, nor a conversion another format reads."""
    if not reader.name.isidentifier():
        raise BadInputError(f"format name {reader.name!r} must be an identifier")
    shared = {f.name for f in dataclasses.fields(FormatInfo)}
    own = {f.name for f in dataclasses.fields(reader.facts)} if reader.facts is not None else set()
    if own & shared:
        raise BadInputError(f"format {reader.name}: facts {sorted(own & shared)} are FormatInfo fields already")
    for other in _READERS.values():
        taken = set(other.conversions) & set(reader.conversions)
        if other.name != reader.name and taken:
            raise BadInputError(f"format {reader.name}: conversion(s) {sorted(map(str, taken))} are {other.name}'s")
    _READERS[reader.name] = reader
    return reader


def unregister_format(name: str) -> None:
    """Remove a registered format (a test's or a notebook's)."""
    _READERS.pop(name, None)


def format_readers() -> tuple[FormatReader, ...]:
    """Every registered reader, in detection order; the first call imports each module of saegeo.sae.formats
    (pkgutil), each registering its own."""
    if not _DISCOVERED:
        _DISCOVERED.append(True)
        package = importlib.import_module("saegeo.sae.formats")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    return tuple(sorted(_READERS.values(), key=lambda r: (r.priority, r.name)))


def format_names() -> tuple[str, ...]:
    """The registered formats' names, in detection order."""
    return tuple(r.name for r in format_readers())


def get_format(name: str) -> FormatReader:
    """The reader registered as `name`; FormatError listing the registered ones otherwise."""
    found = {r.name: r for r in format_readers()}
    if name not in found:
        raise FormatError(f"unknown dictionary format {name!r}; registered: {', '.join(found)}")
    return found[name]


def expected_layouts() -> str:
    """Every registered layout, for the messages that say what a dictionary must look like."""
    return "; ".join(r.layout for r in format_readers())

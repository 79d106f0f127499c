"""Dictionary files: saegeo's own SAE directories and the published formats, one reader module per library.

  saelens              SAELens layout (any version), also what `SAE.save` writes          saelens.py
  sparsify             EleutherAI sparsify                                                sparsify.py
  dictionary_learning  saprmarks/dictionary_learning                                      dictionary_learning.py
  gemma_scope_npz / _2 Gemma Scope params.npz, Gemma Scope 2 params.safetensors            gemma_scope.py
  llama_scope          OpenMOSS lm-saes                                                   llama_scope.py
  goodfire             Goodfire .pth                                                      goodfire.py
  openai               openai/sparse_autoencoder                                          openai.py

Each reader returns a `Dictionary` (SAEConfig, tensors in the SAELens layout, FormatInfo) with its library's own
encode/decode (see base.py); `read_dictionary` detects the format of a path (or resolves a hub id, hub.py) and
reads it; `object_dictionary` reads the same from a peer library's SAE object in memory (SAELens, sparsify,
dictionary_learning); `saegeo.sae.model.SAE.load` builds the SAE from either.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.formats.base import EXPECTED_LAYOUTS, Dictionary, FormatInfo, read_json, read_pickle
from saegeo.sae.formats.dictionary_learning import (
    DICTIONARY_LEARNING_CLASSES,
    dictionary_learning_state_dictionary,
    read_dictionary_learning,
)
from saegeo.sae.formats.gemma_scope import read_gemma_scope_2, read_gemma_scope_npz
from saegeo.sae.formats.goodfire import read_goodfire
from saegeo.sae.formats.hub import HUB_RELEASES, HubDictionary, download_hub_dictionary, resolve_hub_id
from saegeo.sae.formats.llama_scope import read_llama_scope
from saegeo.sae.formats.openai import read_openai
from saegeo.sae.formats.saelens import (
    CFG_FILENAME,
    COMMIT_FILENAME,
    WEIGHTS_FILENAME,
    read_saelens,
    saelens_state_dictionary,
)
from saegeo.sae.formats.sparsify import read_sparsify, sparsify_state_dictionary

__all__ = [
    "CFG_FILENAME",
    "WEIGHTS_FILENAME",
    "HUB_RELEASES",
    "LOADERS",
    "Dictionary",
    "FormatInfo",
    "HubDictionary",
    "OBJECT_KINDS",
    "detect_format",
    "object_dictionary",
    "read_dictionary",
    "resolve_hub_id",
    "download_hub_dictionary",
]

_INFO_FIELDS = {f.name for f in dataclasses.fields(FormatInfo)} - {"format", "source", "written_by", "hub_id"}
LOADERS: dict[str, Callable[[str | os.PathLike], Dictionary]] = {
    "saelens": read_saelens,
    "sparsify": read_sparsify,
    "dictionary_learning": read_dictionary_learning,
    "gemma_scope_npz": read_gemma_scope_npz,
    "gemma_scope_2": read_gemma_scope_2,
    "llama_scope": read_llama_scope,
    "goodfire": read_goodfire,
    "openai": read_openai,
}


def _detect_file(p: Path) -> str:
    name = p.name
    if name.endswith(".npz"):
        return "gemma_scope_npz"
    if name in (
        WEIGHTS_FILENAME,
        "sae.safetensors",
        CFG_FILENAME,
        "config.json",
        "params.safetensors",
        "hyperparams.json",
    ):
        return _detect_dir(p.parent)
    if p.suffix in (".pt", ".pth", ".ckpt"):
        if (p.parent / "config.json").is_file() and "trainer" in read_json(p.parent / "config.json"):
            return "dictionary_learning"
        keys = set(read_pickle(p))
        if {"pre_bias", "latent_bias"} & keys:
            return "openai"
        if "encoder_linear.weight" in keys:
            return "goodfire"
        if {"ae", "optimizer"} <= keys:
            return "dictionary_learning"  # a training backup: refused there by name
        if keys & {"encoder.weight", "W_enc", "decoder.weight", "W_dec"}:
            return "dictionary_learning"
        raise FormatError(
            f"{p}: a state dict with keys {sorted(keys)[:12]} matches no known dictionary; expected {EXPECTED_LAYOUTS}"
        )
    raise FormatError(f"{p}: unknown dictionary file type; expected {EXPECTED_LAYOUTS}")


def _detect_dir(d: Path) -> str:
    names = {p.name for p in d.iterdir()}
    if CFG_FILENAME in names and WEIGHTS_FILENAME in names or COMMIT_FILENAME in names:  # (a save to finish)
        return "saelens"
    if CFG_FILENAME in names and "sae.safetensors" in names:
        return "sparsify"
    if "ae.pt" in names:
        return "dictionary_learning"
    if "params.npz" in names:
        return "gemma_scope_npz"
    if "params.safetensors" in names:
        return "gemma_scope_2"
    if "hyperparams.json" in names:
        return "llama_scope"
    pts = sorted(n for n in names if n.endswith((".pt", ".pth")))
    if len(pts) == 1:
        return _detect_file(d / pts[0])
    nested = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        try:
            nested.append(f"{sub.name} ({_detect_dir(sub)})")
        except FormatError:
            continue
    if nested:
        raise FormatError(
            f"{d} holds {len(nested)} dictionaries: {', '.join(nested[:20])}{' ...' if len(nested) > 20 else ''}; pass one of them"
        )
    raise FormatError(
        f"{d}: found {sorted(names)[:30] or 'an empty directory'}, which matches no dictionary layout; expected {EXPECTED_LAYOUTS}"
    )


def detect_format(path: str | os.PathLike) -> str:
    """The published format of a dictionary file or directory, one of the keys of LOADERS, from the file names
    and (for a lone .pt) its keys; FormatError says what was found and what was expected."""
    p = Path(path)
    if not p.exists():
        raise FormatError(f"{p}: does not exist")
    return _detect_file(p) if p.is_file() else _detect_dir(p)


def _refuse_missing_local_path(path: Path) -> None:
    """A path whose folder exists here (out/nonexistent_typo with out/ present) is a local path that is missing, not a
    hub id: said before any hub lookup, with what that folder holds."""
    parent = path.parent
    if str(parent) in ("", ".") or not parent.is_dir():
        return
    near = sorted(p.name for p in parent.iterdir())[:8]
    raise FormatError(
        f"{path}: does not exist ({parent}/ does, holding {', '.join(near) if near else 'nothing'}"
        f"{' …' if len(near) == 8 else ''}); check the path (it is not read as a hub id: its folder is local)"
    )


def read_dictionary(path: str | os.PathLike) -> Dictionary:
    """The dictionary at `path`, in any supported format (auto-detected): a local file or directory, or a hub id
    (see `resolve_hub_id`: org/repo[/subfolder], or a SAELens RELEASE/sae_id) fetched through the Hugging Face
    cache. A release is read by the reader of its conversion function, with its config_overrides applied as
    SAELens applies them. Its `info` records the format, the source and the config facts `saegeo check` reads."""
    if Path(path).exists():
        return LOADERS[detect_format(path)](path)
    _refuse_missing_local_path(Path(path))
    hub = resolve_hub_id(str(path))
    if hub is None:
        raise FormatError(
            f"{path}: does not exist, and is not a hub id (org/repo[/subfolder], or RELEASE/sae_id "
            "for a SAELens release such as gpt2-small-res-jb/blocks.8.hook_resid_pre)"
        )
    local = download_hub_dictionary(hub)
    fmt = hub.reader or detect_format(local)
    overrides = hub.config_overrides
    found = read_saelens(local, overrides) if fmt == "saelens" else LOADERS[fmt](local)
    info = found.info
    info.hub_id = str(path)
    if hub.release:
        info.release = {"release": hub.release, "repo_id": hub.repo_id, "path": hub.subfolder, "registry": hub.registry}
        if fmt != "saelens":  # the SAELens reader applied them to the config it read; here, to what the files said
            for key, value in overrides.items():
                if key in _INFO_FIELDS:
                    setattr(info, key, value)
        info.config_overrides = overrides or None
    layer = next((m.group(1) for m in re.finditer(r"(?:^|/)layer_(\d+)", hub.subfolder)), None)
    if hub.model_name and not info.model_name:
        info.model_name = hub.model_name
    if hub.hook_template and layer is not None:
        info.hook_name = hub.hook_template.format(layer=int(layer))
    return found


OBJECT_KINDS = (
    "saegeo's SAE, a path or hub id, SAELens' SAE classes (cfg.to_dict() and W_enc/W_dec/b_enc/b_dec), "
    "sparsify's SparseCoder (cfg, d_in, encoder, W_dec, b_dec) or a dictionary_learning dictionary "
    f"({', '.join(DICTIONARY_LEARNING_CLASSES)})"
)


def _state(obj) -> dict:
    return {k: v.detach().cpu() for k, v in obj.state_dict().items()}


def object_dictionary(obj) -> Dictionary | None:
    """A peer library's SAE object in memory -> the Dictionary its saved files would give, read by the same reader
    as those files; None when `obj` is none of them. Recognised by the attribute layout each library defines:

      SAELens     obj.cfg.to_dict() (architecture, d_in, d_sae, metadata, ...) and W_enc, W_dec, b_enc, b_dec: the
                  config and state dict that `save_model` writes (process_state_dict_for_saving), or for a training
                  SAE the inference form `save_inference_model` writes (process_state_dict_for_saving_inference,
                  cfg.get_inference_sae_cfg_dict(): BatchTopK becomes JumpReLU with its threshold)
      sparsify    obj.cfg (SparseCoderConfig), obj.d_in, obj.encoder (nn.Linear), W_dec, b_dec: `save_to_disk`'s
                  {**cfg.to_dict(), "d_in": d_in} and state dict
      dictionary_learning  an instance of one of its dictionary classes (by class name): its state dict, as ae.pt
    """
    import dataclasses

    name = type(obj).__name__
    where = f"in memory: {name}"
    cfg = getattr(obj, "cfg", None)
    if not hasattr(obj, "state_dict"):
        return None
    if cfg is not None and hasattr(cfg, "to_dict") and hasattr(obj, "W_enc") and hasattr(obj, "b_dec"):
        state = dict(obj.state_dict())
        if hasattr(obj, "process_state_dict_for_saving_inference") and hasattr(cfg, "get_inference_sae_cfg_dict"):
            obj.process_state_dict_for_saving_inference(state)
            raw = dict(cfg.get_inference_sae_cfg_dict())
        else:
            if hasattr(obj, "process_state_dict_for_saving"):
                obj.process_state_dict_for_saving(state)
            raw = dict(cfg.to_dict())
        weights = {k: v.detach().cpu() for k, v in state.items()}
        return saelens_state_dictionary(raw, weights, where, where)
    if cfg is not None and hasattr(obj, "encoder") and hasattr(obj, "W_dec") and hasattr(obj, "d_in"):
        raw_cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
        return sparsify_state_dictionary({**raw_cfg, "d_in": obj.d_in}, _state(obj), where, where, where)
    if name in DICTIONARY_LEARNING_CLASSES:
        return dictionary_learning_state_dictionary(_state(obj), {}, where, where, dict_class=name)
    return None

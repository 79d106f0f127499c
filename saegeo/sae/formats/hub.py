"""Hub ids: "org/repo[/subfolder]" and SAELens release ids ("RELEASE/sae_id"), resolved through the Hugging Face cache.

A SAELens release id is looked up as `SAE.from_pretrained(release, sae_id)` looks it up: in the registry of an
installed sae_lens (its own pretrained_saes.yaml, read without importing sae_lens) when there is one, else in
saegeo's table of the commonly used releases (SAELENS_RELEASES: gpt2-small-res-jb, Gemma Scope and Gemma Scope 2,
Llama Scope, pythia-70m-deduped): the release gives the repo, each sae_id its path in it (`saes_map`), the
conversion function names the layout (read by that layout's reader, CONVERSIONS), and `config_overrides` are
applied to the config read from the files, as SAELens' cfg_dict.update(config_overrides) applies them (e.g.
gpt2-small-res-jb's model_from_pretrained_kwargs.center_writing_weights = true).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saegeo.errors import FormatError
from saegeo.io import hf_download_command
from saegeo.sae.formats.base import EXPECTED_LAYOUTS

# SAELens conversion_func -> (saegeo reader, the files of one SAE inside its folder). None: SAELens' own loader.
CONVERSIONS: dict[str | None, tuple[str, tuple[str, ...]]] = {
    None: ("saelens", ("cfg.json", "sae_weights.safetensors")),
    "sae_lens": ("saelens", ("cfg.json", "sae_weights.safetensors")),
    "gemma_2": ("gemma_scope_npz", ("params.npz",)),
    "gemma_3": ("gemma_scope_2", ("params.safetensors", "config.json")),  # Gemma Scope 2
    "llama_scope": ("llama_scope", ("hyperparams.json", "checkpoints/final.safetensors")),
    "dictionary_learning_1": ("dictionary_learning", ("ae.pt", "config.json")),
    "sparsify": ("sparsify", ("cfg.json", "sae.safetensors")),
}
# conversion functions whose result saegeo does not reproduce (transcoders, cross-layer and bespoke layouts)
REFUSED_CONVERSIONS = {
    "connor_rob_hook_z": "attention hook_z SAEs reshaped per head by SAELens' converter",
    "deepseek_r1": "a bespoke .pt layout",
    "llama_scope_r1_distill": "a later Llama Scope layout",
    "gemma_2_transcoder": "a transcoder",
    "mwhanna_transcoder": "a transcoder",
    "mntss_clt_layer_transcoder": "a cross-layer transcoder",
}


def _release(
    repo_id: str,
    model: str,
    conversion: str | None,
    saes: dict[str, str] | None = None,
    hook: str | None = None,
    overrides: dict | None = None,
) -> dict[str, Any]:
    """One release: saes None means every sae_id is its own path in the repo (Gemma Scope's layer_N/width_W/...)."""
    return {
        "repo_id": repo_id,
        "model": model,
        "conversion_func": conversion,
        "saes": saes,
        "hook_template": hook,
        "config_overrides": overrides or {},
    }


def _saegeo_table() -> dict[str, dict[str, Any]]:
    """saegeo's copy of the releases most used (names, repos, paths and overrides as in SAELens 6.18's registry)."""
    table: dict[str, dict[str, Any]] = {}
    gpt2 = [f"blocks.{layer}.hook_resid_pre" for layer in range(12)] + ["blocks.11.hook_resid_post"]
    table["gpt2-small-res-jb"] = _release(
        "jbloom/GPT2-Small-SAEs-Reformatted",
        "gpt2",
        None,
        {i: i for i in gpt2},
        overrides={"model_from_pretrained_kwargs": {"center_writing_weights": True}},
    )
    gemma_sites = {
        "res": "blocks.{layer}.hook_resid_post",
        "mlp": "blocks.{layer}.hook_mlp_out",
        "att": "blocks.{layer}.attn.hook_z",
    }
    for size in ("2b", "9b", "27b"):
        for site, hook in gemma_sites.items():
            if size == "27b" and site != "res":  # not released (absent from SAELens' registry too)
                continue
            table[f"gemma-scope-{size}-pt-{site}"] = _release(
                f"google/gemma-scope-{size}-pt-{site}", f"google/gemma-2-{size}", "gemma_2", hook=hook
            )
    table["gemma-scope-9b-it-res"] = _release(
        "google/gemma-scope-9b-it-res", "google/gemma-2-9b-it", "gemma_2", hook=gemma_sites["res"]
    )
    scope2_sites = {"res": "resid_post", "mlp": "mlp_out", "att": "attn_out"}
    scope2_hooks = {"res": "blocks.{layer}.hook_resid_post", "mlp": "blocks.{layer}.hook_mlp_out", "att": None}
    for size in ("270m", "1b", "4b", "12b", "27b"):
        for variant in ("pt", "it"):
            for site, folder in scope2_sites.items():
                for suffix, sub in (("", folder), ("-all", f"{folder}_all")):
                    if (size, variant) == ("27b", "pt") and site != "res":  # not released
                        continue
                    table[f"gemma-scope-2-{size}-{variant}-{site}{suffix}"] = {
                        **_release(
                            f"google/gemma-scope-2-{size}-{variant}",
                            f"google/gemma-3-{size}-{variant}",
                            "gemma_3",
                            hook=scope2_hooks[site],
                        ),
                        "path_prefix": sub,  # sae_id layer_12_width_16k_l0_medium -> resid_post/layer_12_...
                    }
    for site in ("r", "m", "a"):  # the hook comes from hyperparams.json (hook_point_in)
        for width in ("8x", "32x"):
            saes = {
                f"l{layer}{site}_{width}": f"Llama3_1-8B-Base-L{layer}{site.upper()}-{width}" for layer in range(32)
            }
            table[f"llama_scope_lx{site}_{width}"] = _release(
                f"fnlp/Llama3_1-8B-Base-LX{site.upper()}-{width}", "meta-llama/Llama-3.1-8B", "llama_scope", saes
            )
    pythia = {
        "res": {
            "blocks.0.hook_resid_pre": "e-res-sm",
            **{f"blocks.{i}.hook_resid_post": f"{i}-res-sm" for i in range(6)},
        },
        "mlp": {f"blocks.{i}.hook_mlp_out": f"{i}-mlp-sm" for i in range(6)},
        "att": {f"blocks.{i}.hook_attn_out": f"{i}-att-sm" for i in range(6)},
    }
    for site, saes in pythia.items():
        table[f"pythia-70m-deduped-{site}-sm"] = _release(
            f"ctigges/pythia-70m-deduped__{site}-sm_processed", "EleutherAI/pythia-70m-deduped", None, saes
        )
    return table


SAELENS_RELEASES = _saegeo_table()
HUB_RELEASES = SAELENS_RELEASES  # the name earlier versions exported
_HUB_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_REGISTRY_CACHE: dict[tuple[str, float], dict[str, dict[str, Any]]] = {}


def installed_saelens_registry() -> tuple[dict[str, dict[str, Any]], str] | None:
    """(releases, the file) from an installed sae_lens' pretrained_saes.yaml, found without importing sae_lens;
    None when sae_lens (or PyYAML) is not installed. Releases in saegeo's layout (see _release)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sae_lens")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [Path(loc) / "pretrained_saes.yaml" for loc in locations if (Path(loc) / "pretrained_saes.yaml").is_file()]
    if not files:
        return None
    try:
        import yaml
    except ImportError:
        return None
    key = (str(files[0]), files[0].stat().st_mtime)
    if key not in _REGISTRY_CACHE:
        try:
            # libyaml's loader where PyYAML has it: the pure-Python one took seconds on this multi-MB file
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            raw = yaml.load(files[0].read_text(), Loader=loader) or {}
        except (OSError, yaml.YAMLError) as err:
            raise FormatError(f"{files[0]}: sae_lens' registry cannot be read ({err})") from None
        _REGISTRY_CACHE[key] = {
            name: _release(
                value["repo_id"],
                value.get("model"),
                value.get("conversion_func"),
                {sae["id"]: sae["path"] for sae in value.get("saes", [])},
                overrides=value.get("config_overrides") or {},
            )
            for name, value in raw.items()
            if isinstance(value, dict) and "repo_id" in value
        }
    return _REGISTRY_CACHE[key], str(files[0])


@dataclass
class HubDictionary:
    """Where a hub id points: repo_id, the subfolder (or file) inside it, and what the release's registry says."""

    hub_id: str
    repo_id: str
    subfolder: str
    model_name: str | None = None
    hook_template: str | None = None  # e.g. "blocks.{layer}.hook_resid_post", layer from a "layer_N" folder
    release: str | None = None
    registry: str | None = None  # "saegeo" or the path of the sae_lens registry file it came from
    conversion: str | None = None  # SAELens' conversion_func (None: its own loader)
    config_overrides: dict = field(default_factory=dict)

    @property
    def reader(self) -> str | None:
        """The saegeo reader of the release's layout (None: detect it from the files)."""
        return CONVERSIONS[self.conversion][0] if self.release and self.conversion in CONVERSIONS else None

    @property
    def files(self) -> tuple[str, ...]:
        """The files of this SAE inside its repo, when the layout is known."""
        if not self.release or self.conversion not in CONVERSIONS:
            return ()
        return tuple(f"{self.subfolder}/{f}" for f in CONVERSIONS[self.conversion][1])

    def download_command(self) -> str:
        if self.files:
            return hf_download_command(self.repo_id, self.files)
        return hf_download_command(self.repo_id, include=f"{self.subfolder}/*" if self.subfolder else None)


def _release_entry(release: str) -> tuple[dict[str, Any], str] | None:
    installed = installed_saelens_registry()
    if installed is not None and release in installed[0]:
        return installed[0][release], installed[1]
    if release in SAELENS_RELEASES:
        return SAELENS_RELEASES[release], "saegeo"
    return None


def resolve_hub_id(hub_id: str) -> HubDictionary | None:
    """ "RELEASE/sae_id" for a SAELens release (gpt2-small-res-jb/blocks.8.hook_resid_pre -> repo
    jbloom/GPT2-Small-SAEs-Reformatted, path blocks.8.hook_resid_pre), looked up in the installed sae_lens'
    registry, else saegeo's table (see the module docstring); else "org/repo[/subfolder]" (SAELens, sparsify,
    dictionary_learning, Llama Scope repos; a subfolder may also name one file). None when the string cannot be a
    hub id (a path such as ./x, /x or ~/x, or characters a repo name cannot hold). An sae_id the release does not
    list is a FormatError naming some it does."""
    parts = hub_id.strip("/").split("/")
    if hub_id.startswith((".", "/", "~")) or not all(_HUB_PART.fullmatch(part) for part in parts):
        return None
    entry = _release_entry(parts[0])
    if entry is not None:
        release, registry = entry
        sae_id = "/".join(parts[1:])
        saes = release["saes"]
        if release["conversion_func"] in REFUSED_CONVERSIONS:
            raise FormatError(
                f"{hub_id}: SAELens release {parts[0]} uses the conversion function {release['conversion_func']!r} "
                f"({REFUSED_CONVERSIONS[release['conversion_func']]}), which saegeo does not reproduce"
            )
        if saes is not None and sae_id not in saes:
            listed = sorted(saes)
            raise FormatError(
                f"{hub_id}: release {parts[0]} ({'saegeo' if registry == 'saegeo' else 'sae_lens'}'s registry) has no "
                f"sae_id {sae_id!r}; it has {listed[:5]}{' ...' if len(listed) > 5 else ''}"
            )
        path = saes[sae_id] if saes is not None else sae_id
        if release.get("path_prefix"):
            path = f"{release['path_prefix']}/{path}"
        return HubDictionary(
            hub_id,
            release["repo_id"],
            path,
            release["model"],
            release["hook_template"],
            release=parts[0],
            registry=registry,
            conversion=release["conversion_func"],
            config_overrides=dict(release["config_overrides"]),
        )
    if len(parts) < 2:
        return None
    return HubDictionary(hub_id, "/".join(parts[:2]), "/".join(parts[2:]))


def _unknown_release(hub: HubDictionary) -> str:
    """The first words when a hub id read as org/repo may be a SAELens release that saegeo's table does not list."""
    if hub.release:
        return ""
    release = hub.hub_id.strip("/").split("/")[0]
    installed = installed_saelens_registry()
    if installed is None:
        return (
            f"if {release!r} is a SAELens release, saegeo's table does not list it and sae_lens (whose registry "
            "lists every release) is not installed: `pip install sae-lens` and run again, or download the SAE's "
            "files and pass their folder; if it is a hub repo, "
        )
    return f"{release!r} is not a release in sae_lens' registry ({installed[1]}) either; as a hub repo, "


def download_hub_dictionary(hub: HubDictionary) -> Path:
    """The local path of hub.subfolder in hub.repo_id, through huggingface_hub's snapshot_download (only that
    subfolder's files, or the release layout's own files), so a populated cache works offline. HF_HUB_CACHE and
    HF_HUB_OFFLINE are read at call time."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    sub = hub.subfolder
    wanted = f"{hub.repo_id}/{sub}" if sub else hub.repo_id
    patterns = list(hub.files) or ([sub, f"{sub}/*"] if sub else None)
    try:
        snapshot = Path(
            snapshot_download(hub.repo_id, allow_patterns=patterns, cache_dir=cache, local_files_only=offline)
        )
    except LocalEntryNotFoundError:
        from huggingface_hub import constants

        where = Path(cache or constants.HF_HUB_CACHE)
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        release = _unknown_release(hub)
        raise FormatError(
            f"{hub.hub_id}: {release}on a machine with network run `{hub.download_command()}` (into {where}) or "
            f"pass a local path; {wanted} is not in that cache and {why} (looked for "
            f"{where / ('models--' + hub.repo_id.replace('/', '--'))}/snapshots/*/{sub or ''}; a dictionary is "
            f"{EXPECTED_LAYOUTS})"
        ) from None
    except HfHubHTTPError as err:
        raise FormatError(
            f"{hub.hub_id}: the hub refused {wanted} ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
            f"no local path {hub.hub_id} exists either; check the repo id, or log in for a gated repo"
        ) from None
    local = snapshot / sub if sub else snapshot
    missing = [f for f in hub.files if not (snapshot / f).is_file()]
    if not local.exists() or missing:
        what, looked = (sub, local) if not local.exists() else (f"the file(s) {missing}", snapshot / missing[0])
        raise FormatError(
            f"{hub.hub_id}: {hub.repo_id} has no {what} (looked for {looked}); check the sae id / subfolder, "
            f"or download it once online ({hub.download_command()})"
        )
    return local

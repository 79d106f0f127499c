"""Hub ids: "org/repo[/subfolder]" and SAELens release ids ("RELEASE/sae_id"), resolved through the Hugging Face cache.

A SAELens release id is looked up as `SAE.from_pretrained(release, sae_id)` looks it up: in the registry of an
installed sae_lens (its own pretrained_saes.yaml, read without importing sae_lens) when there is one, else in
saegeo's table of the commonly used releases (`saegeo_releases()`: gpt2-small-res-jb, Gemma Scope and Gemma Scope
2, Llama Scope, pythia-70m-deduped, each declared by its format's module): the release gives the repo, each sae_id
its path in it (`saes_map`), the conversion function names the layout (read by the format that registers it,
`conversions()`), and `config_overrides` are
applied to the config read from the files, as SAELens' cfg_dict.update(config_overrides) applies them (e.g.
gpt2-small-res-jb's model_from_pretrained_kwargs.center_writing_weights = true). A release of sae_lens' file is
checked against `release_list_schema` before it is used.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saegeo.errors import FormatError
from saegeo.io import hf_download_command
from saegeo.progress import quiet_tqdm_auto
from saegeo.sae.formats.format_reader import expected_layouts, format_readers
from saegeo.sae.formats.reader_checks import check_config, schema_types
from saegeo.sae.sae_source import hub_id_parts

# conversion functions whose result saegeo does not reproduce (transcoders, cross-layer and bespoke layouts)
REFUSED_CONVERSIONS = {
    "connor_rob_hook_z": "attention hook_z SAEs reshaped per head by SAELens' converter",
    "deepseek_r1": "a bespoke .pt layout",
    "llama_scope_r1_distill": "a later Llama Scope layout",
    "gemma_2_transcoder": "a transcoder",
    "mwhanna_transcoder": "a transcoder",
    "mntss_clt_layer_transcoder": "a cross-layer transcoder",
}


def release_entry(
    repo_id: str,
    model: str | None,
    conversion: str | None,
    saes: dict[str, str] | None = None,
    hook: str | None = None,
    overrides: dict | None = None,
    path_prefix: str | None = None,
) -> dict[str, Any]:
    """One release in saegeo's layout: saes None means every sae_id is its own path in the repo (Gemma Scope's
    layer_N/width_W/...); path_prefix a folder every path sits in; hook a template of the hook name by layer."""
    entry = {
        "repo_id": repo_id,
        "model": model,
        "conversion_func": conversion,
        "saes": saes,
        "hook_template": hook,
        "config_overrides": overrides or {},
    }
    if path_prefix:
        entry["path_prefix"] = path_prefix
    return entry


def conversions() -> dict[str | None, tuple[str, tuple[str, ...]]]:
    """SAELens conversion_func -> (the saegeo format whose reader reads its result, the files of one SAE inside its
    folder), as each format registers them (FormatReader.conversions). None: SAELens' own loader."""
    return {conv: (r.name, r.files) for r in format_readers() for conv in r.conversions}


def saegeo_releases() -> dict[str, dict[str, Any]]:
    """saegeo's copy of the releases most used (names, repos, paths and overrides as in SAELens 6.18's registry),
    each declared by the module of its format (FormatReader.releases)."""
    table: dict[str, dict[str, Any]] = {}
    for reader in format_readers():
        table.update(reader.releases() if reader.releases is not None else {})
    return table


def __getattr__(name: str) -> Any:
    # the tables earlier versions exported as constants, now built from the registered formats on first use
    if name in ("SAELENS_RELEASES", "HUB_RELEASES"):
        return saegeo_releases()
    if name == "CONVERSIONS":
        return conversions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REGISTRY_CACHE: dict[tuple[str, float], dict[str, Any]] = {}


@functools.cache
def release_list_schema() -> type:
    """One release of sae_lens' pretrained_saes.yaml, as SAELens' PretrainedSAELookup reads it: repo_id (a string),
    model and conversion_func (strings or null), saes (a list of {id, path}: a path YAML reads as a number, such as 0,
    is that folder's name), config_overrides (a mapping or null). Other keys (links, l0, neuronpedia) pass unread."""
    T = schema_types()

    class ReleaseSAE(T.Config):
        id: str
        path: T.either("a string (a folder or file in the repo)", lambda v: isinstance(v, (str, int)))

    class Release(T.Config):
        repo_id: str
        model: T.Text = None
        conversion_func: T.Text = None
        saes: list[ReleaseSAE] = []
        config_overrides: T.Object = None

    return Release


def installed_saelens_registry() -> tuple[dict[str, Any], str] | None:
    """(releases as the file holds them, the file) from an installed sae_lens' pretrained_saes.yaml, found without
    importing sae_lens; None when sae_lens (or PyYAML) is not installed. A release is checked against
    `release_list_schema` when it is looked up (`release_from_registry`), so one malformed entry refuses only itself."""
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
        except (OSError, yaml.YAMLError, RecursionError) as err:
            raise FormatError(f"{files[0]}: sae_lens' registry cannot be read ({type(err).__name__})") from None
        if not isinstance(raw, dict):
            raise FormatError(
                f"{files[0]}: sae_lens' registry must map release names to releases, found a {type(raw).__name__}"
            )
        _REGISTRY_CACHE[key] = raw
    return _REGISTRY_CACHE[key], str(files[0])


def release_from_registry(name: str, value: Any, file: str) -> dict[str, Any]:
    """Release `name` of sae_lens' registry `file` in saegeo's layout (`release_entry`), refused in one line naming
    the file and the field (e.g. "gpt2-small-res-jb.saes.3.path") when it does not fit `release_list_schema`."""
    if not isinstance(value, dict):
        raise FormatError(
            f"{file}: {name} must be a mapping (repo_id, model, conversion_func, saes), found {value!r}"[:300]
        )
    check_config(file, value, release_list_schema(), within=name)
    return release_entry(
        value["repo_id"],
        value.get("model"),
        value.get("conversion_func"),
        {sae["id"]: str(sae["path"]) for sae in value.get("saes") or []},
        overrides=value.get("config_overrides") or {},
    )


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
        known = conversions()
        return known[self.conversion][0] if self.release and self.conversion in known else None

    @property
    def files(self) -> tuple[str, ...]:
        """The files of this SAE inside its repo, when the layout is known."""
        known = conversions()
        if not self.release or self.conversion not in known:
            return ()
        return tuple(f"{self.subfolder}/{f}" for f in known[self.conversion][1])

    def download_command(self) -> str:
        if self.files:
            return hf_download_command(self.repo_id, self.files)
        return hf_download_command(self.repo_id, include=f"{self.subfolder}/*" if self.subfolder else None)


def _release_entry(release: str) -> tuple[dict[str, Any], str] | None:
    installed = installed_saelens_registry()
    if installed is not None and release in installed[0]:
        return release_from_registry(release, installed[0][release], installed[1]), installed[1]
    table = saegeo_releases()
    if release in table:
        return table[release], "saegeo"
    return None


def resolve_hub_id(hub_id: str) -> HubDictionary | None:
    """ "RELEASE/sae_id" for a SAELens release (gpt2-small-res-jb/blocks.8.hook_resid_pre -> repo
    jbloom/GPT2-Small-SAEs-Reformatted, path blocks.8.hook_resid_pre), looked up in the installed sae_lens'
    registry, else saegeo's table (see the module docstring); else "org/repo[/subfolder]" (SAELens, sparsify,
    dictionary_learning, Llama Scope repos; a subfolder may also name one file). None when the string cannot be a
    hub id (a path such as ./x, /x or ~/x, or characters a repo name cannot hold). An sae_id the release does not
    list is a FormatError naming some it does."""
    parts = hub_id_parts(hub_id)
    if parts is None:
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
    quiet_tqdm_auto()  # huggingface_hub imports tqdm.auto (a warning in a notebook without ipywidgets)
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
            f"{expected_layouts()})"
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

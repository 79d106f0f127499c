"""Hub ids: "org/repo[/subfolder]" and SAELens-style release ids, resolved through the Hugging Face cache."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from saegeo.errors import FormatError
from saegeo.sae.formats.base import EXPECTED_LAYOUTS

# Release ids (SAELens' names) whose sae_id is the repo subfolder: release -> (repo, model, hook template).
HUB_RELEASES: dict[str, tuple[str, str, str]] = {
    f"gemma-scope-{size}-pt-{site}": (f"google/gemma-scope-{size}-pt-{site}", f"google/gemma-2-{size}", hook)
    for size in ("2b", "9b", "27b")
    for site, hook in (
        ("res", "blocks.{layer}.hook_resid_post"),
        ("mlp", "blocks.{layer}.hook_mlp_out"),
        ("att", "blocks.{layer}.attn.hook_z"),
    )
}
_HUB_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class HubDictionary:
    """Where a hub id points: repo_id, the subfolder (or file) inside it, and what the release table knows."""

    hub_id: str
    repo_id: str
    subfolder: str
    model_name: str | None = None
    hook_template: str | None = None  # e.g. "blocks.{layer}.hook_resid_post", layer from a "layer_N" folder


def resolve_hub_id(hub_id: str) -> HubDictionary | None:
    """ "RELEASE/sae_id" for a release in HUB_RELEASES (gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71 ->
    repo google/gemma-scope-2b-pt-res, subfolder layer_20/width_16k/average_l0_71), else "org/repo[/subfolder]"
    (SAELens, sparsify, dictionary_learning, Llama Scope repos; a subfolder may also name one file). None when
    the string cannot be a hub id (a path such as ./x, /x or ~/x, or characters a repo name cannot hold)."""
    parts = hub_id.strip("/").split("/")
    if hub_id.startswith((".", "/", "~")) or not all(_HUB_PART.fullmatch(part) for part in parts):
        return None
    if parts[0] in HUB_RELEASES:
        repo, model, hook = HUB_RELEASES[parts[0]]
        return HubDictionary(hub_id, repo, "/".join(parts[1:]), model, hook)
    if len(parts) < 2:
        return None
    return HubDictionary(hub_id, "/".join(parts[:2]), "/".join(parts[2:]))


def download_hub_dictionary(hub: HubDictionary) -> Path:
    """The local path of hub.subfolder in hub.repo_id, through huggingface_hub's snapshot_download (only that
    subfolder's files), so a populated cache works offline. HF_HUB_CACHE and HF_HUB_OFFLINE are read at call time."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    sub = hub.subfolder
    wanted = f"{hub.repo_id}/{sub}" if sub else hub.repo_id
    try:
        snapshot = Path(
            snapshot_download(
                hub.repo_id,
                allow_patterns=[sub, f"{sub}/*"] if sub else None,
                cache_dir=cache,
                local_files_only=offline,
            )
        )
    except LocalEntryNotFoundError:
        where = cache or "the default Hugging Face cache"
        raise FormatError(
            f"{hub.hub_id}: {wanted} is not in {where}{' and HF_HUB_OFFLINE is set' if offline else ' and the hub cannot be reached'}; "
            f"looked for models--{hub.repo_id.replace('/', '--')}/snapshots/*/{sub or ''} (a dictionary: {EXPECTED_LAYOUTS}). "
            f"Download it once online (hf download {hub.repo_id}{f' --include {sub}/*' if sub else ''}) or pass a local path"
        ) from None
    except HfHubHTTPError as err:
        raise FormatError(
            f"{hub.hub_id}: the hub refused {wanted} ({type(err).__name__}: {str(err).splitlines()[0][:200]}); "
            f"no local path {hub.hub_id} exists either; check the repo id, or log in for a gated repo"
        ) from None
    local = snapshot / sub if sub else snapshot
    if not local.exists():
        raise FormatError(
            f"{hub.hub_id}: {hub.repo_id} has no {sub} (looked for {local}); check the sae id / subfolder"
        )
    return local

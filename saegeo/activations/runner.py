"""Forward to a hook: batching windows, padding them, running the model only as far as the hooks need, and
probing each hook's row width. Shared by caching (saegeo.activations.cache) and splicing (saegeo.sae.evaluate).

``window_batches(windows, batch_size)``   lists of windows.
``pad_windows(batch, pad_id) -> (tokens, attend, store)``   right-padded to the longest window.
``forward_to_layer(loaded, tokens, attend, stop_layer)``   blocks[:stop_layer + 1] only (hooks see their usual values).
``hook_widths(loaded, hooks, stop_layer, pad_id) -> {hook: width}``   from one tiny forward pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from saegeo.activations.corpus import Window
from saegeo.activations.models import LoadedModel


def window_batches(windows: Iterator[Window], batch_size: int) -> Iterator[list[Window]]:
    """The windows in lists of ``batch_size`` (the last one shorter)."""
    batch: list[Window] = []
    for window in windows:
        batch.append(window)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def pad_windows(
    batch: list[Window], pad_id: int
) -> tuple[Int[Tensor, "b p"], Bool[Tensor, "b p"], Bool[Tensor, "b p"]]:
    """Right-pad to the longest window: (tokens, attention mask, store mask)."""
    width = max(len(w.input_ids) for w in batch)
    tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attend = torch.zeros(len(batch), width, dtype=torch.bool)
    store = torch.zeros(len(batch), width, dtype=torch.bool)
    for i, w in enumerate(batch):
        n = len(w.input_ids)
        tokens[i, :n] = torch.tensor(w.input_ids)
        attend[i, :n] = True
        store[i, :n] = torch.tensor(w.store)
    return tokens, attend, store


def forward_to_layer(
    loaded: LoadedModel, tokens: Int[Tensor, "b p"], attend: Bool[Tensor, "b p"], stop_layer: int | None
) -> None:
    """Run the model only as far as block `stop_layer` (hooks see their usual values)."""
    model = loaded.model
    if loaded.kind == "decoder":
        # causal attention + right padding: padded positions never influence real ones
        if stop_layer is None:
            model(tokens, return_type=None)
        else:
            model(tokens, stop_at_layer=stop_layer + 1, return_type="logits")
        return
    mask = None if bool(attend.all()) else attend.long()
    if stop_layer is None:
        model(tokens, return_type=None, one_zero_attention_mask=mask)
        return
    # HookedEncoder.encoder_output, but only blocks[:stop_layer + 1]
    resid = model.hook_full_embed(model.embed(tokens, None))
    additive = None
    if mask is not None:
        additive = torch.where(mask[:, None, None, :] == 0, -torch.inf, 0.0).to(resid.dtype)
    for block in model.blocks[: stop_layer + 1]:
        resid = block(resid, additive)


def hook_widths(loaded: LoadedModel, hooks: tuple[str, ...], stop_layer: int | None, pad_id: int) -> dict[str, int]:
    """Row width of each hook, from one tiny forward pass (hooks such as attn.hook_z are flattened)."""
    widths: dict[str, int] = {}

    def probe(act: Tensor, hook: Any) -> None:
        widths[hook.name] = int(act[0, 0].numel())

    tokens = torch.full((1, 2), pad_id, dtype=torch.long, device=next(loaded.model.parameters()).device)
    with torch.inference_mode(), loaded.model.hooks(fwd_hooks=[(h, probe) for h in hooks]):
        forward_to_layer(loaded, tokens, torch.ones_like(tokens, dtype=torch.bool), stop_layer)
    return widths

"""saegeo.activations: models -> hooks -> sharded activation store; store -> batches.

store.py    ActivationStore / StoreWriter / write_store (no model imports: cheap to import)
models.py   load_model: bundled MiniLM, local HF dirs, HookedTransformerConfig
corpus.py   text sources -> fixed-length token windows
cache.py    cache_activations: one forward pass, several hooks, one resumable store per hook
sources.py  open_rows: the one reader of rows (store, .safetensors/.npy/.pt file, tensor, iterator)
"""

from saegeo.activations.store import ActivationStore, StoreWriter, write_store

__all__ = ["ActivationStore", "StoreWriter", "write_store"]

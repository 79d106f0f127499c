"""saegeo.activations: models -> hooks -> sharded activation store; store -> batches.

store.py    ActivationStore / StoreWriter / write_store (no model imports: cheap to import)
models.py   load_model: bundled MiniLM, local HF dirs, HookedTransformerConfig
corpus.py   text sources -> fixed-length token windows
cache.py    cache_activations: one forward pass, several hooks, one resumable store per hook
sources.py  open_rows: the one reader of rows (store, .safetensors/.npy/.pt file, tensor, iterator)
"""

from saegeo.config import lazy_exports

# name -> its module, imported on first use (saegeo.config.lazy_exports): `import saegeo.activations.X` stays light
_EXPORTS = {
    "ActivationStore": "saegeo.activations.store",
    "StoreWriter": "saegeo.activations.store",
    "write_store": "saegeo.activations.store",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

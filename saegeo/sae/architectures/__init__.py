"""SAE architectures, one module each, and the one registry that the model, the trainer, the format loaders
and the report ask (see `base.Architecture`). Importing this package registers relu, topk, batchtopk and
jumprelu; another architecture registers itself with `register_architecture(name, cls)`."""

from saegeo.sae.architectures import batchtopk, jumprelu, relu, topk  # noqa: F401  (each registers itself)
from saegeo.sae.architectures.base import (
    Architecture,
    SAEConfig,
    TrainOutput,
    architecture_for_saelens,
    architecture_names,
    get_architecture,
    register_architecture,
    unregister_architecture,
)

__all__ = [
    "Architecture",
    "SAEConfig",
    "TrainOutput",
    "architecture_for_saelens",
    "architecture_names",
    "get_architecture",
    "register_architecture",
    "unregister_architecture",
]

"""SAE architectures, one module each, and the one registry that the model, the trainer, the format readers
and the report ask (see `base.Architecture`). Importing this package imports every module in it (`discover`):
each registers the architecture it defines, so a new architecture is one new module. One defined elsewhere
registers itself with `register_architecture(name, cls)`."""

from saegeo.sae.architectures.base import (
    Architecture,
    ExtraTensor,
    NoOptions,
    SAEConfig,
    TrainOutput,
    architecture_names,
    by_saved_name,
    discover,
    get_architecture,
    register_architecture,
    unregister_architecture,
)

discover()

__all__ = [
    "Architecture",
    "ExtraTensor",
    "NoOptions",
    "SAEConfig",
    "TrainOutput",
    "architecture_names",
    "by_saved_name",
    "discover",
    "get_architecture",
    "register_architecture",
    "unregister_architecture",
]

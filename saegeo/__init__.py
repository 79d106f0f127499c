"""saegeo: the geometry of transformer activations and of sparse-autoencoder dictionaries."""

__version__ = "0.1.0"

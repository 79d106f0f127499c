"""saegeo.activations."""

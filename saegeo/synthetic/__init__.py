"""saegeo.synthetic."""

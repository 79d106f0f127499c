"""saegeo.sae."""

"""saegeo.report."""

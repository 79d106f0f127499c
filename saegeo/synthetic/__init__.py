"""Synthetic superposition with ground truth, and recovery metrics for learned dictionaries."""

from saegeo.synthetic.recovery import RecoveryReport, max_cosines, recovery
from saegeo.synthetic.superposition import (
    PRESETS,
    SparseCodes,
    SuperpositionGenerator,
    SyntheticConfig,
    SyntheticTruth,
    magnitude_moments,
    preset,
)

__all__ = [
    "PRESETS",
    "SparseCodes",
    "SuperpositionGenerator",
    "SyntheticConfig",
    "SyntheticTruth",
    "magnitude_moments",
    "preset",
    "RecoveryReport",
    "max_cosines",
    "recovery",
]

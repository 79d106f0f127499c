"""Synthetic superposition with ground truth, and recovery metrics for learned dictionaries."""

from saegeo.config import lazy_exports

# name -> its module, imported on first use (saegeo.config.lazy_exports): `import saegeo.synthetic.X` stays light
_EXPORTS = {
    "PRESETS": "saegeo.synthetic.options",
    "SparseCodes": "saegeo.synthetic.superposition",
    "SuperpositionGenerator": "saegeo.synthetic.superposition",
    "SyntheticConfig": "saegeo.synthetic.options",
    "SyntheticTruth": "saegeo.synthetic.superposition",
    "magnitude_moments": "saegeo.synthetic.superposition",
    "preset": "saegeo.synthetic.options",
    "RecoveryReport": "saegeo.synthetic.recovery",
    "max_cosines": "saegeo.synthetic.recovery",
    "recovery": "saegeo.synthetic.recovery",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

"""Pure math on tensors: streaming accumulators, measures, nulls, the amplification law, transforms.

Nothing in this package imports I/O or models.

    from saegeo.geometry import GeometryAccumulator, activation_geometry
    acc = GeometryAccumulator(d)
    for batch in batches:            # (m, d) torch or numpy, any float dtype
        acc.add(batch)
    geo = activation_geometry(acc)   # ActivationGeometry; geo.to_dict() is JSON-safe

See accumulate.py, measures.py, nulls.py, diagnosis.py (row-sample diagnostics) and transforms.py for the full
public API; tokens.py holds the per-token-type sums (within/between decomposition, self-similarity,
intra-window similarity, artifact test).
"""

from saegeo.geometry.accumulate import GeometryAccumulator
from saegeo.geometry.measures import ActivationGeometry, activation_geometry

__all__ = ["GeometryAccumulator", "ActivationGeometry", "activation_geometry"]

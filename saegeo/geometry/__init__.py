"""Pure math on tensors: streaming accumulators, measures, nulls, the amplification law, transforms.

Nothing in this package imports I/O or models.
"""

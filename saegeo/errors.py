"""Errors meant for the user: the CLI prints their message without a traceback.

Every message says what was found, where (file, shard, batch, row) and what to do.
"""


class SaegeoError(ValueError):
    """Base class for bad input, bad files and bad configuration."""


class BadInputError(SaegeoError):
    """Rows or tensors that cannot be used as given (non-finite values, wrong shape, n too small)."""


class StoreError(SaegeoError):
    """An activation store that is corrupt, truncated, incomplete or incompatible with a request."""


class FormatError(SaegeoError):
    """A model or dictionary file whose format is unknown, inconsistent or unsafe to load."""

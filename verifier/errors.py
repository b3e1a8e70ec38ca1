"""The one root exception of specmarket; every package raises subclasses of it."""


class SpecmarketError(Exception):
    """Root of every error specmarket raises on purpose."""


class InvalidParams(SpecmarketError, ValueError):
    """Sampling or decoding parameters that make no sense."""


class InvalidProposal(SpecmarketError, ValueError):
    """A drafter's proposal that fails validation (wrong types, lengths, ids or probabilities)."""


class ModelMismatch(SpecmarketError):
    """Two models that cannot be paired (e.g. different vocabularies)."""


class ContextTooLong(SpecmarketError):
    """Prompt plus generation does not fit the model's context window."""


class Unavailable(SpecmarketError):
    """The node cannot take this request now (it is not signing receipts, or it is full); HTTP 503."""


def error_leaves(exc: BaseException) -> list[BaseException]:
    """The leaf exceptions of ``exc``: itself, or every non-group exception nested in an
    (Base)ExceptionGroup, in order. trio's nurseries and hypercorn wrap errors in such groups."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in error_leaves(inner)]


def sole_error(exc: BaseException) -> BaseException:
    """The one leaf of a group that wraps a single error, else ``exc`` itself."""
    leaves = error_leaves(exc)
    return leaves[0] if len(leaves) == 1 else exc

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

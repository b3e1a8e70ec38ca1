"""The verifier: sampling, the exact verification rules, decode loops and the theory of speed-up.

Pure numpy over the ``LanguageModel`` interface: no network, no money, no torch. Every package of
specmarket builds on it, so the project's root exception, ``SpecmarketError``, lives here
(``verifier/errors.py``); every error the project raises on purpose derives from it.
"""

from verifier.decode import DecodeResult, DecodeStats, Proposer, decode, decode_plain, decode_speculative
from verifier.errors import (
    ContextTooLong,
    InvalidParams,
    InvalidProposal,
    ModelMismatch,
    SpecmarketError,
    error_leaves,
    sole_error,
)
from verifier.model import LanguageModel, score
from verifier.noise import MAX_SEED
from verifier.params import SamplingParams, token_probs
from verifier.proposal import DEFAULT_GAMMA, MAX_GAMMA, Proposal
from verifier.proposers import PROPOSERS, build_proposer
from verifier.theory import expected_tokens, optimal_gamma, speedup
from verifier.tolerance import TOLERANCE_DELTA, within_tolerance
from verifier.verify import Rule, Verdict, sample_token, verify

__all__ = [
    "DEFAULT_GAMMA",
    "MAX_GAMMA",
    "MAX_SEED",
    "PROPOSERS",
    "TOLERANCE_DELTA",
    "ContextTooLong",
    "DecodeResult",
    "DecodeStats",
    "InvalidParams",
    "InvalidProposal",
    "LanguageModel",
    "ModelMismatch",
    "Proposal",
    "Proposer",
    "Rule",
    "SamplingParams",
    "SpecmarketError",
    "Verdict",
    "build_proposer",
    "decode",
    "decode_plain",
    "decode_speculative",
    "error_leaves",
    "expected_tokens",
    "optimal_gamma",
    "sample_token",
    "score",
    "sole_error",
    "speedup",
    "token_probs",
    "verify",
    "within_tolerance",
]

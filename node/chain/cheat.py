"""Dishonest operator modes (kept apart from the chain client so the CLI can name them cheaply)."""

import enum


class Cheat(enum.Enum):
    """A dishonest operator, for tests and the demo. It still signs receipts claiming the target."""

    NONE = "none"
    DRAFT_MODEL = "draft-model"
    FLIP_TOKEN = "flip-token"
    UNDERPAY = "underpay"
    UNFUNDED = "unfunded-lanes"
    STOP_EARLY = "stop-early"

    @property
    def description(self) -> str:
        """What the operator does (`specmarket target --help` lists every cheat from these)."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Cheat.NONE: "an honest operator",
    Cheat.DRAFT_MODEL: "answers with the (cheaper) draft model",
    Cheat.FLIP_TOKEN: "answers honestly, then changes its second token (one that every answer has)",
    Cheat.UNDERPAY: "answers honestly, but signs drafters' vouchers for half of what they earned",
    Cheat.UNFUNDED: "answers honestly and signs drafters' vouchers, but never funds their lanes in the escrow",
    Cheat.STOP_EARLY: "answers honestly, but stops at half of max_tokens (not at a stop token) and charges for it",
}


def cheats_help() -> str:
    """Every dishonest mode, ``value = description``, for a --help text."""
    return "; ".join(f"{c.value} = {c.description}" for c in Cheat if c is not Cheat.NONE)

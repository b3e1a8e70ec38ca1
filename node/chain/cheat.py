"""Dishonest operator modes (kept apart from the chain client so the CLI can name them cheaply)."""

import enum


class Cheat(enum.Enum):
    """A dishonest operator, for tests and the demo. It still signs receipts claiming the target."""

    NONE = "none"
    DRAFT_MODEL = "draft-model"  # answers with the (cheaper) draft model
    FLIP_TOKEN = "flip-token"  # answers honestly, then changes one token in the middle
    UNDERPAY = "underpay"  # answers honestly, but signs drafters' vouchers for half of what they earned

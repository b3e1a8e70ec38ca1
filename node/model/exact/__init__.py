"""The exact arithmetic `specmarket-exact/1` (docs/exact-arithmetic.md): the GGUF's own blocks,
int8 activations, exact integer block products, and every other operation in a written order.

- ``blocks``: the GGUF block formats (Q8_0, Q5_0, Q4_K, Q6_K) decoded into their integers;
- ``recipes``: the reference of every other operation in plain torch, on any device;
- ``reference``: the Qwen2 forward in plain torch (the oracle);
- ``kernel`` (exact.c, ops.c) and ``model``: the served forward; ``convert``: the model directory.
"""

import json
from pathlib import Path

ARITHMETIC_VERSION = "specmarket-exact/1"
ARITHMETIC_KEY = "arithmetic"  # config.json's field naming the arithmetic (§11)


def is_exact_model(path: Path | str) -> bool:
    """Whether ``path`` is an exact model directory (its config names an arithmetic)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and ARITHMETIC_KEY in cfg

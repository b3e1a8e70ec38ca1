"""The exact arithmetic `specmarket-exact/1` (docs/exact-arithmetic.md): the GGUF's own blocks,
int8 activations, exact integer block products, and every other operation in a written order.

- ``blocks``: the GGUF block formats (Q8_0, Q5_0, Q4_K, Q6_K) decoded into their integers;
- ``recipes``: the reference of every other operation in plain torch, on any device.
"""

ARITHMETIC_VERSION = "specmarket-exact/1"

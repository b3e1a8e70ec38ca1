#!/usr/bin/env python3
"""Benchmark speculative decoding with drafter peers over libp2p (honest with and without overlap,
hostile-only) against plain, local speculative and HF assisted generation, in one run = `specmarket
bench-p2p`. See `--help`."""

import os
import sys

# Before torch loads OpenMP: with the default (spinning) wait policy, two torch threads sharing two
# cores with any other busy process slow HF assisted generation down up to 8x on this machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from node.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench-p2p", *sys.argv[1:]]))

#!/usr/bin/env python3
"""Benchmark speculative decoding with drafter peers over libp2p (honest, hostile-only) against plain,
local speculative and HF assisted generation, in one run. See `--help`."""

import os

# Before torch loads OpenMP: with the default (spinning) wait policy, two torch threads sharing two
# cores with any other busy process slow HF assisted generation down up to 8x on this machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import logging
import sys

from node.bench_p2p import add_arguments, config_from_args, run_bench_p2p

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_bench_p2p(config_from_args(args))
    except KeyboardInterrupt:  # drafters and targets were stopped on the way out
        sys.exit("bench-p2p: interrupted")

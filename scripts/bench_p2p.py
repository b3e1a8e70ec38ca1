#!/usr/bin/env python3
"""Benchmark speculative decoding with drafter peers over libp2p (honest, hostile-only) against plain,
local speculative and HF assisted generation, in one run. See `--help`."""

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

#!/usr/bin/env python3
"""Benchmark plain vs speculative (GUMBEL, LEVIATHAN) vs HF assisted generation. See `--help`."""

from node.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench-local", *__import__("sys").argv[1:]]))

#!/usr/bin/env python3
"""Train the shipped tokenizer, target and distilled draft (resumable). See `--help`."""

from node.training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

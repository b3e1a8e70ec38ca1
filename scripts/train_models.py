#!/usr/bin/env python3
"""Train the shipped tokenizer, target and distilled draft (resumable) = `specmarket train`. See `--help`."""

import sys

from node.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["train", *sys.argv[1:]]))

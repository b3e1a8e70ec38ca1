#!/usr/bin/env python3
"""Audit a receipted answer (`--receipt FILE`) by re-executing the target, and challenge its first token
outside the tolerance band on chain; a correct receipt spends nothing. The same as
`specmarket challenge`; see --help."""

import sys

from node.cli import main

if __name__ == "__main__":
    sys.exit(main(["challenge", *sys.argv[1:]]))

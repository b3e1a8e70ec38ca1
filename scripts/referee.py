#!/usr/bin/env python3
"""Run a referee: watch for challenges, re-execute the disputed step, sign and submit verdicts. The same
as `specmarket referee`; see --help."""

import sys

from node.cli import main

if __name__ == "__main__":
    sys.exit(main(["referee", *sys.argv[1:]]))

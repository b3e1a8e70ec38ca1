#!/usr/bin/env python3
"""Deploy SpecmarketBond: start anvil from npm if nothing answers at --rpc, deploy, write
deployments/<chainId>.json. The same as `specmarket chain deploy`; see --help."""

import sys

from node.cli import main

if __name__ == "__main__":
    sys.exit(main(["chain", "deploy", *sys.argv[1:]]))

"""The specmarket processes. The product is split by role; the lab and the CLI sit on top of it.

- ``node.target``  the bonded target node (engine, market drafting, draft rounds, HTTP API)
- ``node.drafter`` the drafter peer (node and strategies)
- ``node.client``  clients of a target node (HTTP, libp2p, receipt checking)
- ``node.chain``   the chain side (anvil, the bond contract, receipts, challenges, referees)
- ``node.model``   the model pair: named pairs, loading on a kernel, the KV-cache adapter, the
  kernels, local decoding; shared by every role
- ``node.runtime`` process runtime (data dirs, logging, heap freeze, signals, ports), owned by no role
- ``node.training`` training the shipped pair; preparing the real target, its teacher data and its draft
- ``node.lab``     demos, benchmarks, the report and the child-process helpers they use
- ``node.cli``     the `specmarket` command: arguments -> a role's config dataclass

Product code never imports ``node.lab`` or ``node.cli`` (tests/test_layout.py enforces it).
Importing ``node`` itself loads nothing; import the subpackage you need.
"""

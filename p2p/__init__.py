"""libp2p hosts, protocol ids, framing, message schemas and discovery (issue 3).

Knows nothing about models or money.
"""

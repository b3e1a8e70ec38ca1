"""Drafter registry, selection policy and accepted-token ledger (issue 3).

Holds no slashing logic: drafters risk only their effort.
"""

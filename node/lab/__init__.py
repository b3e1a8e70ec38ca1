"""The lab: what shows and measures the product, never part of it.

``demo_net`` (make demo) and ``demo_local``, the benchmarks ``bench_local`` and ``bench_p2p``, the
report (``report``, ``plots``, ``trust``, ``gamma_sweep``, ``forgery``), the shared workload
(``workload``: prompt sets and mode names) and the helpers for child processes (``procs``) and for
driving trio services from synchronous code (``trio_thread``). Import the module you need.
"""

"""The demo's memory sampler (node/lab/memory.py) sees a child's memory, and counts shared pages once."""

from __future__ import annotations

import subprocess
import sys

from node.lab.memory import GIB, MemoryPeak, tree_pss

CHILD_BYTES = 300_000_000  # touched by the child (a bytearray is zero-filled, so every page is written)


def test_memory_peak_sees_a_childs_memory_succeeds():
    with MemoryPeak() as memory:
        code = f"x = bytearray({CHILD_BYTES}); import time; time.sleep(1.5)"
        subprocess.run([sys.executable, "-c", code], check=True)
    report = memory.report()
    assert report["tree_pss_peak_gib"] >= 0.9 * CHILD_BYTES / GIB
    assert report["system_used_peak_above_idle_gib"] >= 0  # a machine-wide view: others may free memory
    assert not memory._thread.is_alive()


def test_shared_file_pages_count_once_across_processes_succeeds(tmp_path):
    """Two children mapping the same 200 MB file read-only add about 200 MB to the tree's PSS, not 400."""
    data = tmp_path / "weights.bin"
    data.write_bytes(b"\1" * 200_000_000)
    code = (
        "import mmap, sys, time\n"
        f"f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "sum(m[i] for i in range(0, len(m), 4096)); print('ready', flush=True); time.sleep(30)\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        shared = sum(tree_pss(child.pid) for child in children)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert 0.15 * GIB < shared < 0.3 * GIB


def test_model_hash_streams_a_large_weights_file_succeeds(tmp_path):
    """Every bonded target, referee and challenger hashes its model at start: a 3 GB file read whole
    took 3 GB per process (18 GB at the demo's start-up). Hashing streams it in small chunks."""
    import hashlib
    import json
    import tracemalloc

    from node.model.loading import model_hash

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    payload = b"\7" * 64_000_000
    (tmp_path / "weights.bin").write_bytes(payload)
    tracemalloc.start()
    try:
        digest = model_hash(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000, f"hashing held {peak / 1e6:.0f} MB"
    lines = [f"config.json {hashlib.sha256((tmp_path / 'config.json').read_bytes()).hexdigest()}\n"]
    lines.append(f"weights.bin {hashlib.sha256(payload).hexdigest()}\n")
    assert digest == hashlib.sha256("".join(lines).encode()).digest()

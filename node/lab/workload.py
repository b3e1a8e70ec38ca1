"""The lab's workload, written once: the prompt sets the demos and benchmarks send, and the names
of the modes they compare."""

from __future__ import annotations

# Python prompts for the shipped pair (trained on the standard library)
CODE_PROMPTS = (
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        ",
    "    for i in range(len(",
    "def read_lines(path):\n    with open(path) as f:\n        ",
    "import unittest\n\n\nclass TestParser(unittest.TestCase):\n    def test_",
    "    if not isinstance(value, int):\n        raise TypeError(",
    '"""Helpers for parsing command line options."""\n\nimport ',
    "        except OSError as exc:\n            ",
)
PARSE_ARGS_PROMPT = "def parse_args(argv):\n    parser = argparse."

BENCH_PROMPTS = CODE_PROMPTS  # bench-local and bench-p2p
LOCAL_DEMO_PROMPTS = CODE_PROMPTS[:3]  # specmarket demo
NET_DEMO_PROMPTS = (*CODE_PROMPTS[:3], PARSE_ARGS_PROMPT)  # specmarket demo-net / make demo

# the networked demo's two serving modes (a speculating and a plain bonded target)
WITH_SPECULATION, WITHOUT_SPECULATION = "with_speculation", "without_speculation"
MODES = (WITH_SPECULATION, WITHOUT_SPECULATION)
MODE_TITLES = {WITH_SPECULATION: "with speculation", WITHOUT_SPECULATION: "without speculation"}

"""The layout is the architecture: product code never imports the lab or the CLI, the lower layers
never import the upper ones, no private name crosses a module boundary, and every package states
its public API. Checked on the source (AST), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("node", "verifier", "market", "p2p")
UPPER = ("node.lab", "node.cli")  # the lab and the CLI: product code must not import them
LAUNCHER = "node.__main__"  # `python -m node` is the CLI's entry point
LAYERS = {  # package -> project packages it may import
    "verifier": ("verifier",),
    "market": ("market", "verifier"),
    "p2p": ("p2p", "verifier"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py"))


def _imports(path: Path) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """(imported module, imported names, line) for every import statement, nested ones included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, tuple(a.name for a in node.names), node.lineno


def _is_in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_product_code_never_imports_the_lab_or_the_cli():
    offenders = []
    for path in _sources(*PACKAGES):
        if _is_in(_module_name(path), UPPER) or _module_name(path) == LAUNCHER:
            continue
        offenders += [
            f"{_module_name(path)}:{line} imports {mod}" for mod, _, line in _imports(path) if _is_in(mod, UPPER)
        ]
    assert not offenders, offenders


def test_the_lab_never_imports_the_cli():
    offenders = [
        f"{_module_name(path)}:{line} imports {mod}"
        for path in _sources("node/lab")
        for mod, _, line in _imports(path)
        if _is_in(mod, ("node.cli",))
    ]
    assert not offenders, offenders


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_lower_layers_import_only_what_is_below_them(package):
    offenders = [
        f"{_module_name(path)}:{line} imports {mod}"
        for path in _sources(package)
        for mod, _, line in _imports(path)
        if _is_in(mod, PACKAGES) and not _is_in(mod, LAYERS[package])
    ]
    assert not offenders, offenders


def test_no_private_name_is_imported_across_modules():
    offenders = [
        f"{_module_name(path)}:{line} imports {name} from {mod}"
        for path in _sources(*PACKAGES, "tests", "scripts")
        for mod, names, line in _imports(path)
        if _is_in(mod, (*PACKAGES, "tests"))
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not offenders, offenders


def test_the_layout_check_sees_a_violation(tmp_path):
    """The walker is not vacuous: a product module importing the lab is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from node.lab.procs import spawn\n    from node.models import _private\n")
    found = list(_imports(bad))
    assert ("node.lab.procs", ("spawn",), 2) in found and any(_is_in(m, UPPER) for m, _, _ in found)
    assert any(n.startswith("_") for _, names, _ in found for n in names)


@pytest.mark.parametrize(
    "package, names",
    [
        ("verifier", ("verify", "Rule", "SamplingParams", "decode", "SpecmarketError", "MAX_SEED", "MAX_GAMMA")),
        ("market", ("Registry", "Policy", "Ledger")),
        ("p2p", ("FrameStream", "Open", "Draft", "DRAFT_PROTOCOL_ID")),
        ("node.target", ("TargetNode", "TargetConfig", "Engine")),
        ("node.drafter", ("DrafterNode", "DrafterConfig", "STRATEGIES")),
        ("node.client", ("ask", "AskConfig", "stream_completion")),
        ("node.chain", ("BondClient", "ChainError", "SignedReceipt", "Referee", "read_key")),
    ],
)
def test_every_package_states_its_public_api(package, names):
    module = importlib.import_module(package)
    assert set(names) <= set(module.__all__), set(names) - set(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names {name}, which it does not define"


def test_one_root_exception():
    """Every exception class the project defines derives from SpecmarketError."""
    from verifier.errors import SpecmarketError

    strays = []
    for path in _sources(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id in ("Exception", "BaseException") for b in node.bases
            ):
                cls = getattr(importlib.import_module(_module_name(path)), node.name)
                if not issubclass(cls, SpecmarketError) and cls is not SpecmarketError:
                    strays.append(f"{_module_name(path)}.{node.name}")
    assert not strays, strays


def test_the_cli_starts_without_the_heavy_stacks():
    """Building the parser reads every role's config dataclass; none of them may pull in torch,
    libp2p, web3 or the HTTP server's stack (each costs start-up time, and `specmarket --help` needs
    none)."""
    heavy = ("torch", "transformers", "libp2p", "web3", "eth_account", "fastapi", "prometheus_client")
    code = f"import sys, node.cli; node.cli.build_parser(); print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout

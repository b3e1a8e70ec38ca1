"""The layout is the architecture: product code never imports the lab or the CLI, the lower layers
never import the upper ones, no private name crosses a module boundary, and every package states
its public API. ``node/`` holds rooms only (subpackages), a family of modules is a room rather than
a name prefix, the model's kernels never import its loading, and no project module takes part in
an import cycle, nor does any room. Checked on the source (AST), so a lazy import inside a
function counts too, and so does a name a package exports lazily (its ``EXPORTS``)."""

from __future__ import annotations

import ast
import functools
import importlib
import subprocess
import sys
from collections.abc import Iterator, Mapping
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
PACKAGE_FILES = ("__init__.py", "__main__.py")  # all that node/ holds besides its rooms
ROOMED_FAMILIES = ("http", "distill")  # once name prefixes (http_api.py, distill_ship.py), now rooms
KERNELS, LOADING = "node.model.kernels", "node.model.loading"  # loading chooses the kernel, not back


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(*roots: str, base: Path = ROOT) -> list[Path]:
    return sorted(p for root in roots for p in (base / root).rglob("*.py"))


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


def _lazy_exports(path: Path) -> dict[str, str]:
    """name -> defining module, from a package's ``EXPORTS`` literal (verifier.exports)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPORTS" for t in node.targets):
            return {name: module for module, names in ast.literal_eval(node.value).items() for name in names}
    return {}


@functools.cache  # three tests read the project's graph: parse the sources once
def _import_graph(base: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports: ``from pkg import sub`` is the submodule, a name
    ``pkg`` exports lazily is its defining module, anything else the nearest module that exists."""
    paths = {_module_name(path, base): path for path in _sources(*packages, base=base)}
    exports = {module: _lazy_exports(path) for module, path in paths.items() if path.name == "__init__.py"}

    def nearest(module: str) -> str | None:
        while module and module not in paths:
            module = module.rpartition(".")[0]
        return module or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for imported, names, _ in _imports(path):
            wanted = [
                f"{imported}.{n}" if f"{imported}.{n}" in paths else exports.get(imported, {}).get(n, imported)
                for n in names
            ]
            targets.update(t for t in map(nearest, wanted or [imported]) if t)
        graph[module] = targets - {module}
    return graph


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # the graphs here are shallow: recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _room(module: str) -> str:
    """The room a module lives in: ``node.<room>`` for the processes, else its top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "node" and len(parts) > 1 and parts[1] != "__main__" else parts[0]


def _room_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(_room(module), set()).update(_room(t) for t in targets if _room(t) != _room(module))
    return rooms


def _reaches(graph: Mapping[str, set[str]], start: str, goal: str) -> list[str] | None:
    """An import chain from ``start`` to ``goal`` (or under it), or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop()
        for nxt in sorted(graph.get(path[-1], ())):
            if _is_in(nxt, (goal,)):
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                paths.append([*path, nxt])
    return None


def _loose_modules(package_dir: Path) -> list[str]:
    """Modules lying directly in ``package_dir`` besides its package files, and folders there that
    are not packages."""
    loose = [p.name for p in package_dir.glob("*.py") if p.name not in PACKAGE_FILES]
    loose += [
        f"{p.name}/"
        for p in package_dir.iterdir()
        if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").is_file()
    ]
    return sorted(loose)


def _prefix_families(base: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Modules named ``<family>_<x>.py`` where the family has a room: one of ROOMED_FAMILIES, or a
    package beside the module (``http_x.py`` next to ``http/``)."""
    strays = []
    for path in _sources(*packages, base=base):
        family, sep, _ = path.stem.partition("_")
        if sep and family and (family in ROOMED_FAMILIES or (path.parent / family / "__init__.py").is_file()):
            strays.append(_module_name(path, base))
    return strays


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


def test_node_holds_only_rooms():
    """node/ holds its package files and subpackages (its rooms), no loose module."""
    assert not _loose_modules(ROOT / "node"), _loose_modules(ROOT / "node")


def test_a_family_of_modules_is_a_room_not_a_prefix():
    assert not _prefix_families(), _prefix_families()


def test_the_kernels_never_import_the_loading():
    """Loading chooses the kernel (node.model.loading.load_kernel); the kernels build on the adapter
    (node.model.adapter) and know nothing of loading, not even through another module."""
    graph = _import_graph()
    chains = [chain for module in graph if _is_in(module, (KERNELS,)) if (chain := _reaches(graph, module, LOADING))]
    assert not chains, chains


def test_no_import_cycle_between_modules():
    """No project module imports itself back, through any chain, lazy imports included."""
    cycles = _cycles(_import_graph())
    assert not cycles, cycles


def test_no_import_cycle_between_rooms():
    """Nor does any room (``node.<room>``, ``verifier``, ``market``, ``p2p``): the rooms' imports
    point one way."""
    cycles = _cycles(_room_graph(_import_graph()))
    assert not cycles, cycles


def _plant(base: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(text)


def test_the_layout_check_sees_a_violation(tmp_path):
    """The walker is not vacuous: a product module importing the lab is found, and so are a loose
    module in node/, a prefix family, the kernels reaching the loading, and cycles."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from node.lab.procs import spawn\n    from node.model.loading import _private\n")
    found = list(_imports(bad))
    assert ("node.lab.procs", ("spawn",), 2) in found and any(_is_in(m, UPPER) for m, _, _ in found)
    assert any(n.startswith("_") for _, names, _ in found for n in names)

    _plant(
        tmp_path,
        {
            "node/__init__.py": "",
            "node/models.py": "",  # a loose module
            "node/target/__init__.py": "",
            "node/target/http_api.py": "from node.chain import settle\n",  # a family's prefix
            "node/target/static/page.html": "",  # a folder that is no package
            "node/chain/__init__.py": 'EXPORTS = {"node.chain.referee": ("settle",)}\n',
            "node/chain/referee.py": "def f():\n    import node.target.http_api\n",  # a cycle of rooms too
            "node/model/__init__.py": 'EXPORTS = {"node.model.loading": ("load_pair",)}\n',
            "node/model/loading.py": "from node.model.kernels import library\n",
            "node/model/kernels/__init__.py": "def library():\n    from node.model import load_pair\n",
        },
    )
    assert _loose_modules(tmp_path / "node") == ["models.py"]
    assert _loose_modules(tmp_path / "node" / "target") == ["http_api.py", "static/"]
    assert _prefix_families(tmp_path, ("node",)) == ["node.target.http_api"]
    graph = _import_graph(tmp_path, ("node",))
    assert graph["node.chain.referee"] == {"node.target.http_api"} and graph["node.model"] == set()
    assert _reaches(graph, KERNELS, LOADING) == [KERNELS, LOADING]  # through node.model's lazy export
    assert _cycles(graph) == [["node.chain.referee", "node.target.http_api"], [KERNELS, LOADING]]
    assert _cycles(_room_graph(graph)) == [["node.chain", "node.target"]]


@pytest.mark.parametrize(
    "package, names",
    [
        ("verifier", ("verify", "Rule", "SamplingParams", "decode", "SpecmarketError", "MAX_SEED", "MAX_GAMMA")),
        ("market", ("Registry", "Policy", "Ledger")),
        ("p2p", ("FrameStream", "Open", "Draft", "DRAFT_PROTOCOL_ID", "TooDeep", "check_depth")),
        ("node.model", ("HFCausalLM", "ModelPair", "load_pair", "load_kernel", "PAIRS", "KERNELS", "generate")),
        ("node.runtime", ("default_data_dir", "node_logging", "serve_until_signalled", "holding_port")),
        ("node.target", ("TargetNode", "TargetConfig", "Engine")),
        ("node.target.http", ("build_app", "serve_http", "write_simulator")),
        ("node.training.distill", ("DistillConfig", "DistillError", "label")),
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


def test_an_unbonded_target_loads_no_chain_stack():
    """The target node, its engine and its HTTP API import without web3 or eth-account (about a
    second and a half of every start), and an unbonded node's config asks for no operator: only a
    bonded target (``--chain``) loads them, when it bonds."""
    heavy = ("web3", "eth_account", "py_ecc")
    code = (
        "import sys, node.target.node; from node.target.config import TargetConfig; "
        "assert TargetConfig().operator is None; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout

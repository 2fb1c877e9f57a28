"""The import map of docs/architecture.md, as tests: each package imports only what the design
allows, and no two modules import each other (directly or round a longer loop).

The source files are parsed (ast), never imported, so the rules also cover lazy imports inside
functions and `if TYPE_CHECKING:` blocks, and a module that would fail to import still counts.
Relative imports are resolved against their package. `importlib.import_module("...")` with a
string is not an import here (that is how `tidegate` dispatches to its subcommands lazily).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scheduler", "sims", "gateway", "backend", "tokenizer", "proto", "bench",
            "engine_flags", "evals", "training")
GENERATED = {"proto/tidegate_pb2.py"}
TORCH = {"torch", "triton"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(root: Path) -> dict[str, Path]:
    """Module name -> file, for every package of ours (generated code left out)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            if path.relative_to(root).as_posix() not in GENERATED:
                out[_module_name(path, root)] = path
    return out


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name `module` imports (`from a import b` gives `a.b` and `a`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path | None = None) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between our modules, top-level names of every import) per module of ours."""
    sources = _sources(root or ROOT)
    edges: dict[str, set[str]] = {}
    tops: dict[str, set[str]] = {}
    for module, path in sources.items():
        names = _imported_names(module, path)
        tops[module] = {n.split(".")[0] for n in names if n}
        # an import names the deepest module of ours it reaches (`from a import b`: the module
        # a.b if there is one, else a); a package's own __init__ is not an edge to its modules
        edges[module] = {n for n in names if n in sources and n != module}
        edges[module] -= {p for p in edges[module]
                          if any(o.startswith(p + ".") for o in edges[module])
                          and sources[p].name == "__init__.py"}
    return edges, tops


def _package_imports(tops: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    return {m: t for m, t in tops.items() if m == package or m.startswith(package + ".")}


def _violations(tops: dict[str, set[str]], package: str, forbidden: set[str]) -> list[str]:
    return sorted(f"{m} imports {n}" for m, t in _package_imports(tops, package).items()
                  for n in sorted(t & forbidden))


def _ours_except(allowed: set[str]) -> set[str]:
    return set(PACKAGES) - allowed


def test_scheduler_imports_only_itself_and_no_runtime():
    _, tops = import_graph()
    assert _package_imports(tops, "scheduler"), "no scheduler modules found"
    forbidden = _ours_except({"scheduler"}) | TORCH | {"asyncio", "zmq", "aiohttp", "uvloop", "socket"}
    assert _violations(tops, "scheduler", forbidden) == []


def test_sims_imports_only_scheduler():
    _, tops = import_graph()
    forbidden = _ours_except({"sims", "scheduler"}) | TORCH | {"zmq", "aiohttp"}
    assert _violations(tops, "sims", forbidden) == []


def test_gateway_never_imports_backend_or_torch():
    _, tops = import_graph()
    forbidden = {"backend", "sims", "bench"} | TORCH
    assert _violations(tops, "gateway", forbidden) == []


def test_backend_never_imports_gateway():
    _, tops = import_graph()
    assert _violations(tops, "backend", {"gateway", "sims", "bench", "evals", "training"}) == []


def test_measurement_evaluation_and_training_are_imported_by_nothing_of_the_runtime():
    # bench/ may import anything; evals/ only the runtime; training/ nothing of ours
    _, tops = import_graph()
    for package in ("scheduler", "sims", "gateway", "backend", "tokenizer", "proto",
                    "engine_flags"):
        assert _violations(tops, package, {"bench", "evals", "training"}) == [], package
    assert _violations(tops, "evals", {"bench", "training", "gateway", "sims"}) == []
    assert _package_imports(tops, "training"), "training not found"
    assert _violations(tops, "training", _ours_except({"training"})) == []


def test_engine_flags_is_a_torch_free_leaf():
    # `tidegate serve` (the gateway process) and `tidegate backend` both read the engine's flags
    _, tops = import_graph()
    assert _package_imports(tops, "engine_flags"), "engine_flags not found"
    forbidden = _ours_except({"engine_flags", "scheduler"}) | TORCH | {"zmq", "aiohttp"}
    assert _violations(tops, "engine_flags", forbidden) == []


def test_tokenizer_and_proto_are_leaves():
    _, tops = import_graph()
    assert _violations(tops, "tokenizer", _ours_except({"tokenizer"}) | TORCH) == []
    assert _violations(tops, "proto", _ours_except({"proto"}) | TORCH) == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loops_between_modules():
    edges, _ = import_graph()
    assert len(edges) > 50
    assert _cycles(edges) == []

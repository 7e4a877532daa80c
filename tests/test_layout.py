"""The package layout, checked on the source: who may import whom.

Every ``import`` statement of pacer_core, pacer_bench, pacer_train (when present) and the plugin
packages is read with ``ast`` — at module level and inside functions alike; only the bodies of
``if TYPE_CHECKING:`` blocks, which never run, are left out — into a graph of modules. The rules:

- no import cycle between modules;
- pacer_core (the engine) imports nothing from pacer_bench, pacer_train or any plugin package;
- only the model adapter, ``pacer_core/hf.py`` or the ``pacer_core/hf/`` package, imports transformers.

And the tests themselves: no test module imports another test module (shared code is in
tests/helpers.py and tests/strategies.py, shared fixtures in tests/conftest.py), nothing in tests/
changes ``sys.path`` (pyproject's ``pythonpath`` puts tests/ on it) and only tests/helpers.py sets
torch's thread count (conftest.py applies it to every test).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
CORE = "pacer_core"
HARNESS = ("pacer_bench", "pacer_train")
TESTS = ROOT / "tests"
THREADS_HELPER = "helpers.py"  # the one module of tests/ calling torch.set_num_threads
ADAPTER = "pacer_core.hf"  # a module (hf.py) or a package (hf/): the only importer of transformers
MODEL_LIBRARY = "transformers"


def _packages() -> dict[str, Path]:
    """Top-level package name → its folder: the core, the harness packages present, the plugins."""
    found = {name: ROOT / name for name in (CORE, *HARNESS) if (ROOT / name / "__init__.py").exists()}
    found.update({p.name: p for p in sorted(PLUGINS.iterdir()) if (p / "__init__.py").exists()})
    return found


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    """Module name → file, for every module of the scanned packages."""
    return {_module_name(package, folder, path): path
            for package, folder in _packages().items() for path in sorted(folder.rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_nodes(tree: ast.AST, type_only: bool = False):
    """Every node of ``tree`` (functions' bodies included) except the bodies of ``if TYPE_CHECKING:``
    blocks, which only annotations read and which never run; with ``type_only``, those too."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if _is_type_checking(node) and not type_only:
            pending += node.orelse
        else:
            pending += list(ast.iter_child_nodes(node))


def _imports(module: str, path: Path, type_only: bool = False) -> list[tuple[str, int]]:
    """(imported name, line) for every import in ``path``, wherever it stands (with ``type_only``,
    inside ``if TYPE_CHECKING:`` blocks too); relative imports are resolved; ``from X import n`` names
    ``X.n``, which is the submodule ``X.n`` if there is one, else ``X``."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path)), type_only):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(target if alias.name == "*" else f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return out


def _resolve(name: str, modules: set[str]) -> str:
    """The scanned module an imported name loads (its longest known prefix), else the name itself."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return name


def import_graph(type_only: bool = False) -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    """(module → modules and external names it imports, (module, import) → the line of one such import);
    with ``type_only``, the imports annotations alone read (``if TYPE_CHECKING:``) count too."""
    sources = _sources()
    modules = set(sources)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    lines: dict[tuple[str, str], int] = {}
    for module, path in sources.items():
        for name, line in _imports(module, path, type_only):
            target = _resolve(name, modules)
            if target == module or target.startswith("__future__"):
                continue
            graph[module].add(target)
            lines.setdefault((module, target), line)
    return graph, lines


def _top(name: str) -> str:
    return name.split(".")[0]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue  # an external library
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_scan_sees_every_package(graph):
    modules, _ = graph
    tops = {_top(m) for m in modules}
    assert {CORE, "pacer_bench", "pacer_builtins"} <= tops
    assert "pacer_core.engine" in modules and "pacer_bench.run" in modules
    assert ADAPTER in modules  # hf.py, or the hf/ package's __init__.py
    # imports inside functions count too: the bench loads the adapter lazily
    assert ADAPTER in modules["pacer_bench.units"]


def test_no_import_cycle(graph):
    modules, lines = graph
    cycles = find_cycles(modules)
    described = ["; ".join(f"{a} imports {b} (line {lines[a, b]})" for a in cycle for b in sorted(modules[a])
                           if b in cycle) for cycle in cycles]
    assert not cycles, "import cycles: " + " | ".join(described)


def test_no_import_cycle_in_the_engine_even_for_annotations():
    """pacer_core's modules form no cycle even counting ``if TYPE_CHECKING:`` imports: a module's
    annotations name only types of modules below it (``DecodeState`` lives in pacer_core.types, which
    the hook manual and the engine both read), so the package reads in one direction."""
    modules, lines = import_graph(type_only=True)
    core = {m: {t for t in targets if _top(t) == CORE} for m, targets in modules.items() if _top(m) == CORE}
    cycles = find_cycles(core)
    described = ["; ".join(f"{a} imports {b} (line {lines[a, b]})" for a in cycle for b in sorted(core[a])
                           if b in cycle) for cycle in cycles]
    assert not cycles, "import cycles in pacer_core (type-only imports included): " + " | ".join(described)


def test_the_engine_imports_no_harness_and_no_plugin(graph):
    modules, lines = graph
    packages = _packages()
    forbidden = {name for name in packages if name != CORE} | set(HARNESS)
    bad = [f"{m} imports {t} (line {lines[m, t]})" for m, targets in sorted(modules.items()) if _top(m) == CORE
           for t in sorted(targets) if _top(t) in forbidden]
    assert not bad, "pacer_core must import only itself and libraries: " + "; ".join(bad)


def test_only_the_model_adapter_imports_transformers(graph):
    modules, lines = graph
    importers = {m for m, targets in modules.items() if any(_top(t) == MODEL_LIBRARY for t in targets)}
    bad = sorted(m for m in importers if m != ADAPTER and not m.startswith(ADAPTER + "."))
    assert not bad, "transformers is imported outside pacer_core.hf: " + "; ".join(
        f"{m} (line {min(lines[m, t] for t in modules[m] if _top(t) == MODEL_LIBRARY)})" for m in bad)
    assert importers, "the adapter imports transformers; the scan should see it"


def test_the_rules_catch_what_they_forbid():
    """The checks themselves, on a made-up graph: a cycle, a core module importing the harness."""
    made_up = {"a.x": {"a.y"}, "a.y": {"a.z", "torch"}, "a.z": {"a.x"}, "b": {"a.x"}}
    assert find_cycles(made_up) == [["a.x", "a.y", "a.z"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert _resolve("pacer_core.hf.load_model", {"pacer_core", "pacer_core.hf"}) == "pacer_core.hf"
    assert _resolve("transformers.generation", {"pacer_core"}) == "transformers.generation"


def test_imports_inside_functions_count_and_type_checking_blocks_do_not(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.only_typing\nelse:\n"
                    "    import a.fallback\n\ndef f():\n    from .sibling import g\n    import transformers\n")
    names = {name for name, _ in _imports("pkg.mod", path)}
    assert {"pkg.sibling.g", "transformers", "a.fallback", "typing.TYPE_CHECKING"} == names
    assert {name for name, _ in _imports("pkg.mod", path, type_only=True)} == names | {"a.only_typing"}



# -- the tests' own layout ---------------------------------------------------------------------------
def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def _changes_sys_path(node: ast.AST) -> bool:
    """``sys.path.insert(...)`` (append, extend, ...), ``sys.path = ...``, ``sys.path[:] = ...``, ``sys.path += ...``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_path(node.func.value):
        return node.func.attr in {"insert", "append", "extend", "remove", "pop", "clear"}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
    return any(_is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value)) for t in targets)


def test_folder_problems(folder: Path) -> list[str]:
    """In every .py file of a test folder: imports of a test module (``test_*``, ``conftest``, by any
    path: ``test_x``, ``tests.test_x``, ``from . import test_x``), changes to ``sys.path`` and, outside
    THREADS_HELPER, calls of ``set_num_threads``."""
    test_modules = {p.stem for p in folder.glob("*.py") if p.stem.startswith("test_") or p.stem == "conftest"}
    problems = []
    for path in sorted(folder.glob("*.py")):
        where = path.relative_to(folder)
        problems += [f"{where}:{line} imports the test module {name}" for name, line in _imports(path.stem, path)
                     if set(name.split(".")) & (test_modules - {path.stem})]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _changes_sys_path(node):
                problems.append(f"{where}:{node.lineno} changes sys.path")
            if (path.name != THREADS_HELPER and isinstance(node, ast.Call)
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) == "set_num_threads"):
                problems.append(f"{where}:{node.lineno} sets torch's thread count")
    return problems


test_folder_problems.__test__ = False  # a helper of the tests below, not a test


def test_test_modules_share_code_through_helpers_and_conftest_only():
    problems = test_folder_problems(TESTS)
    assert not problems, ("tests/: " + "; ".join(problems) + " (shared builders go in tests/helpers.py, shared "
                          "fixtures in tests/conftest.py; thread counts through helpers.torch_threads or "
                          "conftest's real_model_threads fixture)")


def test_the_test_folder_check_catches_what_it_forbids(tmp_path):
    (tmp_path / "conftest.py").write_text("from helpers import pin_threads\n")
    (tmp_path / "helpers.py").write_text("import torch\ntorch.set_num_threads(1)\n")
    (tmp_path / "test_a.py").write_text("import sys\nsys.path.insert(0, 'x')\nfrom test_b import f\n"
                                        "import helpers, strategies\nprint(sys.path)\n")
    (tmp_path / "test_b.py").write_text("import sys\ndef f():\n    from . import test_a\n    import tests.conftest\n"
                                        "    sys.path[:] = []\n    torch.set_num_threads(2)\n")
    assert sorted(test_folder_problems(tmp_path)) == [
        "test_a.py:2 changes sys.path", "test_a.py:3 imports the test module test_b.f",
        "test_b.py:3 imports the test module .test_a", "test_b.py:4 imports the test module tests.conftest",
        "test_b.py:5 changes sys.path", "test_b.py:6 sets torch's thread count"]

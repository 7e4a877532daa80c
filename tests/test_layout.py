"""The package layout, checked on the source: who may import whom.

Every ``import`` statement of pacer_core, pacer_bench, pacer_train (when present) and the plugin
packages is read with ``ast`` — at module level and inside functions alike; only the bodies of
``if TYPE_CHECKING:`` blocks, which never run, are left out — into a graph of modules. The rules:

- no import cycle between modules;
- pacer_core (the engine) imports nothing from pacer_bench, pacer_train or any plugin package;
- only the model adapter, ``pacer_core/hf.py`` or the ``pacer_core/hf/`` package, imports transformers;
- no plugin imports another plugin, anywhere in its modules (functions' bodies included): what two
  plugins share lives in pacer_train or pacer_core;
- no plugin module imports pacer_bench when it is imported (module and class bodies; a command may
  import it inside its function);
- pacer_core holds no training code (no optimizer, no gradient computed);
- no module outside tests/ is longer than ``MAX_LINES``, but those listed in ``OVER_MAX_LINES``, a
  list that only shrinks;
- no function of the scanned packages is longer than ``MAX_FUNCTION_LINES``, but those listed in
  ``OVER_MAX_FUNCTION_LINES``, a list that only shrinks;
- no module imports another package's private (underscore) names, and none reaches into another
  package's folder through a string path or another package's module's ``__file__`` (shipped data is
  found by name: docs/assets.md#shipped-data).

And the tests themselves: no test module imports another test module (shared code is in
tests/helpers.py and tests/strategies.py, shared fixtures in tests/conftest.py), nothing in tests/
changes ``sys.path`` (pyproject's ``pythonpath`` puts tests/ on it) and only tests/helpers.py sets
torch's thread count (conftest.py applies it to every test).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"  # the package pacer_plugins (pyproject.toml's package-dir); each folder a plugin
PLUGIN_PACKAGE = "pacer_plugins"
CORE = "pacer_core"
HARNESS = ("pacer_bench", "pacer_train")
TESTS = ROOT / "tests"
THREADS_HELPER = "helpers.py"  # the one module of tests/ calling torch.set_num_threads
ADAPTER = "pacer_core.hf"  # a module (hf.py) or a package (hf/): the only importer of transformers
MODEL_LIBRARY = "transformers"


def _packages() -> dict[str, Path]:
    """Top-level package name → its folder: the core, the harness packages present, the plugins."""
    found = {name: ROOT / name for name in (CORE, *HARNESS) if (ROOT / name / "__init__.py").exists()}
    found.update({f"{PLUGIN_PACKAGE}.{p.name}": p for p in sorted(PLUGINS.iterdir()) if (p / "__init__.py").exists()})
    return found


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    """Module name → file, for every module of the scanned packages."""
    return {
        _module_name(package, folder, path): path
        for package, folder in _packages().items()
        for path in sorted(folder.rglob("*.py"))
    }


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)  # bodies that run when called, not on import


def _runtime_nodes(tree: ast.AST, type_only: bool = False, import_time: bool = False):
    """Every node of ``tree`` (functions' bodies included) except the bodies of ``if TYPE_CHECKING:``
    blocks, which only annotations read and which never run; with ``type_only``, those too; with
    ``import_time``, not the functions' bodies either (what importing the module runs: its module
    and class bodies)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if import_time and isinstance(node, FUNCTIONS):
            continue
        if _is_type_checking(node) and not type_only:
            pending += node.orelse
        else:
            pending += list(ast.iter_child_nodes(node))


def _imports(module: str, path: Path, type_only: bool = False, import_time: bool = False) -> list[tuple[str, int]]:
    """(imported name, line) for every import in ``path``, wherever it stands (with ``type_only``,
    inside ``if TYPE_CHECKING:`` blocks too; with ``import_time``, only outside functions' bodies);
    relative imports are resolved; ``from X import n`` names ``X.n``, which is the submodule ``X.n``
    if there is one, else ``X``."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path)), type_only, import_time):
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
    """The package a module belongs to: its top-level package, or for a plugin ``pacer_plugins.<plugin>``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == PLUGIN_PACKAGE and len(parts) > 1 else parts[0]


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
    assert {CORE, "pacer_bench", f"{PLUGIN_PACKAGE}.pacer_builtins"} <= tops
    assert "pacer_core.engine" in modules and "pacer_bench.run" in modules
    assert ADAPTER in modules  # hf.py, or the hf/ package's __init__.py
    # imports inside functions count too: the bench loads the adapter lazily
    assert ADAPTER in modules["pacer_bench.units"]


def test_no_import_cycle(graph):
    """No two modules of the tree import each other, directly or round a loop, counting the imports
    annotations alone read (``if TYPE_CHECKING:``) too: the tree reads in one direction."""
    modules, lines = import_graph(type_only=True)
    cycles = find_cycles(modules)
    described = [
        "; ".join(f"{a} imports {b} (line {lines[a, b]})" for a in cycle for b in sorted(modules[a]) if b in cycle)
        for cycle in cycles
    ]
    assert not cycles, "import cycles: " + " | ".join(described)


def test_no_import_cycle_in_the_engine_even_for_annotations():
    """pacer_core's modules form no cycle even counting ``if TYPE_CHECKING:`` imports: a module's
    annotations name only types of modules below it (``DecodeState`` lives in pacer_core.types, which
    the hook manual and the engine both read), so the package reads in one direction."""
    modules, lines = import_graph(type_only=True)
    core = {m: {t for t in targets if _top(t) == CORE} for m, targets in modules.items() if _top(m) == CORE}
    cycles = find_cycles(core)
    described = [
        "; ".join(f"{a} imports {b} (line {lines[a, b]})" for a in cycle for b in sorted(core[a]) if b in cycle)
        for cycle in cycles
    ]
    assert not cycles, "import cycles in pacer_core (type-only imports included): " + " | ".join(described)


def test_the_engine_imports_no_harness_and_no_plugin(graph):
    modules, lines = graph
    packages = _packages()
    forbidden = {name for name in packages if name != CORE} | set(HARNESS)
    bad = [
        f"{m} imports {t} (line {lines[m, t]})"
        for m, targets in sorted(modules.items())
        if _top(m) == CORE
        for t in sorted(targets)
        if _top(t) in forbidden
    ]
    assert not bad, "pacer_core must import only itself and libraries: " + "; ".join(bad)


def test_only_the_model_adapter_imports_transformers(graph):
    modules, lines = graph
    importers = {m for m, targets in modules.items() if any(_top(t) == MODEL_LIBRARY for t in targets)}
    bad = sorted(m for m in importers if m != ADAPTER and not m.startswith(ADAPTER + "."))
    assert not bad, "transformers is imported outside pacer_core.hf: " + "; ".join(
        f"{m} (line {min(lines[m, t] for t in modules[m] if _top(t) == MODEL_LIBRARY)})" for m in bad
    )
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
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.only_typing\nelse:\n"
        "    import a.fallback\n\ndef f():\n    from .sibling import g\n    import transformers\n"
    )
    names = {name for name, _ in _imports("pkg.mod", path)}
    assert {"pkg.sibling.g", "transformers", "a.fallback", "typing.TYPE_CHECKING"} == names
    assert {name for name, _ in _imports("pkg.mod", path, type_only=True)} == names | {"a.only_typing"}


# -- what lives where ------------------------------------------------------------------------------
BENCH = "pacer_bench"
MAX_LINES = 600  # a module longer than this is split along a seam (tests/ excepted)
# modules still over MAX_LINES, each to be split; the list only shrinks (a module back under the limit
# must leave it, and no other module may pass the limit)
OVER_MAX_LINES: set[str] = set()  # none left
SKIPPED_FOLDERS = {"tests", "runs", "build", "dist", "node_modules", "__pycache__"}  # and hidden ones
MAX_FUNCTION_LINES = 80  # a longer function is split into helpers, so that it reads as a table of contents
# functions still over MAX_FUNCTION_LINES, as "path::qualified name"; the list only shrinks (a function
# back under the limit must leave it, and no other function may pass the limit)
OVER_MAX_FUNCTION_LINES: set[str] = {
    "plugins/eagle/agreement.py::run_draft_eval",
    "plugins/eagle/export.py::export_draft",
    "plugins/eagle/students.py::load_init",
}


def import_time_problems(sources: dict[str, Path], plugins: set[str]) -> list[str]:
    """Plugin modules importing the bench when imported (module or class bodies): the bench may
    import plugins, and a plugin's command may use the bench inside the function that runs it."""
    return [
        f"{module} imports {name} at import time (line {line})"
        for module, path in sorted(sources.items())
        if _top(module) in plugins
        for name, line in sorted(_imports(module, path, import_time=True), key=lambda x: x[1])
        if _top(name) == BENCH
    ]


def training_code(path: Path) -> list[str]:
    """Where ``path`` trains: an optimizer (``torch.optim``, imported or reached as an attribute) or a
    gradient computed (``.backward()``, ``torch.autograd.grad``, ``.zero_grad()``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: imports {a.name}"
                for a in node.names
                if a.name.split(".")[:2] in (["torch", "optim"], ["torch", "autograd"])
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            found += [
                f"line {node.lineno}: imports {n}"
                for n in names
                if n.split(".")[:2] in (["torch", "optim"], ["torch", "autograd"])
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "torch"
            and node.attr in ("optim", "autograd")
        ):
            found.append(f"line {node.lineno}: uses torch.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("backward", "zero_grad")
        ):
            found.append(f"line {node.lineno}: calls .{node.func.attr}()")
    return found


def long_modules(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every .py file under ``root`` outside tests/ and hidden or build folders with more than
    ``limit`` lines: its path relative to ``root`` → its line count."""
    found = {}
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(
            d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS and not d.endswith(".egg-info")
        )
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(folder, name)
                count = len(path.read_text().splitlines())
                if count > limit:
                    found[path.relative_to(root).as_posix()] = count
    return found


def test_no_plugin_imports_the_bench_at_import_time():
    plugins = {name for name, folder in _packages().items() if folder.parent == PLUGINS}
    problems = import_time_problems(_sources(), plugins)
    assert not problems, (
        "a plugin depends on the engine and the training package, not on the bench (a command may "
        "import it inside its function; a bench tool lives in pacer_bench): " + "; ".join(problems)
    )


def test_the_engine_holds_no_training_code():
    problems = [
        f"{module} {where}"
        for module, path in sorted(_sources().items())
        if _top(module) == CORE
        for where in training_code(path)
    ]
    assert not problems, "training code lives in pacer_train (or a plugin's trainer), not pacer_core: " + "; ".join(
        problems
    )


def assert_within_allowance(long: dict[str, int], allowance: set[str], name: str, what: str, limit: int, fix: str):
    """A line limit with an allowance list that only shrinks: everything over ``limit`` (``long``: each
    offender → its line count) is listed in ``allowance`` (the set called ``name`` in this file), and
    every listed entry is still over it. ``what`` names the offenders, ``fix`` says how to mend one."""
    unlisted = {entry: n for entry, n in long.items() if entry not in allowance}
    assert not unlisted, (
        f"{what} over {limit} lines: " + ", ".join(f"{e} ({n})" for e, n in sorted(unlisted.items())) + f": {fix}"
    )
    fixed = sorted(allowance - set(long))
    assert not fixed, (
        f"{', '.join(fixed)} no longer exceed {limit} lines (or are gone): remove them from "
        f"{name} in tests/test_layout.py"
    )


def test_the_allowance_rule_catches_an_unlisted_offender_and_a_stale_entry():
    assert_within_allowance({"a.py": 700}, {"a.py"}, "LIST", "modules", 600, "split it")
    with pytest.raises(AssertionError, match=r"modules over 600 lines: b\.py \(601\): split it"):
        assert_within_allowance({"a.py": 700, "b.py": 601}, {"a.py"}, "LIST", "modules", 600, "split it")
    with pytest.raises(
        AssertionError, match=r"a\.py no longer exceed 600 lines \(or are gone\): remove them from LIST"
    ):
        assert_within_allowance({}, {"a.py"}, "LIST", "modules", 600, "split it")


def test_no_module_passes_the_line_limit_but_the_listed_ones_and_the_list_only_shrinks():
    long = long_modules(ROOT)
    assert_within_allowance(long, OVER_MAX_LINES, "OVER_MAX_LINES", "modules", MAX_LINES, "split each along a seam")


def long_functions(paths: list[Path], root: Path, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """Every function (or method, nested ones included) of the files ``paths`` longer than ``limit``
    lines, decorators left out: "its file relative to ``root``::its qualified name" → its line count."""
    found = {}
    for path in paths:
        pending: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text(), str(path)), "")]
        while pending:
            node, prefix = pending.pop()
            for child in ast.iter_child_nodes(node):
                name = getattr(child, "name", None)
                inner = f"{prefix}{name}." if isinstance(child, (ast.ClassDef, *FUNCTIONS[:2])) else prefix
                if isinstance(child, FUNCTIONS[:2]) and child.end_lineno is not None:
                    count = child.end_lineno - child.lineno + 1
                    if count > limit:
                        found[f"{path.relative_to(root).as_posix()}::{prefix}{name}"] = count
                pending.append((child, inner))
    return found


def test_no_function_passes_the_line_limit_but_the_listed_ones_and_the_list_only_shrinks():
    long = long_functions(sorted(_sources().values()), ROOT)
    fix = "split each into helpers so that it reads as a table of contents"
    assert_within_allowance(
        long, OVER_MAX_FUNCTION_LINES, "OVER_MAX_FUNCTION_LINES", "functions", MAX_FUNCTION_LINES, fix
    )


def test_the_function_length_check_catches_what_it_forbids(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "mod.py").write_text(
        f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}\n"
        f"    def fits(self):\n{body[: body.rindex('        x')]}"
    )
    assert long_functions([tmp_path / "mod.py"], tmp_path) == {"mod.py::C.long": MAX_FUNCTION_LINES + 1}


def test_the_placement_checks_catch_what_they_forbid(tmp_path):
    plugin, core = tmp_path / "plug", tmp_path / "core"
    plugin.mkdir()
    core.mkdir()
    (plugin / "cmd.py").write_text(
        "import pacer_bench.timing\nclass C:\n    from pacer_bench import replay\n"
        "def run():\n    from pacer_bench.prompts import PROMPT_SETS\n"
        "f = lambda: __import__('pacer_bench')\n"
    )
    sources = {"plug.cmd": plugin / "cmd.py"}
    assert import_time_problems(sources, {"plug"}) == [
        "plug.cmd imports pacer_bench.timing at import time (line 1)",
        "plug.cmd imports pacer_bench.replay at import time (line 3)",
    ]
    assert import_time_problems(sources, set()) == []  # not a plugin: the bench itself, say
    (core / "train.py").write_text(
        "import torch\nfrom torch.optim import AdamW\nimport torch.optim as optim\n"
        "def step(model, loss):\n    loss.backward()\n"
        "    torch.optim.SGD(model.parameters())\n"
        "    model.zero_grad()\n    torch.autograd.grad(loss, [])\n"
    )
    assert sorted(training_code(core / "train.py")) == sorted(
        [
            "line 2: imports torch.optim.AdamW",
            "line 3: imports torch.optim",
            "line 5: calls .backward()",
            "line 6: uses torch.optim",
            "line 7: calls .zero_grad()",
            "line 8: uses torch.autograd",
        ]
    )
    (core / "infer.py").write_text("import torch\n@torch.inference_mode()\ndef f(x):\n    return x.softmax(-1)\n")
    assert training_code(core / "infer.py") == []
    tree = tmp_path / "tree"
    for folder in ("pkg", "tests", ".hidden"):
        (tree / folder).mkdir(parents=True)
    (tree / "pkg" / "long.py").write_text("x = 1\n" * 7)
    (tree / "pkg" / "short.py").write_text("x = 1\n" * 6)
    (tree / "tests" / "test_long.py").write_text("x = 1\n" * 9)  # tests/ are not held to it
    (tree / ".hidden" / "long.py").write_text("x = 1\n" * 9)
    assert long_modules(tree, limit=6) == {"pkg/long.py": 7}
    assert long_modules(tree, limit=7) == {}


# -- the tests' own layout ---------------------------------------------------------------------------
def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _changes_sys_path(node: ast.AST) -> bool:
    """``sys.path.insert(...)`` (append, extend, ...), ``sys.path = ...``, ``sys.path[:] = ...``,
    ``sys.path += ...``."""
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
        problems += [
            f"{where}:{line} imports the test module {name}"
            for name, line in _imports(path.stem, path)
            if set(name.split(".")) & (test_modules - {path.stem})
        ]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _changes_sys_path(node):
                problems.append(f"{where}:{node.lineno} changes sys.path")
            if (
                path.name != THREADS_HELPER
                and isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "set_num_threads"
            ):
                problems.append(f"{where}:{node.lineno} sets torch's thread count")
    return problems


test_folder_problems.__test__ = False  # a helper of the tests below, not a test


def test_test_modules_share_code_through_helpers_and_conftest_only():
    problems = test_folder_problems(TESTS)
    assert not problems, (
        "tests/: " + "; ".join(problems) + " (shared builders go in tests/helpers.py, shared "
        "fixtures in tests/conftest.py; thread counts through helpers.torch_threads or "
        "conftest's real_model_threads fixture)"
    )


def test_the_test_folder_check_catches_what_it_forbids(tmp_path):
    (tmp_path / "conftest.py").write_text("from helpers import pin_threads\n")
    (tmp_path / "helpers.py").write_text("import torch\ntorch.set_num_threads(1)\n")
    (tmp_path / "test_a.py").write_text(
        "import sys\nsys.path.insert(0, 'x')\nfrom test_b import f\nimport helpers, strategies\nprint(sys.path)\n"
    )
    (tmp_path / "test_b.py").write_text(
        "import sys\ndef f():\n    from . import test_a\n    import tests.conftest\n"
        "    sys.path[:] = []\n    torch.set_num_threads(2)\n"
    )
    assert sorted(test_folder_problems(tmp_path)) == [
        "test_a.py:2 changes sys.path",
        "test_a.py:3 imports the test module test_b.f",
        "test_b.py:3 imports the test module .test_a",
        "test_b.py:4 imports the test module tests.conftest",
        "test_b.py:5 changes sys.path",
        "test_b.py:6 sets torch's thread count",
    ]


def test_the_training_package_imports_no_plugin(graph):
    """pacer_train serves the plugins' trainers (``pacer distill``, ``pacer train-preverify``): what they
    share lives there (corpus-making, the run folder, the distillation loop, the token-level student),
    so it never reaches back into a plugin."""
    modules, lines = graph
    plugins = {name for name, folder in _packages().items() if folder.parent == PLUGINS}
    bad = [
        f"{m} imports {t} (line {lines[m, t]})"
        for m, targets in sorted(modules.items())
        if _top(m) == "pacer_train"
        for t in sorted(targets)
        if _top(t) in plugins
    ]
    assert not bad, "pacer_train must import only pacer_core and libraries: " + "; ".join(bad)
    assert any(_top(m) == "pacer_train" for m in modules), "the scan should see pacer_train"


def cross_plugin_imports(
    modules: dict[str, set[str]], lines: dict[tuple[str, str], int], plugins: set[str]
) -> list[str]:
    """Imports of one plugin package by another (``import_graph``'s edges, functions' bodies included)."""
    return [
        f"{m} imports {t} (line {lines[m, t]})"
        for m, targets in sorted(modules.items())
        if _top(m) in plugins
        for t in sorted(targets)
        if _top(t) in plugins and _top(t) != _top(m)
    ]


def test_no_plugin_imports_another_plugin(graph):
    """Plugins are found and combined through the plugin manager, never by importing one another: a
    plugin depends on the engine (pacer_core) and the training package (pacer_train), where anything
    two plugins share lives (the corpus code, the run folder, the students, the shipped drafts' folders)."""
    modules, lines = graph
    plugins = {name for name, folder in _packages().items() if folder.parent == PLUGINS}
    bad = cross_plugin_imports(modules, lines, plugins)
    assert not bad, "a plugin imports another plugin; move what they share to pacer_train or pacer_core: " + "; ".join(
        bad
    )
    assert len(plugins) >= 2, "the scan should see the plugin packages"
    made_up = {"a.cmd": {"b.store", "a.util", "pacer_train.corpus"}, "b.store": {"numpy"}}
    assert cross_plugin_imports(made_up, {("a.cmd", "b.store"): 7}, {"a", "b"}) == ["a.cmd imports b.store (line 7)"]


def test_every_package_is_installed():
    """pyproject.toml lists the packages (the plugins' folder is mapped to ``pacer_plugins``): every
    folder with an ``__init__.py`` is listed, under its installed name, and nothing else."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"] == {PLUGIN_PACKAGE: "plugins"}
    folders = {
        init.parent.relative_to(ROOT)
        for root in (CORE, *HARNESS, "plugins")
        for init in (ROOT / root).rglob("__init__.py")
    }
    names = {".".join((PLUGIN_PACKAGE, *f.parts[1:]) if f.parts[0] == "plugins" else f.parts) for f in folders}
    assert sorted(setup["packages"]) == sorted(names)


# -- dependencies declared, not hidden ----------------------------------------------------------------
def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(sources: dict[str, Path], packages: set[str]) -> list[str]:
    """Imports of another package's private names: a dotted part after the package's own name that
    starts with an underscore (``from pacer_plugins.x.students import _shape``, ``import pacer_core._y``).
    What two packages share is public in its owner (or lives in pacer_core / pacer_train)."""
    problems = []
    for module, path in sorted(sources.items()):
        for name, line in sorted(_imports(module, path), key=lambda x: x[1]):
            owner = _top(name)
            if owner in packages and owner != _top(module) and any(_private(p) for p in name.split(".")):
                problems.append(f"{module} imports the private {name} (line {line})")
    return problems


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, *FUNCTIONS[:2])) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def _string_parts(tree: ast.AST) -> list[tuple[str, int]]:
    """(text, line) of every string the code uses (docstrings left out); an f-string is one text with its
    fields written as ``{expression}`` (``f"{PLUGINS}.x"`` reads ``{PLUGINS}.x``)."""
    skip, parts = _docstrings(tree), []
    inside_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in node.values
            )
            parts.append((text, node.lineno))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and id(node) not in inside_fstrings
        ):
            parts.append((node.value, node.lineno))
    return parts


def _folder_patterns(packages: set[str]) -> dict[str, "re.Pattern[str]"]:
    """Package → a pattern of a string path into its folder: ``plugins/x...`` or ``pacer_plugins.x`` (also
    as ``{PLUGINS}.x``) for a plugin, ``pacer_train/...`` for a top-level package. A path ending in ``.py``
    cites a source file (a message pointing at the code), it reaches no data."""
    patterns = {}
    for package in packages:
        if package.startswith(PLUGIN_PACKAGE + "."):
            folder = re.escape(package.split(".", 1)[1])
            path = rf"plugins/{folder}\b[\w/.-]*|(?:{PLUGIN_PACKAGE}|\{{PLUGINS\}})\.{folder}\b[\w.]*"
        else:
            path = rf"{re.escape(package)}/[\w/.-]*"
        patterns[package] = re.compile(rf"(?<![\w./])(?:{path})(?<!\.py)(?![\w.])")
    return patterns


def string_paths(sources: dict[str, Path], packages: set[str]) -> list[str]:
    """Paths into another package's folder hidden in strings: a string naming a place inside it
    (``plugins/eagle/corpus``, ``(f"{PLUGINS}.pacer_builtins", "default")``) or a path taken from
    one of its modules' ``__file__``. Its data is reached through what it declares instead (a shipped
    folder's name, ``pacer_core.registry.shipped_folder``; a public constant or function)."""
    patterns, problems = _folder_patterns(packages), []
    for module, path in sorted(sources.items()):
        own, tree = _top(module), ast.parse(path.read_text(), str(path))
        for text, line in _string_parts(tree):
            problems += [
                f"{module} names a path into {package} in a string (line {line}): {text!r}"
                for package, pattern in sorted(patterns.items())
                if package != own and pattern.search(text)
            ]
        aliases = {}  # a name an import binds → the module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                aliases.update({(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                aliases.update(
                    {
                        (a.asname or a.name.split(".")[0]): a.asname and a.name or a.name.split(".")[0]
                        for a in node.names
                    }
                )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "__file__"
                and isinstance(node.value, ast.Name)
                and _top(aliases.get(node.value.id, own)) in packages - {own}
            ):
                problems.append(f"{module} reads the folder of {aliases[node.value.id]} (line {node.lineno})")
    return problems


def test_no_module_imports_another_packages_private_names():
    packages = set(_packages())
    problems = private_imports(_sources(), packages)
    assert not problems, "make what another package uses public in its owner: " + "; ".join(problems)


def test_no_string_path_into_another_packages_folder():
    packages = set(_packages())
    problems = string_paths(_sources(), packages)
    assert not problems, (
        "reach another package's data through what it declares (a shipped folder's name, "
        "docs/assets.md#shipped-data; a public constant): " + "; ".join(problems)
    )


def test_the_dependency_rules_catch_what_they_forbid(tmp_path):
    """Both rules on deliberately bad modules, and on good ones that pass."""
    plugin, core = tmp_path / "plug", tmp_path / "core"
    plugin.mkdir()
    core.mkdir()
    (plugin / "bad.py").write_text(
        '"""Docs may name plugins/other/default."""\n'
        "from pacer_plugins.other.students import _shape, public\n"
        "import pacer_core._hidden\n"
        "from pacer_plugins.other import model as other_model\n"
        "from pacer_core.paths import PLUGINS, package_folder\n"
        "DRAFT = (f'{PLUGINS}.other', 'default')\n"
        "CORPUS = 'plugins/other/corpus'\n"
        "MODULE = 'pacer_plugins.other.shipped'\n"
        "CHECKPOINT = Path(other_model.__file__).with_name('default')\n"
        "TRAIN = 'pacer_train/corpus/words'\n"
    )
    (plugin / "good.py").write_text(
        "from pacer_plugins.plug import _own\n"  # its own package's private name
        "from pacer_core.registry import shipped_folder\n"
        "from . import bad\n"
        "CORPUS = shipped_folder('selfdistill_corpus')\n"
        "HERE = Path(__file__).parent / 'default'\n"
        "CONFIG = 'configs/hybrid.yaml'\n"
        "NAME = 'strategy.drafter.other'\n"
        "def f():\n    '''Never plugins/other/default.'''\n    return bad.__file__\n"
    )
    sources = {"pacer_plugins.plug.bad": plugin / "bad.py", "pacer_plugins.plug.good": plugin / "good.py"}
    packages = {"pacer_plugins.plug", "pacer_plugins.other", "pacer_core", "pacer_train"}
    assert private_imports(sources, packages) == [
        "pacer_plugins.plug.bad imports the private pacer_plugins.other.students._shape (line 2)",
        "pacer_plugins.plug.bad imports the private pacer_core._hidden (line 3)",
    ]
    assert sorted(string_paths(sources, packages)) == sorted(
        [
            "pacer_plugins.plug.bad names a path into pacer_plugins.other in a string (line 6): '{PLUGINS}.other'",
            "pacer_plugins.plug.bad names a path into pacer_plugins.other in a string (line 7): 'plugins/other/corpus'",
            "pacer_plugins.plug.bad names a path into pacer_plugins.other in a string (line 8): "
            "'pacer_plugins.other.shipped'",
            "pacer_plugins.plug.bad reads the folder of pacer_plugins.other.model (line 9)",
            "pacer_plugins.plug.bad names a path into pacer_train in a string (line 10): 'pacer_train/corpus/words'",
        ]
    )

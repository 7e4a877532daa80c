"""The stream's material from the standard library (``pacer_train.corpus.stream``): the functions of
top-level modules (read with ``ast``, never imported), ``pydoc_data.topics`` and module docstrings.
It depends on the Python version: ``Material.digest`` names it."""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import re
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Optional

import attrs

STREAM_VERSION = 1  # the stream's version: a part of the material's digest and of a corpus' header


@attrs.frozen
class Function:
    module: str
    name: str
    params: tuple[str, ...]
    locals: tuple[str, ...]
    code: str
    doc: str  # the docstring's first paragraph, one line ('' when none)


SKIP_MODULES = {
    "this",
    "antigravity",
    "__future__",
    "__hello__",
    "__phello__",
    "_pydecimal",
    "_pyio",
    "pydoc",
    "typing",
}  # typing: mostly overloads; the two big _py* twins duplicate C modules


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _clean_doc(doc: Optional[str]) -> str:
    if not doc:
        return ""
    first = re.split(r"\n\s*\n", inspect.cleandoc(doc))[0]
    return " ".join(first.split())


def _functions_of(module: str, source: str, tree: ast.Module) -> list[Function]:
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        length = node.end_lineno - node.lineno + 1
        if not 4 <= length <= 30:
            continue
        code = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno])).rstrip()
        if len(code) > 1200 or "\t" in code or not code.isascii() or not code.startswith("def "):
            continue
        params = tuple(
            a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs if a.arg not in ("self", "cls")
        )
        assigned = sorted(
            {t.id for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
            - set(params)
        )
        out.append(Function(module, node.name, params, tuple(assigned), code, _clean_doc(ast.get_docstring(node))))
    return out


def _docs_of(tree: ast.Module) -> list[str]:
    """The module docstring and the long (≥ 400 characters) class and function docstrings."""
    docs = [(ast.get_docstring(tree) or "").strip()]
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            doc = (ast.get_docstring(node) or "").strip()
            if len(doc) >= 400:
                docs.append(doc)
    return [d for d in docs if d and d.isascii()]


def _chunks(text: str, low: int = 700, high: int = 2400) -> list[str]:
    """Paragraph-aligned pieces of ``text`` between ``low`` and ``high`` characters."""
    pieces, current = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        if current and len(current) + len(para) + 2 > high:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        pieces.append(current)
    return [p for p in pieces if low <= len(p) <= high]


@attrs.frozen
class Material:
    functions: tuple[Function, ...]  # code editing: source 4–30 lines
    documented: tuple[Function, ...]  # code writing specs: functions with a one-line description
    texts: tuple[str, ...]  # summaries: documentation passages
    digest: str


def _digest(functions: list[Function], texts: list[str]) -> str:
    payload = json.dumps([[attrs.astuple(f) for f in functions], texts, STREAM_VERSION])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _documented(functions: list[Function]) -> list[Function]:
    return [
        f
        for f in functions
        if 25 <= len(f.doc) <= 240 and len(f.doc.split()) >= 5 and not f.name.startswith("_") and '"' not in f.doc
    ]


@functools.lru_cache(maxsize=None)
def material() -> Material:
    """The standard-library material of this Python: parsed once (a few seconds) and kept in the
    model cache folder, keyed by the Python version and the source files' sizes and times."""
    import pydoc_data.topics

    from pacer_core.hf import cache_root

    files = [
        f for f in sorted(_stdlib_root().glob("*.py")) if f.stem not in SKIP_MODULES and not f.stem.startswith("test")
    ]
    stamp = [sys.version, STREAM_VERSION, pydoc_data.topics.__file__] + [
        (f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files + [Path(pydoc_data.topics.__file__)]
    ]
    key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]
    cached = cache_root() / "corpus-material" / f"{key}.json"
    if cached.exists():
        try:
            data = json.loads(cached.read_text())
            functions = [Function(m, n, tuple(p), tuple(loc), c, d) for m, n, p, loc, c, d in data["functions"]]
            if _digest(functions, data["texts"]) == data["digest"]:
                return Material(tuple(functions), tuple(_documented(functions)), tuple(data["texts"]), data["digest"])
        except (ValueError, KeyError, TypeError):
            pass
    found = _build_material(files)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(cached.name + f".{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps(
                {
                    "functions": [attrs.astuple(f) for f in found.functions],
                    "texts": list(found.texts),
                    "digest": found.digest,
                }
            )
        )
        os.replace(tmp, cached)
    except OSError:
        pass
    return found


def _build_material(files: list[Path]) -> Material:
    from pydoc_data.topics import topics

    functions: list[Function] = []
    texts: list[str] = []
    for file in files:
        source = file.read_text(encoding="utf-8", errors="ignore")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        functions += _functions_of(file.stem, source, tree)
        for doc in _docs_of(tree):
            texts += _chunks(doc, low=400)
    for name in sorted(topics):
        text = re.sub(r"\n{3,}", "\n\n", topics[name]).strip()
        if 1500 <= len(text) <= 6000:  # whole topics of this size are the summarization benchmark's prompts
            continue
        texts += _chunks(text, low=500)
    seen: set[str] = set()
    texts = [t for t in texts if not (t in seen or seen.add(t))]
    return Material(tuple(functions), tuple(_documented(functions)), tuple(texts), _digest(functions, texts))

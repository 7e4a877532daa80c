"""Reading the files a user names, by one rule, each refusal one ``InputError`` line (or the
``error`` class the caller gives) naming the file and the fix:

- **a regular file only**: opened without blocking and checked on the open handle, so a folder, a
  FIFO (which would wait for a writer forever), a socket or a device such as ``/dev/zero`` (which
  never ends) is refused at once; ``read_bytes(..., pipes=True)`` also reads pipes and devices, for
  the one input meant to come from a pipe (``--prompt-file <(...)``), still bounded;
- **a bounded read**: at most ``limit`` bytes (``MAX_FILE_BYTES`` unless the reader says otherwise),
  refused past it without reading further; lines (``read_lines``, gzip files too) at most
  ``MAX_LINE_BYTES`` each and ``limit`` bytes in all, decompressed;
- **bounded nesting**: JSON and YAML data at most ``MAX_DEPTH`` lists or objects deep (``check_depth``;
  ``parse_json`` applies it, and ``pacer_core.schema`` for YAML), refused instead of a
  ``RecursionError`` traceback from the parser or from whatever walks the data next.

``read_json`` reads the JSON files of model, draft, checkpoint and corpus folders that way;
``require_keys`` checks their fields.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

from .errors import InputError

MAX_FILE_BYTES = 64 << 20  # configs, profiles, calibrations, folders' JSON: real ones are under 1 MiB
MAX_DATA_BYTES = 1 << 30  # what runs accumulate (answer logs, phrase pools) and corpora: real ones are MBs
MAX_LINE_BYTES = 4 << 20  # one line of a .jsonl file: over a million tokens, more than any context
MAX_DEPTH = 64  # lists or objects inside one another; real files nest fewer than 10

_KINDS: dict[type, str] = {dict: "a JSON object", list: "a JSON list"}
_NOT_REGULAR = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def size_text(size: int) -> str:
    """``size`` bytes in words: 4 MiB, 64 MiB, 1 GiB, 512 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g} {unit}"
    return f"{size} bytes"


def open_regular(
    path: Path | str, what: str, fix: str, error: type[Exception] = InputError, pipes: bool = False
) -> BinaryIO:
    """``path`` open for binary reading, once it is known to be a regular file (with ``pipes``, a
    pipe or a device too). Opening never blocks: a FIFO without a writer is refused, not waited on."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(Path(path), flags)
    except FileNotFoundError:
        raise error(f"{what} '{path}' does not exist: {fix}") from None
    except IsADirectoryError:
        raise error(f"{what} '{path}' is a folder, not a file: {fix}") from None
    except OSError as exc:
        raise error(f"{what} '{path}' cannot be read ({exc.strerror or type(exc).__name__}): {fix}") from None
    try:
        mode = os.fstat(fd).st_mode
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), None)
        if kind == "a folder":
            raise error(f"{what} '{path}' is a folder, not a file: {fix}")
        if kind is not None and not (pipes and kind in ("a pipe (FIFO)", "a device")):
            raise error(f"{what} '{path}' is {kind}, not a regular file: {fix}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(
    path: Path | str,
    what: str,
    fix: str,
    limit: int = MAX_FILE_BYTES,
    error: type[Exception] = InputError,
    pipes: bool = False,
) -> bytes:
    """The bytes of the regular file ``path`` (``open_regular``), refused when there are more than ``limit``."""
    with open_regular(path, what, fix, error, pipes) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise error(f"{what} '{path}' cannot be read ({exc.strerror or type(exc).__name__}): {fix}") from None
    if len(data) > limit:
        raise error(f"{what} '{path}' is larger than {size_text(limit)}, more than such a file holds: {fix}")
    return data


def read_lines(
    path: Path | str,
    what: str,
    fix: str,
    limit: int = MAX_DATA_BYTES,
    max_line: int = MAX_LINE_BYTES,
    error: type[Exception] = InputError,
) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes without the line end) of each line of the regular file ``path``,
    decompressed when its name ends in ``.gz``: a line longer than ``max_line`` bytes, or more than
    ``limit`` bytes in all, is refused before it is read whole (a small .gz can hold gigabytes)."""
    with open_regular(path, what, fix, error) as raw:
        handle = gzip.GzipFile(fileobj=raw, mode="rb") if str(path).endswith(".gz") else raw
        total = 0
        try:
            for number in itertools.count(1):
                line = handle.readline(max_line + 2)  # room for "\r\n"
                if not line:
                    return
                total += len(line)
                body = line.rstrip(b"\r\n") if line.endswith(b"\n") else line
                if len(body) > max_line:
                    raise error(f"{what} '{path}' line {number} is longer than {size_text(max_line)}: {fix}")
                if total > limit:
                    raise error(
                        f"{what} '{path}' holds more than {size_text(limit)}"
                        f"{' once decompressed' if handle is not raw else ''}: {fix}"
                    )
                yield number, body
        except (OSError, EOFError, zlib.error) as exc:  # a damaged .gz
            raise error(f"{what} '{path}' cannot be read ({getattr(exc, 'strerror', None) or exc}): {fix}") from None


DEEP = f"nested more than {MAX_DEPTH} lists or objects deep, deeper than such data goes"


class TooDeep(ValueError):
    """JSON nested deeper than ``MAX_DEPTH`` (its message: ``DEEP``)."""

    def __init__(self):
        super().__init__(DEEP)


def too_deep(where: str, fix: str) -> str:
    """The refusal of data nested deeper than ``MAX_DEPTH`` (``where``: the file, or its line)."""
    return f"{where} is {DEEP}: {fix}"


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How many lists, tuples or dicts deep ``value`` goes (0 for a scalar), counted without recursion
    and stopping once past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def check_depth(value: Any, where: str, fix: str, error: type[Exception] = InputError) -> Any:
    """``value`` unless it is nested deeper than ``MAX_DEPTH``."""
    if nesting_depth(value) > MAX_DEPTH:
        raise error(too_deep(where, fix))
    return value


def loads(data: bytes | str) -> Any:
    """``json.loads(data)`` under the nesting rule: ``TooDeep`` (a ``ValueError``) for data nested
    deeper than ``MAX_DEPTH``, whether the parser's recursion gives out or not; the parser's own
    ``ValueError`` (``JSONDecodeError``, ``UnicodeDecodeError``) for anything else that is not JSON."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise TooDeep() from None
    if nesting_depth(value) > MAX_DEPTH:
        raise TooDeep()
    return value


def parse_json(data: bytes | str, where: str, fix: str, error: type[Exception] = InputError) -> Any:
    """``data`` read as JSON (``loads``); anything else is one ``error`` line (``where``: the file, or
    the file and line, e.g. "answer log 'x' line 3")."""
    try:
        return loads(data)
    except TooDeep:
        raise error(too_deep(where, fix)) from None
    except UnicodeDecodeError as exc:
        raise error(
            f"{where} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): {fix}"
        ) from None
    except ValueError as exc:  # JSONDecodeError
        detail = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise error(f"{where} is not valid JSON ({detail}): {fix}") from None


def read_json(path: Path | str, what: str, fix: str, expect: Optional[type] = dict, limit: int = MAX_FILE_BYTES) -> Any:
    """The value of the JSON file ``path`` (a ``what``, e.g. "draft config"), read as every user-named
    file is (``read_bytes``, ``parse_json``). A file that is missing, unreadable, not a regular file,
    too large, not JSON, too deeply nested or (with ``expect``) not of that type is an ``InputError``
    naming it and ``fix`` (what the user should do)."""
    data = read_bytes(path, what, fix, limit)
    value = parse_json(data, f"{what} '{path}'", f"the file is damaged; {fix}")
    if expect is not None and not isinstance(value, expect):
        raise InputError(
            f"{what} '{path}' holds a {type(value).__name__}, not {_KINDS.get(expect, expect.__name__)}: "
            f"the file is damaged; {fix}"
        )
    return value


def require_keys(data: dict, path: Path | str, what: str, fix: str, **types: type | tuple) -> None:
    """Refuse ``data`` (read from ``path``) unless each named key holds a value of its type."""
    for key, kind in types.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool) and kind in (int, float):
            names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            found = "is missing" if key not in data else f"is {type(data[key]).__name__} {data[key]!r:.40}"
            raise InputError(f"{what} '{path}': '{key}' {found}, expected {names}: the file is damaged; {fix}")

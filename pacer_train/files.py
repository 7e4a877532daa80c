"""The files of a run folder: where it may be, writing them atomically, reading them safely.

- ``check_out_dir`` (from the command API, pacer_core/commands.py, shared with the bench) refuses,
  in one line and before any model is loaded, an ``out`` folder that is an existing file
  (``/dev/null`` included), lies under a file, or cannot be written; it creates the folder.
  ``check_out_dir(..., create=False)`` checks a folder that is written later (an export).
- ``atomic_write_bytes``/``atomic_write_text``/``atomic_save`` write to a temporary file in the same
  folder and rename it over the destination: a crash mid-write leaves the previous file intact.
- ``load_run_file`` reads a ``.pt`` file with ``torch.load(weights_only=True)``: tensors, numbers,
  strings, lists, tuples and dicts only, so a crafted file runs no code; a damaged, truncated or
  foreign file is refused in one line naming it and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from pacer_core.atomic import atomic_write
from pacer_core.commands import check_out_dir
from pacer_core.errors import InputError
from pacer_core.jsonfile import loads, read_bytes

__all__ = [
    "atomic_save",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_out_dir",
    "load_run_file",
    "read_json",
]


def _atomic(path: Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(file object)`` into a temporary file beside ``path``, then rename it."""
    atomic_write(path, write)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, value: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(value, indent=indent))


def atomic_save(path: Path, obj: Any) -> None:
    """``torch.save(obj)`` atomically. Save only what ``load_run_file`` reads back: tensors, numbers,
    strings, None, and lists/tuples/dicts of them (model and optimizer state dicts qualify)."""
    import torch

    _atomic(path, lambda f: torch.save(obj, f))


def load_run_file(path: Path, what: str = "file") -> Any:
    """A ``.pt`` file this project wrote, loaded with ``weights_only=True``; ``InputError`` in one line
    when it cannot be read (truncated, damaged, or holding anything but plain data)."""
    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises several kinds (UnpicklingError, RuntimeError, EOFError, ...)
        raise InputError(
            f"the {what} '{path}' cannot be read safely ({type(exc).__name__}): it is truncated, "
            "damaged, or holds more than plain tensors and numbers (this project never writes "
            "such a file); delete it and run the same command again to redo that part"
        ) from None


def read_json(path: Path, what: str = "file") -> Any:
    """A JSON file of a run folder or a model folder, read as every user-named file is (a regular
    file, bounded, nested at most ``MAX_DEPTH`` deep); ``InputError`` in one line when it is not JSON."""
    data = read_bytes(Path(path), f"the {what}", "fix or delete it")
    try:
        return loads(data.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, or nested too deep
        raise InputError(
            f"the {what} '{path}' cannot be read ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}): fix or delete it"
        ) from None

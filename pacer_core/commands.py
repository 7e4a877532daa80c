"""The command API: how a package adds a ``pacer`` subcommand.

A command is a function decorated with ``@command(name, help)``: it receives its argparse subparser
to declare its arguments and returns the function that runs it (``run(args) -> int``, the exit
code). The module holding it is registered under the ``pacer_sd.commands`` entry-point group, e.g.
in pyproject.toml::

    [project.entry-points."pacer_sd.commands"]
    my-command = "my_package.my_module"

``pacer`` imports every module of that group before it parses the command line (pacer_core/cli.py).
User errors raised as ``PacerError`` print as one line, ``pacer: error: <message>``, exit code 2.

``check_out_dir`` is for any command writing a results folder (the bench's ``--out``, a trainer's
``out=``): it refuses, in one line and before any model is loaded, a folder that is an existing file
(``/dev/null`` included), lies under a file, or cannot be written, and creates it. ``check_out_file``
does the same for a file a command writes after measuring, before it measures.

Every numeric option has a range: ``bounded_int(low, high)`` and ``bounded_float(low, high)`` are the
argparse types that refuse a value outside it (or not a number) as a usage error in one line, before
the command runs, and say the range in the message.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from .errors import InputError

COMMAND_GROUP = "pacer_sd.commands"  # entry-point group: modules registering commands on import
EXIT_USAGE = 2  # a user error (bad arguments, config, input)
EXIT_INTERRUPTED = 130  # Ctrl-C; whatever was finished is kept

Runner = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Runner]]] = {}


def command(name: str, help: str):
    """Register a subcommand: ``setup(parser)`` adds its arguments and returns ``run(args) -> int``."""

    def register(setup: Callable[[argparse.ArgumentParser], Runner]):
        COMMANDS[name] = (help, setup)
        return setup

    return register


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``, else a usage error naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    parse.__name__ = f"whole number from {low} to {high}"
    return parse


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number from ``low`` to ``high``, else a usage error naming the range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number from {low:g} to {high:g}, not {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}, not {text}")
        return value

    parse.__name__ = f"number from {low:g} to {high:g}"
    return parse


def check_out_file(path: str | os.PathLike, option: str) -> Path:
    """A file a command writes after measuring, checked before it measures: not a folder (or a device),
    in a folder that can be written (``InputError`` in one line naming ``option``)."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise InputError(f"{option} '{file}' is a folder: give the path of a file to write")
    if os.path.lexists(file) and _is_device(file):
        raise InputError(f"{option} '{file}' is a device: give the path of a file to write")
    check_out_dir(file.parent, option)
    return file


def check_out_dir(path: str | os.PathLike, option: str = "out", create: bool = True) -> Path:
    """``path`` as a usable output folder (created unless ``create=False``), or ``InputError``.

    ``option`` names the setting as the user gives it: a flag (``--out``) or a ``key=value`` key
    (``out``, shown as ``out=``). ``create=False`` checks a folder that is written later (an export).
    """
    folder = Path(path).expanduser()
    fix = f"give {option if option.startswith('-') else option + '='} a folder that can be written"
    if os.path.lexists(folder) and not folder.is_dir():
        kind = "a device" if _is_device(folder) else "a file"
        raise InputError(f"{option} '{folder}' is {kind}, not a folder: {fix}")
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{option} '{folder}' lies under '{existing}', which is not a folder: {fix}")
    if not create:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise InputError(f"{option} '{folder}' cannot be created: '{existing}' is not writable; {fix}")
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"{option} '{folder}' cannot be written ({reason}): {fix}") from None
    return folder


def _is_device(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)

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
(``/dev/null`` included), lies under a file, or cannot be written, and creates it.
"""

from __future__ import annotations

import argparse
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

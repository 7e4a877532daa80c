"""The command API: how a package adds a ``pacer`` subcommand.

A command is a function decorated with ``@command(name, help)``: it receives its argparse subparser
to declare its arguments and returns the function that runs it (``run(args) -> int``, the exit
code). The module holding it is registered under the ``pacer_sd.commands`` entry-point group, e.g.
in pyproject.toml::

    [project.entry-points."pacer_sd.commands"]
    my-command = "my_package.my_module"

``pacer`` imports every module of that group before it parses the command line (pacer_core/cli.py).
User errors raised as ``PacerError`` print as one line, ``pacer: error: <message>``, exit code 2.
"""

from __future__ import annotations

import argparse
from typing import Callable

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

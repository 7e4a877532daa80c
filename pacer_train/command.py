"""A training command's set-up: ``--config FILE`` and ``key=value`` overrides read into the
trainer's attrs schema (``pacer_core.schema.load_schema``), the command line recorded in manifests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from pacer_core.commands import Runner, command


def training_command(
    name: str, help: str, load: Callable[[Optional[str], list[str]], Any], run: Callable[[Any, str], Path]
) -> Callable[[argparse.ArgumentParser], Runner]:
    """Register ``pacer <name>``: ``load(config_path, overrides)`` validates the recipe (raising
    ``ConfigError`` in one line), ``run(cfg, command_line)`` does the work."""

    def setup(p: argparse.ArgumentParser) -> Runner:
        p.add_argument("--config", help=f"{name} YAML (default: built-in recipe)")
        p.add_argument("overrides", nargs="*", metavar="key=value")

        def runner(args: argparse.Namespace) -> int:
            cfg = load(args.config, args.overrides)
            run(cfg, f"pacer {name} " + " ".join(sys.argv[2:]))
            return 0

        return runner

    return command(name, help)(setup)

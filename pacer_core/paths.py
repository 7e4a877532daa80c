"""Where the project keeps what it makes once per machine (converted models, measured costs)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional


def cache_root() -> Path:
    """``$PACER_CACHE``, else ``~/.cache/pacer-sd``."""
    return Path(os.environ.get("PACER_CACHE", Path.home() / ".cache" / "pacer-sd"))


# the shipped plugins' package (the folder plugins/, see pyproject.toml's package-dir)
PLUGINS = "pacer_plugins"


def package_folder(package: str, folder: str) -> Optional[Path]:
    """``folder`` inside the installed package ``package`` (e.g. a plugin's shipped draft), found
    without importing the package (so the engine and the training package import no plugin); None
    when the package is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # its parent package is not installed
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve() / folder

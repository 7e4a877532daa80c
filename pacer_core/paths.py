"""Where the project keeps what it makes once per machine (converted models, measured costs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$PACER_CACHE``, else ``~/.cache/pacer-sd``."""
    return Path(os.environ.get("PACER_CACHE", Path.home() / ".cache" / "pacer-sd"))

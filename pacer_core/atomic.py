"""Files published whole: written under a temporary name of this write's own beside the target, then
renamed over it, so a reader (or another process writing the same file) never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Union


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Union[str, Path], write: Callable[[Any], None], shared: bool = False) -> Path:
    """Write through ``write(binary file object)`` into a temporary file beside ``path``, flush it to
    disk, then rename it over ``path``; on any error the temporary file is removed. ``shared``: the
    file gets the permissions ``open()`` would have given (``mkstemp`` makes it private, 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if shared:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path

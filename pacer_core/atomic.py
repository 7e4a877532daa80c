"""Files published whole: written under a temporary name of this write's own beside the target, then
renamed over it, so a reader (or another process writing the same file) never sees half a file.

An error names the file asked for, never the temporary one (``OSError.filename`` is ``path``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Union


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def share(path: Union[str, Path]) -> None:
    """Give ``path`` the permissions a plain ``open()`` would have given it (0666 less the umask:
    0644 usually), for files made private by their writer (``mkstemp``, safetensors' ``save_file``)
    that another user, such as a server, must read."""
    os.chmod(path, 0o666 & ~_umask())


def atomic_write(path: Union[str, Path], write: Callable[[Any], None], shared: bool = False) -> Path:
    """Write through ``write(binary file object)`` into a temporary file beside ``path``, flush it to
    disk, then rename it over ``path``; on any error the temporary file is removed. ``shared``: the
    file gets the permissions ``open()`` would have given (``mkstemp`` makes it private, 0600)."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if shared:
            share(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename == tmp:
            raise _naming(exc, path) from None
        raise
    return path


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` about ``path`` rather than the temporary file beside it (same errno and message)."""
    return type(exc)(exc.errno, exc.strerror, str(path))

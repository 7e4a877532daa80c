"""The C library's memory allocator for decoding: a step's large buffers reuse the last step's memory.

On Linux, glibc's ``malloc`` maps a fresh piece of memory for an allocation above its mmap threshold
and hands freed heap memory back to the system once more than its trim threshold lies free at the
top of the heap; both thresholds start small (128 KiB) and glibc's own raising of them did not keep
up with a decoding loop here. A step allocates and frees buffers of megabytes (torch's CPU tensors
come from ``malloc``): the target's logits over the tree (65 × 49152 float32, 12.8 MB, for a
64-node tree of the embedded target), the draft's rows of probabilities (2.3 MB for a 64-node eagle
tree), the forwards' activations. Mapped afresh, each is zero-filled a page at a time when first
written (inside the forward) and unmapped when freed (on the host): on the 2-core CPU of
docs/host-time.md, freeing one 64-node tree step's logits and draft took 0.6 ms of its host time,
and its forwards ran 20–25% longer than from reused memory.

``reuse_freed_memory`` sets both thresholds once per process, so that such buffers come from and go
back to the heap: allocations under ``MMAP_BELOW`` are served from the heap and up to ``KEEP_FREE``
bytes of freed memory stay there for the next step. The engine and the ``pacer`` command call it.
Anyone who tunes glibc's allocator through its environment (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``glibc.malloc`` tunables) keeps their settings; other C libraries
(macOS, Windows, musl) are left as they are. It changes no value computed, only where memory comes
from.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

MMAP_BELOW = 64 << 20  # served from the heap: the logits of a 128-row tree forward over a 128k vocabulary fit
KEEP_FREE = 256 << 20  # freed memory kept for reuse before any is handed back to the system
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def tuned_by_environment() -> bool:
    """Whether glibc's allocator is tuned through the environment (left as it is, then)."""
    return any(name in os.environ for name in _ENVIRONMENT) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")


@functools.lru_cache(maxsize=None)
def reuse_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep a decoding step's large buffers in its heap (see the module's
    doc); once per process. Returns whether the thresholds were set: False on other C libraries,
    or where the environment tunes them already."""
    if not sys.platform.startswith("linux") or tuned_by_environment():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # both, in this order: setting either turns off glibc's own raising of the other; a glibc older
    # than 2.35 refuses an mmap threshold above 32 MiB (its largest default one on 64-bit systems)
    if not any(mallopt(_M_MMAP_THRESHOLD, size) for size in (MMAP_BELOW, 32 << 20)):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREE))

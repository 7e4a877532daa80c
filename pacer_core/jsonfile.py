"""Reading the JSON files of model, draft, checkpoint and corpus folders, refusing a damaged one in one
line that names the file (``InputError``) instead of a ``JSONDecodeError`` or ``KeyError`` traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .errors import InputError

_KINDS = {dict: "a JSON object", list: "a JSON list"}


def read_json(path: Path | str, what: str, fix: str, expect: Optional[type] = dict) -> Any:
    """The value of the JSON file ``path`` (a ``what``, e.g. "draft config"). A file that is missing,
    unreadable, not JSON, or (with ``expect``) not of that type is an ``InputError`` naming it and
    ``fix`` (what the user should do)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise InputError(f"{what} '{path}' does not exist: {fix}") from None
    except OSError as exc:
        raise InputError(f"{what} '{path}' cannot be read ({exc.strerror or type(exc).__name__}): {fix}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting
        detail = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{what} '{path}' is not valid JSON ({detail}): the file is damaged; {fix}") from None
    if expect is not None and not isinstance(data, expect):
        raise InputError(f"{what} '{path}' holds a {type(data).__name__}, not {_KINDS.get(expect, expect.__name__)}: "
                         f"the file is damaged; {fix}")
    return data


def require_keys(data: dict, path: Path | str, what: str, fix: str, **types: type | tuple) -> None:
    """Refuse ``data`` (read from ``path``) unless each named key holds a value of its type."""
    for key, kind in types.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool) and kind in (int, float):
            names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            found = "is missing" if key not in data else f"is {type(data[key]).__name__} {data[key]!r:.40}"
            raise InputError(f"{what} '{path}': '{key}' {found}, expected {names}: the file is damaged; {fix}")

"""What a hook may return, checked in one place: the engine refuses a wrong return before using it,
``pacer check`` turns it into a failing row, and ``registry.components`` reads ``pacer_components``
through it. Each refusal is one ``PluginError`` line naming the plugin, the hook and the fix.

Worked example: a stop returning the class ``Stop`` (not ``Stop()``) from ``pacer_draft_more``:
``result_problem("pacer_draft_more", Stop, {"draft": d})`` is ``"returned the class Stop, not a
Stop: return Stop()"``; ``check_results(pm, "pacer_draft_more", [Stop], draft=d)`` raises
``PluginError("strategy.stop[0]:my_stop: pacer_draft_more returned the class Stop, ...")``.

``blame`` names the plugin an exception came from, by its traceback (the outermost frame that is a
hook implementation's code), for the callers that turn a plugin's exception into one line.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from .cost_profiles import CostModel
from .draft_values import DraftBlock
from .errors import PluginError
from .types import Component, Stop, Verdict

FIRST_RESULT = frozenset({"pacer_propose", "pacer_verify"})  # one implementation; its result, not a list


def whole(value: Any) -> Optional[int]:
    """``value`` as an int when it is an integer (Python, numpy or 0-d torch; not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _draft_more(value: Any, context: dict) -> Optional[str]:
    if value is Stop:
        return "returned the class Stop, not a Stop: return Stop() (or Stop(keep=m))"
    if isinstance(value, Stop):
        keep, length = value.keep, len(context["draft"]) if context.get("draft") is not None else None
        if keep is None:
            return None
        if whole(keep) is None:
            return f"returned Stop(keep={keep!r}): keep must be an int (or None: keep the whole draft)"
        if keep < 0 or (length is not None and keep > length):
            return (
                f"returned Stop(keep={keep}) for a draft of {length} tokens: it may keep at most what was "
                "drafted (0 to len(draft))"
            )
        return None
    n = whole(value)
    if n is None:
        return (
            f"returned {_shown(value)}: return a positive int (tokens to draft), Stop() to stop drafting, "
            "or None for no opinion"
        )
    if n < 1:
        return f"returned {n}: return a positive int (tokens to draft), Stop() to stop drafting, or None"
    return None


def _propose(value: Any, context: dict) -> Optional[str]:
    if not isinstance(value, DraftBlock):
        return f"returned {_shown(value)}: return a pacer_core.DraftBlock, or None when it has nothing to propose"
    tokens = value.tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.is_floating_point():
        return (
            f"returned a DraftBlock whose tokens are {_shown(tokens)}: give a 1-D integer tensor (torch.tensor([...]))"
        )
    return None


def _verify(value: Any, context: dict) -> Optional[str]:
    if not isinstance(value, Verdict):
        return f"returned {_shown(value)}: return a pacer_core.Verdict(accepted, next_token, next_kind)"
    accepted, token = whole(value.accepted), whole(value.next_token)
    draft = context.get("draft")
    size = None if draft is None else len(draft.tree)
    if accepted is None or accepted < 0 or (size is not None and accepted > size):
        return f"accepted {value.accepted!r} of {size} draft tokens: accepted must be an int from 0 to the draft's size"
    if token is None or token < 0:
        return f"returned next_token {value.next_token!r}: give a token id (an int >= 0)"
    return None


def _select_nodes(value: Any, context: dict) -> Optional[str]:
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        return f"returned {_shown(value)}: return an iterable of node indices, or None to send every node"
    draft = context.get("draft")
    size = None if draft is None else len(draft.tree)
    for node in list(value):
        index = whole(node)
        if index is None or index < 0 or (size is not None and index >= size):
            return (
                f"returned node {node!r} for a tree of {size} nodes: give indices of draft.tree "
                "(ints from 0 to its size - 1)"
            )
    return None


def _finish(value: Any, context: dict) -> Optional[str]:
    if not isinstance(value, dict):
        return f"returned {_shown(value)}: return a dict of metrics, or None"
    return None


def _step_costs(value: Any, context: dict) -> Optional[str]:
    if not isinstance(value, CostModel):
        return f"returned {_shown(value)}: return a pacer_core.cost_profiles.CostModel, or None"
    return None


def _components(value: Any, context: dict) -> Optional[str]:
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
        return f"returned {_shown(value)}: return a list of pacer_core.Component"
    for i, item in enumerate(value):
        if not isinstance(item, Component):
            return f"returned a list whose item {i} is {_shown(item)}: every item must be a pacer_core.Component"
    return None


def _shipped(value: Any, context: dict) -> Optional[str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (str, os.PathLike)) for k, v in value.items()
    ):
        return f"returned {_shown(value)}: return a dict of names to folders (str or Path), or None"
    return None


CHECKS = {
    "pacer_draft_more": _draft_more,
    "pacer_propose": _propose,
    "pacer_verify": _verify,
    "pacer_select_nodes": _select_nodes,
    "pacer_finish": _finish,
    "pacer_components": _components,
    "pacer_step_costs": _step_costs,
    "pacer_shipped": _shipped,
}


def result_problem(hook: str, value: Any, context: Optional[dict] = None) -> Optional[str]:
    """What is wrong with one implementation's ``value`` (not None) for ``hook``, or None when it is
    what hooks.md asks for. ``context``: the hook's keyword arguments (``draft`` bounds some values)."""
    check = CHECKS.get(hook)
    return None if check is None else check(value, context or {})


def implementers(pm: Any, hook: str) -> list[Any]:
    """The hook's implementations that return results (wrappers left out), in call order: pluggy
    calls the last registered first, and its result list follows that order, Nones dropped."""
    impls = getattr(pm.hook, hook).get_hookimpls()
    return [i for i in reversed(impls) if not (i.wrapper or i.hookwrapper)]


def suspects(impls: Sequence[Any], results: Sequence[Any], index: int) -> list[str]:
    """The names of the implementations that can have given ``results[index]``. pluggy drops None
    results, so with k fewer results than implementations, result i came from implementation i..i+k
    (exactly one when every implementation answered)."""
    missing = max(0, len(impls) - len(results))
    return [impl.plugin_name for impl in impls[index : index + missing + 1]] or ["?"]


def check_results(pm: Any, hook: str, results: Any, **context: Any) -> Any:
    """``results`` of ``pm.hook.<hook>(**context)`` (a first-result hook's value, or the list of the
    others), returned unchanged when each is what the hook asks for; else ``PluginError`` naming the
    plugin. Only a wrong result costs the look-up of who gave it."""
    if hook in FIRST_RESULT:
        values = [] if results is None else [results]
    elif isinstance(results, list):
        values = results
    else:  # pluggy gives a list; anything else is a caller's mistake, not a plugin's
        return results
    for i, value in enumerate(values):
        problem = result_problem(hook, value, context)
        if problem is not None:
            who = " or ".join(suspects(implementers(pm, hook), values, i))
            raise PluginError(f"{who}: {hook} {problem} (docs/hooks.md)")
    return results


def blame(exc: BaseException, impls: Iterable[Any]) -> Optional[Any]:
    """The implementation (of ``impls``) whose code raised ``exc``: the outermost frame of its
    traceback that is one of theirs (a composite's member raising is its composite's); None when
    the exception did not come from a hook implementation."""
    codes = {}
    for impl in impls:
        code = getattr(getattr(impl.function, "__func__", impl.function), "__code__", None)
        if code is not None:
            codes[code] = impl
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return codes[tb.tb_frame.f_code]
        tb = tb.tb_next
    return None


def origin(exc: BaseException) -> str:
    """Where ``exc`` was raised: ``file:line`` of its traceback's innermost frame ('' when none)."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


def describe(exc: BaseException) -> str:
    """One line for an exception a plugin raised: its type, first message line (``SystemExit(code)``)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r})"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__

"""The draft gate replayed over a recorded run (``pacer replay RUN --profile P --gate``;
docs/costs.md#skipping-drafting): what each stack would have run at, under the profile, had the
engine's gate (``pacer_core.skipping.DraftGate``, the same object and rule) decided its steps.

A recorded step that drafted emitted ``e`` tokens starting at some position of the text. Replayed,
the gate decides before each step: a skipped step is plain decoding (one token, ``plain_step``); a
drafted step starting where a recorded one did emits what it did; one starting ``o`` tokens into a
recorded step (after skipped steps) is taken to emit ``max(1, e − o)`` at that step's price (greedy
drafting from inside an accepted run accepts its rest; the draft's actual proposal there was never
recorded). The gate learns from the replayed steps at the replay's prices. It replays runs made with
the gate off: a stack recorded with it on (it skipped steps) is listed without figures. Pure: no
models, no clocks.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import attrs

from pacer_core.cost_profiles import CostModel, Profile
from pacer_core.errors import InputError
from pacer_core.skipping import DraftGate, SkipConfig, drafted

from ..answers import pair_key
from ..config import BASELINE
from .predictions import generation_seconds, step_seconds
from .recorded import RecordedRun, drafter_kind
from .steplog import Generation


def emitted_per_step(g: Generation) -> list[int]:
    """The tokens each recorded step emitted (``accept_lengths``; else accepted + 1 a step)."""
    logged = g.metrics.get("accept_lengths")
    if logged is not None and len(logged) == len(g.steps):
        return [int(e) for e in logged]
    return [s.accepted + 1 for s in g.steps]


def gated_seconds(g: Generation, profile: Profile, kind: Optional[str], config: SkipConfig) -> tuple[float, int, int]:
    """(seconds, steps, steps skipped) of one recorded generation (made with the gate off) replayed
    with the gate deciding its steps."""
    prices, emitted = step_seconds(g, profile, kind), emitted_per_step(g)
    starts = [0]
    for e in emitted[:-1]:
        starts.append(starts[-1] + e)
    total, plain = sum(emitted), profile.plain_step()
    # the gate learns at the replay's prices (``learn``): of the cost model it needs plain decoding's alone
    gate = DraftGate(CostModel([profile.verify(1)], plain_host_s=profile.host_plain), config)
    gate.drafts()  # the prefill: as recorded, teaching nothing
    seconds, position, i, steps = prices[0], emitted[0], 0, 1
    while position < total:
        steps += 1
        while i + 1 < len(starts) and starts[i + 1] <= position:
            i += 1
        if gate.drafts():
            tokens = min(max(1, emitted[i] - (position - starts[i])), total - position)
            seconds += prices[i]
            position += tokens
            if drafted(g.draft_forwards[i], g.steps[i].sent):  # as in the engine's gate
                gate.learn(tokens, prices[i])
        else:
            seconds += plain
            position += 1
    return seconds + int(g.metrics.get("pacer_checks", 0) or 0) * profile.preverify_s, steps, gate.skipped


def replay_gate(run: RecordedRun, profile: Profile, config: SkipConfig) -> dict[str, Any]:
    """Per stack (all prompt sets): the predicted speedup with the gate off and on, the slowest
    record's (a prompt and repeat) under each, and the share of steps the gate skipped."""
    reference = {pair_key(g.record): g for g in run.of(BASELINE)}
    if not reference:
        raise InputError(f"the run has no '{BASELINE}' records to compare with: bench plain decoding too")
    rows = {}
    for name, unit in run.units.items():
        mine = [g for g in run.of(name) if pair_key(g.record) in reference and g.has_steps]
        if name == BASELINE or not mine or unit.get("kind", "stack") != "stack":
            continue
        if any(g.metrics.get("skipped_steps") for g in mine):
            rows[name] = {"records": len(mine), "recorded_gated": True}
            continue
        kind = drafter_kind(unit)
        off, on, skipped, steps = [], [], 0, 0
        for g in mine:
            base = generation_seconds(reference[pair_key(g.record)], profile, None)
            gated, replayed, skips = gated_seconds(g, profile, kind, config)
            off.append(base / generation_seconds(g, profile, kind))
            on.append(base / gated)
            skipped, steps = skipped + skips, steps + replayed
        rows[name] = {
            "records": len(mine),
            "off": _geomean(off),
            "on": _geomean(on),
            "slowest_off": min(off),
            "slowest_on": min(on),
            "skipped_share": skipped / steps if steps else 0.0,
        }
    return {"profile": profile.name, "config": _described(config), "stacks": rows}


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _described(config: SkipConfig) -> str:
    return ", ".join(f"{key} {value}" for key, value in attrs.asdict(config).items() if key != "enabled")


def gate_markdown(result: dict) -> str:
    """The gate replay as a table (speedups per prompt, geometric mean over prompts and repeats)."""
    lines = [
        f"*the draft gate ({result['config']}) replayed under profile '{result['profile']}'; speedup: "
        "geometric mean over the stack's records of plain decoding's predicted seconds over the stack's*",
        "",
        "| stack | records | gate off | slowest | gate on | slowest | steps skipped |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in result["stacks"].items():
        if row.get("recorded_gated"):
            lines.append(f"| {name} | {row['records']} | recorded with the gate on: not replayed | | | | |")
            continue
        lines.append(
            f"| {name} | {row['records']} | {row['off']:.3f}× | {row['slowest_off']:.3f}× | {row['on']:.3f}× | "
            f"{row['slowest_on']:.3f}× | {row['skipped_share']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def gate_config(options: Sequence[str]) -> SkipConfig:
    """A ``SkipConfig`` from ``KEY=VALUE`` options (``--gate window=16 confidence=1``); a bad one is
    refused in one line."""
    values: dict[str, Any] = {}
    known = {"margin": float, "window": int, "confidence": float, "min_steps": int, "max_wait": int}
    for option in options:
        key, sep, text = option.partition("=")
        if not sep or key not in known:
            raise InputError(
                f"--gate option '{option}' is not KEY=VALUE with KEY one of {', '.join(known)} "
                "(e.g. --gate window=16 confidence=1)"
            )
        try:
            values[key] = known[key](text)
        except ValueError:
            raise InputError(f"--gate {key} needs a number, got '{text}'") from None
    try:
        return SkipConfig(enabled=True, **values)
    except ValueError as exc:
        raise InputError(f"--gate: {exc}") from None

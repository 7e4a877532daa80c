"""The draft gate replayed over a recorded run (``pacer replay RUN --profile P --gate``,
pacer_bench/replay/gate.py, docs/costs.md#skipping-drafting): worked numbers on hand-made step
logs, the table and its refusals through the command line."""

from __future__ import annotations

import json

import pytest
import yaml

from pacer_bench.replay.gate import gate_config, gated_seconds, replay_gate
from pacer_bench.replay.predictions import generation_seconds
from pacer_bench.replay.recorded import RecordedRun
from pacer_core.cost_profiles import profile_from_dict
from pacer_core.skipping import SkipConfig

from helpers import assert_one_line_error, run_cli

PROFILE = {
    "format": 1,
    "name": "fake",
    "kind": "measured",
    "device": "a fake clock",
    "verify_s": {1: 0.020, 2: 0.030, 8: 0.090},
    "draft_s": {"token": {1: 0.005}},
    "host_s": {"plain": 1e-12, "chain": 1e-12},
    "sources": {"verify_s": "test", "draft_s": "test", "host_s": "test"},
}
# a step drafting a chain of 3 (3 forwards) costs verify(1 + 3) + 3 · 0.005 = 0.050 + 0.015 = 0.065 s,
# 3.25 plain steps: one emitting a token gains 1 - 3.25 = -2.25, one emitting 4 gains +0.75
STEP_S = 0.065


def record(stack: str, question: str, emitted: list[int], **metrics) -> dict:
    """A bench record of a chain stack drafting 3 tokens a step (the prefill step: 1 token, nothing
    drafted), emitting ``emitted`` tokens a step after it."""
    from pacer_bench.answers import make_record

    metrics = {
        "drafted_per_step": [0] + [3] * len(emitted),
        "accepted_per_step": [0] + [e - 1 for e in emitted],
        "draft_forwards_per_step": [0] + [3] * len(emitted),
        "accept_lengths": [1, *emitted],
        "wall_s": 1.0,
        "steps": len(emitted) + 1,
        **metrics,
    }
    question = type("P", (), {"question_id": question, "category": None})()
    return make_record("set", question, stack, "stack", 0, [0], [0] * (1 + sum(emitted)), "", metrics, "length", None)


def unit(name: str, drafter: str = "draft_model") -> dict:
    return {"name": name, "kind": "stack", "cost_kind": "token" if drafter != "autoregressive" else None}


def recorded(losing_tokens: int = 9) -> RecordedRun:
    plain = record("autoregressive", "q", [1] * (losing_tokens + 10))
    plain["metrics"].update(
        drafted_per_step=[0] * (losing_tokens + 11), draft_forwards_per_step=[0] * (losing_tokens + 11)
    )
    records = [
        plain,
        record("losing", "q", [1] * losing_tokens),
        record("paying", "q", [4] * 5),
        record("gated", "q", [4] * 5, skipped_steps=2),
        record("lookup", "q", [1] * 9, draft_forwards_per_step=[0] * 10),  # no draft forward: no draft kind
    ]
    units = [unit("autoregressive", "autoregressive"), unit("losing"), unit("paying"), unit("gated")]
    units.append(unit("lookup", "autoregressive"))
    return RecordedRun.parse({"units": units, "prompt_sets": ["set"]}, records)


def test_a_losing_stack_is_replayed_with_the_gates_back_off_on_worked_numbers():
    profile = profile_from_dict(PROFILE)
    run = recorded()
    losing = run.of("losing")[0]
    seconds, steps, skipped = gated_seconds(losing, profile, "token", SkipConfig())
    # 9 tokens after the prefill: four drafted steps before a verdict (4 tokens), 1 skipped, a probe,
    # 2 skipped, a probe (9 tokens): 6 drafted steps, 3 plain ones
    prefill = PROFILE["verify_s"][1]
    assert (steps, skipped) == (1 + 6 + 3, 3)
    assert seconds == pytest.approx(prefill + 6 * STEP_S + 3 * 0.020)
    assert generation_seconds(losing, profile, "token") == pytest.approx(prefill + 9 * STEP_S)  # the gate off


def test_a_paying_stack_is_never_skipped_and_a_gated_record_is_not_replayed():
    profile = profile_from_dict(PROFILE)
    result = replay_gate(recorded(), profile, SkipConfig(enabled=True))
    paying = result["stacks"]["paying"]
    assert paying["on"] == pytest.approx(paying["off"]) and paying["skipped_share"] == 0.0
    losing = result["stacks"]["losing"]
    assert losing["off"] < 1.0 < 1.0 / losing["off"] and losing["on"] > losing["off"]
    assert losing["skipped_share"] == pytest.approx(3 / 10)
    assert result["stacks"]["gated"] == {"records": 1, "recorded_gated": True}
    # a drafter without draft forwards (a lookup), under a profile pricing no such drafter: a 3-token
    # chain verified for one emitted token still loses (verify(4) = 2.5 plain steps)
    lookup = result["stacks"]["lookup"]
    assert lookup["on"] > lookup["off"] and lookup["skipped_share"] > 0
    # steps that drafted nothing teach the replayed gate nothing, as they teach the engine's: asked to
    # be 1.5 times faster, a gate learning from them would skip
    idle = record("idle", "q", [1] * 9, drafted_per_step=[0] * 10, draft_forwards_per_step=[0] * 10)
    idle_run = RecordedRun.parse({"units": [unit("idle")]}, [idle])
    _, _, skipped = gated_seconds(idle_run.of("idle")[0], profile, "token", SkipConfig(margin=1.5))
    assert skipped == 0
    # a gate that never finds drafting losing replays as the gate off
    never = replay_gate(recorded(), profile, SkipConfig(enabled=True, min_steps=32))["stacks"]["losing"]
    assert never["on"] == pytest.approx(never["off"])


def test_pacer_replay_gate_prints_its_table_and_refuses_bad_options(tmp_path, capsys):
    from pacer_bench.answers import ANSWERS, META

    run = recorded()
    folder = tmp_path / "run"
    folder.mkdir()
    units = list(run.units.values())
    (folder / META).write_text(
        json.dumps({"version": 1, "baseline": "autoregressive", "settings": {}, "units": units, "prompt_sets": ["set"]})
    )
    (folder / ANSWERS).write_text("".join(json.dumps(g.record) + "\n" for g in run.generations))
    profile = tmp_path / "fake.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    code, out, err = run_cli(["replay", str(folder), "--profile", str(profile), "--gate", "window=16"], capsys)
    assert code == 0, err
    assert "the draft gate (margin 1.0, window 16, confidence 1.0" in out
    assert "| losing | 1 |" in out and "| gated | 1 | recorded with the gate on: not replayed" in out
    for option, needle in (
        ("window=0", "skip_drafting.window must be a whole number"),
        ("decay=0.25", "is not KEY=VALUE with KEY one of margin"),
        ("confidence=high", "--gate confidence needs a number"),
    ):
        code, out, err = run_cli(["replay", str(folder), "--profile", str(profile), "--gate", option], capsys)
        assert_one_line_error(code, err, needle)
    assert gate_config([]) == SkipConfig(enabled=True)

"""``pacer check``: it passes the shipped stacks and fails, naming the case, for deliberately broken
components (tests/broken_plugins.py); bad input is one line, exit 2. Also ``sample_match``: every
shipped stack, sampled, is token for token plain sampling with the same seed.

The default suite runs cheap stacks and single cases (``--case``); every shipped config's whole
``--quick`` check is marked slow (CI runs it through .ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pacer_bench.config import is_bench_config
from pacer_core.acceptance import sample_match_verify
from pacer_core.sampling import position_noise, sample_with_noise

from helpers import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[1]
BROKEN = str(ROOT / "tests" / "broken_plugins.py")
SHIPPED = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not is_bench_config(p))


def check(capsys, *argv) -> tuple[int, dict]:
    code, out, err = run_cli(["check", "--quick", "--json", *argv], capsys)
    assert code in (0, 1), err
    return code, json.loads(out)


def failing(result: dict) -> dict[str, str]:
    return {c["check"]: c["failed"] for c in result["checks"] if c["failed"]}


def test_a_cheap_shipped_stack_passes(capsys):
    code, result = check(capsys, "-c", str(ROOT / "configs" / "sampling.yaml"))
    assert code == 0 and result["passed"], result
    assert {c["check"]: c["cases"] > 0 for c in result["checks"]} == dict.fromkeys(
        ["greedy", "distribution", "sample_match", "repeatability", "options"], True)


@pytest.mark.slow
@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_passes(capsys, config):
    code, result = check(capsys, "-c", str(config))
    assert code == 0, failing(result)


@pytest.mark.parametrize("stack, expected", [
    (["strategy.drafter={name: no_rollback}", "strategy.stop=[{name: fixed, gamma: 3}]"],
     {"greedy": "greedy/prompt=plain", "distribution": "distribution/t0.7"}),
    pytest.param(["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 3}, {name: one_more}]"],
                 {"greedy": "greedy/prompt=plain"}, marks=pytest.mark.slow),  # fast: the table test below
], ids=["drafter-without-rollback", "stop-keeping-one-more"])
def test_broken_components_fail_naming_the_case(capsys, stack, expected):
    code, result = check(capsys, "--plugin", BROKEN, *stack)
    assert code == 1 and not result["passed"]
    named = failing(result)
    for name, case in expected.items():
        assert named[name] == case
    rerun = next(c["rerun"] for c in result["checks"] if c["failed"])
    assert "--case" in rerun and "--plugin" in rerun


@pytest.mark.parametrize("stack", [
    ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 3}]",
     "strategy.verifier={name: accept_on_q}"],
    pytest.param(["strategy.drafter={name: wrong_parent}", "strategy.stop=[{name: fixed, gamma: 3}]"],
                 marks=pytest.mark.slow),
], ids=["verifier-accepting-on-q", "tree-drafter-with-a-wrong-parent"])
def test_broken_sampling_fails_the_distribution_case(capsys, stack):
    code, result = check(capsys, "--plugin", BROKEN, *stack, "--case", "distribution/t0.7")
    assert code == 1 and failing(result) == {"distribution": "distribution/t0.7"}


def test_the_table_names_the_failing_case_and_its_rerun(capsys):
    code, out, err = run_cli(["check", "--quick", "--plugin", BROKEN, "strategy.drafter={name: draft_model}",
                              "strategy.stop=[{name: fixed, gamma: 3}, {name: one_more}]",
                              "--case", "greedy/prompt=plain"], capsys)
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("greedy"))
    assert "FAIL" in row and "Stop(keep=" in row and "rerun: pacer check" in row


@pytest.mark.parametrize("argv, needles", [
    (["strategy.drafter={name: nonesuch}"], ["unknown drafter 'nonesuch'"]),
    (["--plugin", "no_such_module_anywhere"], ["--plugin 'no_such_module_anywhere' does not import"]),
    (["--plugin", "json"], ["--plugin 'json' offers no components"]),
    (["strategy.drafter={name: datastore, corpus: shipped}"], ["cannot build a tiny pair for drafter 'datastore'"]),
    (["--case", "nonesuch/x"], ["--case 'nonesuch/x' names no check"]),
])
def test_bad_input_is_one_line(capsys, argv, needles):
    code, _, err = run_cli(["check", "--quick", *argv], capsys)
    assert_one_line_error(code, err, *needles)


# -- per-position randomness and sample_match's rule -------------------------------------------------
def test_position_noise_is_a_function_of_seed_and_position():
    assert torch.equal(position_noise(3, 10, 50), position_noise(3, 10, 50))
    assert not torch.equal(position_noise(3, 10, 50), position_noise(3, 11, 50))
    assert not torch.equal(position_noise(3, 10, 50), position_noise(4, 10, 50))


def test_sampling_with_position_noise_draws_the_distribution():
    from pacer_core.testing import chisquare_pvalue

    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    draws = [(int(sample_with_noise(probs, position_noise(0, i, 5))),) for i in range(4000)]
    assert chisquare_pvalue(draws, probs) > 1e-3 and all(d != (4,) for d in draws)


def test_sample_match_keeps_the_draft_while_it_equals_the_target_draw():
    vocab = 6
    noise = torch.stack([position_noise(1, i, vocab) for i in range(4)])  # [depth + 1, vocab]
    probs = torch.softmax(torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)), -1)  # [n + 1, vocab]
    drawn = [int(sample_with_noise(probs[i], noise[i])) for i in range(4)]
    chain = torch.tensor([drawn[0], drawn[1], (drawn[2] + 1) % vocab])
    verdict = sample_match_verify(chain, probs, noise)
    assert (verdict.accepted, verdict.next_token, verdict.next_kind) == (2, drawn[2], "recovered")
    verdict = sample_match_verify(torch.tensor(drawn[:3]), probs, noise)
    assert (verdict.accepted, verdict.next_token, verdict.next_kind) == (3, drawn[3], "bonus")
    # a tree: the root's second child carries the draw; its subtree is followed
    tree = torch.tensor([(drawn[0] + 1) % vocab, drawn[0]])
    rows = torch.stack([probs[0], probs[1], probs[1]])  # row 2 scores after node 1
    verdict = sample_match_verify(tree, rows, noise, parents=torch.tensor([-1, -1]))
    assert verdict.path == (1,) and verdict.next_kind == "bonus"
    assert verdict.next_token == int(sample_with_noise(rows[2], noise[1]))


def test_the_sampling_bench_names_both_verifiers_for_every_stack():
    from pacer_bench.config import read_bench_config
    from pacer_core.config import check as check_stack

    bench, stacks = read_bench_config(ROOT / "configs" / "bench_sampling.yaml")
    assert bench.sampling.temperature == 1.0 and list(stacks)[0] == "autoregressive"
    names = [name for name in stacks if name != "autoregressive"]
    for name in names:
        verifier = check_stack(stacks[name], require_models=False).verifier.component.name
        assert name.endswith(f"[{verifier}]")
    bases = {name.rsplit("[", 1)[0] for name in names}
    assert {f"{b}[{v}]" for b in bases for v in ("speculative_sampling", "sample_match")} == set(names)

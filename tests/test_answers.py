"""The bench's answer log (``pacer_bench.answers``): a cut-short last line and duplicates dropped, a
damaged middle line refused naming it; ``first_divergence`` and a generation's step metrics."""

from __future__ import annotations

import json
import statistics

import pytest

from pacer_bench.answers import AnswerLog, first_divergence
from pacer_core.errors import InputError
from pacer_core.metrics import step_metrics


def test_answer_log_drops_only_a_cut_short_last_line_and_duplicates(tmp_path):
    path = tmp_path / "answers.jsonl"
    good = {
        "prompt_set": "s",
        "question_id": "a",
        "model_id": "m",
        "repeat": 0,
        "tokens": [],
        "metrics": {},
        "choices": [
            {"turns": ["t"], "decoding_steps": [1], "new_tokens": [0], "wall_time": [0.0], "accept_lengths": []}
        ],
    }
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + '{"prompt_set": "s", "quest')
    log = AnswerLog(path)
    assert (log.dropped, log.duplicates, len(log.records)) == (1, 1, 1)  # a truncated tail, a duplicate
    assert path.read_text() == json.dumps(good) + "\n"
    log.append({**good, "question_id": "b"})
    with pytest.raises(RuntimeError, match="duplicate"):
        log.append(good)
    assert len(path.read_text().splitlines()) == 2


CHOICES = (
    '"choices": [{"turns": ["t"], "decoding_steps": [1], "new_tokens": [0], "wall_time": [0.0], "accept_lengths": []}]'
)


@pytest.mark.parametrize(
    "line, problem",
    [
        ("not json", "not JSON"),
        ('{"prompt_set": "s", "quest', "not JSON"),  # a cut-short line is an interrupted write only when last
        ("[1, 2]", "a JSON list, not an object"),
        ('{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": []}', "no 'metrics'"),
        ('{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": 5, "metrics": {}}', "'tokens' is a int"),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}, '
            '"repeat": "1", ' + CHOICES + "}",
            "'repeat'",
        ),
        # nested fields the report reads (a TypeError or KeyError in the report before)
        ('{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}}', "no 'choices'"),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {"wall_s": "slow"}, '
            + CHOICES
            + "}",
            "'metrics.wall_s' is \"slow\", not a number",
        ),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], '
            '"metrics": {"accept_lengths": [1, "2"]}, ' + CHOICES + "}",
            "'metrics.accept_lengths[1]' is \"2\", not a count",
        ),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}, "choices": [{}]}',
            "'choices[0].turns' is null, not a list of texts",
        ),
        (
            '{"prompt_set": "s", "question_id": "x", "model_id": "m", "tokens": [], "metrics": {}, "choices": []}',
            "'choices' holds no answer object",
        ),
    ],
)
def test_answer_log_with_a_damaged_middle_line_is_refused_naming_the_line(tmp_path, line, problem):
    path = tmp_path / "answers.jsonl"
    good = {
        "prompt_set": "s",
        "question_id": "a",
        "model_id": "m",
        "repeat": 0,
        "tokens": [],
        "metrics": {},
        "choices": [
            {"turns": ["t"], "decoding_steps": [1], "new_tokens": [0], "wall_time": [0.0], "accept_lengths": []}
        ],
    }
    text = json.dumps(good) + "\n" + line + "\n" + json.dumps({**good, "question_id": "b"}) + "\n"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        AnswerLog(path)
    message = str(info.value)
    assert f"answer log '{path}' line 2 is not a bench record" in message and problem in message, message
    assert "delete line 2" in message and "\n" not in message
    assert path.read_text() == text  # nothing rewritten


def test_first_divergence_and_step_metrics():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    m = step_metrics([3, 1, 2], [2, 2, 0], [2, 0, 0])
    assert m["mean_accepted_length"] == 2.0 and m["acceptance_rate"] == 0.5
    assert m["per_position_acceptance"] == [0.5, 0.5] and m["draft_length_histogram"] == {0: 1, 2: 2}
    assert statistics.mean(m["drafted_per_step"]) == pytest.approx(4 / 3)

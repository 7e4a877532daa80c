"""The bench's prompt files (``pacer_bench.prompts``): ``skip`` and ``limit``, and a bad file refused in
one line before models load.

``pacer_bench.units.load_models`` is replaced by one returning tests/helpers.py's tiny models and a character
tokenizer, so nothing real loads. Timings on tiny models mean nothing; the tests check bookkeeping.
"""

from __future__ import annotations

import pytest

from pacer_bench import units
from pacer_bench.config import read_bench_config
from pacer_bench.run import run_bench

from helpers import assert_one_line_error, bench_models, never_load, prompt_file, read_answers, run_cli, write_bench


@pytest.fixture(scope="module")
def models():
    return bench_models()


@pytest.fixture
def tiny(monkeypatch, models):
    monkeypatch.setattr(units, "load_models", lambda cfg: models)
    return models


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"prompt": "caf\xe9"}\n', "is not UTF-8 text (byte 0xe9)"),
        (b'{"prompt": "a"}\nnot json\n', "line 2 is not JSON"),
        (b'["a"]\n', "line 1 is a JSON list, not an object"),
        (b'{"prompt": "a"}\n\n{"turns": "b"}\n', "line 3 has 'turns' that is not a list of texts"),
        (b'{"question_id": 81, "turns": ["a", 5]}\n', "line 1 has 'turns' that is not a list of texts"),
        (b'{"turns": []}\n', "line 1 has 'turns' that is not a list of texts"),
        (b'{"question_id": "q"}\n', "line 1 has no text under 'prompt' or 'turns'"),
        (b'{"prompt": 5}\n', "line 1 has no text"),
        (
            b'{"question_id": [1], "prompt": "a"}\n',
            "line 1 has a question_id that is a list: give text or a whole number",
        ),
        (
            b'{"question_id": 81, "turns": ["a"]}\n{"question_id": "81", "turns": ["b"]}\n',
            "line 2 repeats question_id 81 of line 1: give each question its own id",
        ),
        (None, "is a folder, not a file"),
    ],
)
def test_a_bad_prompt_file_is_one_line_before_models_load(tmp_path, capsys, monkeypatch, content, problem):
    monkeypatch.setattr(units, "load_models", never_load)
    prompts = tmp_path / "mine.jsonl"
    if content is None:
        prompts.mkdir()
    else:
        prompts.write_bytes(content)
    code, _, err = run_cli(["bench", f"prompt_sets=[{prompts}]", "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, f"prompt file '{prompts}'", problem)
    assert not (tmp_path / "out").exists()
    code, _, err = run_cli(
        ["bench", f"prompt_sets=[{tmp_path / 'gone.jsonl'}]", "--out", str(tmp_path / "out")], capsys
    )
    assert_one_line_error(code, err, "gone.jsonl' does not exist", "give the path of a .jsonl file")


def test_skip_leaves_out_the_first_prompts_of_each_set(tmp_path, tiny):
    from pacer_bench.prompts import load_prompts

    prompts = prompt_file(tmp_path, 3)
    assert [p.question_id for p in load_prompts(str(prompts), limit=1, skip=1)] == ["q1"]
    assert [p.question_id for p in load_prompts(str(prompts), skip=2)] == ["q2"]
    config = write_bench(tmp_path, "skip: 1\nlimit: 1\nstacks: {}\n")
    cfg, stacks = read_bench_config(config)
    assert run_bench(cfg, stacks, tmp_path / "out", progress=False, report=False) == 0
    assert {r["question_id"] for r in read_answers(tmp_path / "out")} == {"q1"}
    with pytest.raises(Exception, match="skip must be >= 0"):
        read_bench_config(config, ["skip=-1"])

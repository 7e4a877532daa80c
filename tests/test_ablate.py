"""``pacer ablate``'s grid-point names, the plots' legibility and ``--compare``'s small-sample rule.

Grid points are named short (``eagle·margin(0.3)``, or labels the grid file declares); the name is
the stack's everywhere: the answer log, ablation.md, the plots, Spec-Bench's files, ``--compare``.
The ablation runs on tiny seeded models (``pacer_bench.units.load_models`` replaced), so timings
mean nothing; the tests check names, files and the figures' geometry.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pacer_bench import units
from pacer_bench.compare import MIN_PROMPTS, compare, markdown, verdict
from pacer_bench.config import read_ablate_config
from pacer_bench.labels import ascii_name, grid_points, resolve_name
from pacer_bench.report import acceptance_figure, draft_lengths_figure, speedup_figure
from pacer_core.errors import ConfigError

from helpers import CharTokenizer, adapter, read_answers, run_cli, tiny_llama, write_bench, write_bench_config

PROMPTS = ["the cat sat on the mat. the cat sat on the", "abc abc abc abc abc", "to be or not to be, to be"]


@pytest.fixture(scope="module")
def models():
    return units.Models(adapter(tiny_llama(0)), None, CharTokenizer())


@pytest.fixture
def tiny(monkeypatch, models):
    monkeypatch.setattr(units, "load_models", lambda cfg: models)
    return models


# -- names ---------------------------------------------------------------------------------------
def test_grid_points_get_short_names_from_their_values():
    hybrid = {"name": "hybrid", "members": [{"name": "eagle"}, {"name": "prompt_lookup"}]}
    points = grid_points(
        {
            "strategy.drafter": [{"name": "eagle"}, hybrid],
            "strategy.stop": [
                [{"name": "margin", "threshold": 0.3}],
                [{"name": "fixed", "gamma": 2}, {"name": "confidence"}],
            ],
        }
    )
    assert list(points) == [
        "eagle·margin(0.3)",
        "eagle·fixed(2)+confidence",
        "hybrid(eagle+prompt_lookup)·margin(0.3)",
        "hybrid(eagle+prompt_lookup)·fixed(2)+confidence",
    ]
    assert points["hybrid(eagle+prompt_lookup)·margin(0.3)"] == {
        "strategy.drafter": hybrid,
        "strategy.stop": [{"name": "margin", "threshold": 0.3}],
    }
    # scalars carry their key's last part; the whole key where two keys share it
    assert list(grid_points({"strategy.stop.0.gamma": [2], "strategy.drafter.max_ngram_size": [3, 4]})) == [
        "gamma=2·max_ngram_size=3",
        "gamma=2·max_ngram_size=4",
    ]
    assert list(grid_points({"strategy.stop.0.gamma": [2], "strategy.stop.1.gamma": [True]})) == [
        "strategy.stop.0.gamma=2·strategy.stop.1.gamma=true"
    ]
    # where the short form would name two points alike, the options are spelled out
    assert list(grid_points({"strategy.stop": [[{"name": "m", "a": 1}], [{"name": "m", "b": 1}]]})) == [
        "m(a=1)",
        "m(b=1)",
    ]


def test_declared_labels_name_the_points_and_bad_ones_are_refused():
    grid = {"strategy.drafter": [{"name": "eagle"}, {"name": "draft_model"}], "strategy.stop.0.gamma": [2, 4]}
    points = grid_points(grid, {"strategy.drafter": ["feature", "token"]})
    assert list(points) == ["feature·gamma=2", "feature·gamma=4", "token·gamma=2", "token·gamma=4"]
    assert list(grid_points({"strategy.stop.0.gamma": [2, 4]}, {"strategy.stop.0.gamma": [2, 4]})) == ["2", "4"]
    for labels, needle in [
        ({"strategy.drafter": ["one"]}, "one label per value"),
        ({"strategy.nope": ["a", "b"]}, "labels.strategy.nope names no grid key"),
        ({"strategy.drafter": ["a", "a"]}, "the same label"),
        ({"strategy.drafter": ["a|b", "c"]}, "is not a label"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            grid_points(grid, labels)
    with pytest.raises(ConfigError, match="would both be named 'x'.*declare labels"):
        grid_points({"strategy.stop": [[{"name": "x"}], [{"name": "x"}]]})


def test_names_typed_back_are_found_in_their_ascii_form():
    names = ["autoregressive", "eagle·margin(0.3)", "gamma=2·max_ngram_size=3"]
    assert ascii_name("eagle·margin(0.3)") == "eagle_margin(0.3)"
    assert resolve_name("eagle·margin(0.3)", names) == "eagle·margin(0.3)"
    assert resolve_name("`eagle·margin(0.3)`", names) == "eagle·margin(0.3)"
    assert resolve_name("eagle_margin(0.3)", names) == "eagle·margin(0.3)"
    assert resolve_name("gamma=2_max_ngram_size=3", names) == "gamma=2·max_ngram_size=3"
    assert resolve_name("eagle", names) is None
    assert resolve_name("a_b", ["a·b", "a b"]) is None  # two stacks match: neither is chosen


def test_a_grid_file_declares_labels(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "stack: {strategy: {drafter: {name: prompt_lookup}, verifier: {name: greedy}}}\n"
        "grid:\n  strategy.stop: [[{name: fixed, gamma: 2}], [{name: heuristic}]]\n"
        "labels:\n  strategy.stop: [short, adaptive]\n"
    )
    _, stacks, ablation = read_ablate_config(grid)
    assert list(stacks) == ["autoregressive", "short", "adaptive"]
    assert stacks["adaptive"].config.strategy.stop == [{"name": "heuristic"}]
    assert ablation["points"]["short"] == {"strategy.stop": [{"name": "fixed", "gamma": 2}]}
    grid.write_text(grid.read_text().replace("[short, adaptive]", "[short]"))
    with pytest.raises(ConfigError, match="labels.strategy.stop must list one label per value"):
        read_ablate_config(grid)


# -- an ablation end to end: names in every output, --compare takes them ----------------------------
def test_an_ablation_names_its_points_alike_in_every_output(tmp_path, tiny, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    base = write_bench_config(tmp_path, prompts, 8, "")
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"bench: {base.name}\n"
        "stack: {strategy: {drafter: {name: prompt_lookup}, verifier: {name: greedy}}}\n"
        "grid:\n  strategy.stop: [[{name: fixed, gamma: 1}], [{name: heuristic, gamma: 3}]]\n"
        "  strategy.drafter.max_ngram_size: [2]\n"
    )
    out = tmp_path / "out"
    code, _, err = run_cli(["ablate", "--config", str(grid), "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    names = ["fixed(1)·max_ngram_size=2", "heuristic(3)·max_ngram_size=2"]
    assert {r["model_id"] for r in read_answers(out)} == {"autoregressive", *names}
    table = (out / "ablation.md").read_text().splitlines()
    assert table[0].startswith("| stack | strategy.stop | strategy.drafter.max_ngram_size | prompts |")
    copied = [row.split(" | ")[0].lstrip("| ") for row in table[2:]]
    assert copied == names
    assert table[2].split(" | ")[1] == '[{"name":"fixed","gamma":1}]'
    files = sorted(p.name for p in (out / "specbench").iterdir())
    assert files == ["autoregressive.jsonl", "fixed(1)_max_ngram_size=2.jsonl", "heuristic(3)_max_ngram_size=2.jsonl"]
    assert all(name.isascii() for name in files)
    plots = {"speedup_per_set.png", "draft_lengths.png", "per_position_acceptance.png"}
    assert plots <= {p.name for p in out.iterdir()}
    for a, b in [copied, [ascii_name(n) for n in copied], [f"`{n}`" for n in copied]]:
        code, text, err = run_cli(["report", str(out), "--compare", a, b], capsys)
        assert code == 0, err
        assert f"| prompt set | prompts | generations | {names[0]} ÷ {names[1]} |" in text
        assert "too few prompts to tell (3 < 8)" in text and "Too few prompts to tell in " in text


# -- --compare on few prompts -----------------------------------------------------------------------
def _records(prompts: int, rates: dict[str, list[float]], set_name: str = "s") -> list[dict]:
    """Records of stacks with the given tokens/s per prompt (100 tokens each)."""
    return [
        {
            "model_id": name,
            "prompt_set": set_name,
            "question_id": f"q{i}",
            "tokens": [0] * 100,
            "metrics": {"wall_s": 100 / rate, "steps": 10, "accept_lengths": [10] * 10},
        }
        for name, per_prompt in rates.items()
        for i, rate in zip(range(prompts), per_prompt)
    ]


def test_compare_draws_no_verdict_from_too_few_prompts():
    # two prompts where A is clearly faster: the interval lies above 1, yet no verdict is drawn
    records = _records(2, {"A": [150.0, 160.0], "B": [100.0, 100.0]})
    found = compare(records, "A", "B", ["s"])
    assert found["s"]["ci"][0] > 1.0 and found["s"]["verdict"] == f"too few prompts to tell (2 < {MIN_PROMPTS})"
    assert "Too few prompts to tell in s, all" in markdown(found, "A", "B")
    # enough prompts: the verdict follows the interval
    many = _records(MIN_PROMPTS, {"A": list(np.linspace(150, 160, MIN_PROMPTS)), "B": [100.0] * MIN_PROMPTS})
    found = compare(many, "A", "B", ["s"])
    assert found["all"]["verdict"] == "A faster" and "Too few" not in markdown(found, "A", "B")
    assert verdict([0.9, 1.1], "A", "B", MIN_PROMPTS) == "no difference beyond the noise"
    assert verdict([1.1, 1.2], "A", "B", MIN_PROMPTS - 1).startswith("too few prompts to tell")


# -- plots: intervals on speedups, legends off the data, titles apart ----------------------------------
def _results(names: list[str]) -> dict:
    cell = {
        "speedup": 1.4,
        "speedup_ci": [1.2, 1.6],
        "drafted": 10,
        "per_position_acceptance": [0.8, 0.6, 0.4],
        "draft_length_histogram": {"1": 3, "2": 5, "4": 2},
    }
    table = {
        s: {"autoregressive": {"speedup": 1.0, "speedup_ci": [1.0, 1.0]}, **{n: dict(cell) for n in names}}
        for s in ("humaneval", "gsm8k", "all")
    }
    return {
        "baseline": "autoregressive",
        "prompt_sets": ["humaneval", "gsm8k"],
        "table": table,
        "units": [{"name": "autoregressive"}] + [{"name": n} for n in names],
    }


LONG = [
    'drafter={"name":"hybrid","members":[{"name":"eagle"},{"name":"prompt_lookup"}]} '
    'stop=[{"name":"margin","threshold":0.3}]',
    'drafter={"name":"eagle"} stop=[{"name":"margin","threshold":0.5}]',
    "eagle·margin(0.3)",
    "hybrid(eagle+prompt_lookup)·fixed(2)+confidence",
]


def _boxes(fig, artists):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


def test_the_speedup_plot_has_intervals_and_its_legend_beside_the_bars():
    fig = speedup_figure(_results(LONG))
    (ax,) = fig.axes
    bars = [c for c in ax.containers if c.__class__.__name__ == "BarContainer"]
    assert len(bars) == len(LONG) and all(b.errorbar is not None for b in bars)
    lines = bars[0].errorbar.lines[2][0].get_segments()  # the vertical error bars of the first stack
    assert [tuple(np.round(seg[:, 1], 3)) for seg in lines] == [(1.2, 1.6)] * 3
    legend, axes_box = _boxes(fig, [ax.get_legend(), ax])
    assert not legend.overlaps(axes_box), "the legend covers the bars"


def test_the_acceptance_plot_keeps_its_axes_and_its_legend_apart():
    fig = acceptance_figure(_results(LONG))
    (ax,) = fig.axes
    legend, axes_box = _boxes(fig, [ax.get_legend(), ax])
    assert not legend.overlaps(axes_box)
    assert axes_box.width > 0.5 * fig.bbox.width, "the legend squeezed the axes"


def test_the_draft_length_titles_do_not_overlap():
    fig = draft_lengths_figure(_results(LONG))
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == len(LONG)
    titles = _boxes(fig, [ax.title for ax in axes])
    frames = _boxes(fig, axes)
    for i, title in enumerate(titles):
        assert title.x0 >= 0 and title.x1 <= fig.bbox.width, "a title runs off the figure"
        assert not any(title.overlaps(other) for j, other in enumerate(titles) if j != i)
        assert not any(title.overlaps(frame) for frame in frames)


def test_plots_are_written_with_the_legend_inside_the_file(tmp_path):
    from PIL import Image

    from pacer_bench.report import make_plots

    files = make_plots(_results(LONG), Path(tmp_path))
    assert files == ["speedup_per_set.png", "draft_lengths.png", "per_position_acceptance.png"]
    width, _ = Image.open(tmp_path / "speedup_per_set.png").size
    assert width > 600  # the bars and, beside them, the legend


def test_ablate_runs_a_grid_into_one_table(tmp_path, tiny, capsys):
    base = write_bench(tmp_path, "", n=2)
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"bench: {base.name}\noverrides: [max_new_tokens=8]\n"
        "stack: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed}], "
        "verifier: {name: greedy}}}\n"
        "grid: {strategy.stop.0.gamma: [1, 3]}\n"
    )
    code, out, err = run_cli(["ablate", "--config", str(grid), "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 0, err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = results["ablation"]["rows"]
    assert [r["strategy.stop.0.gamma"] for r in rows] == [1, 3] and all(r["records"] == 2 for r in rows)
    table = (tmp_path / "out" / "ablation.md").read_text()
    assert table.count("\n") == 4 and "| stack | strategy.stop.0.gamma |" in table and table in out + "\n"
    records = read_answers(tmp_path / "out")
    assert {r["model_id"] for r in records} == {"autoregressive", "gamma=1", "gamma=3"}
    assert max(d for r in records if r["model_id"] == "gamma=1" for d in r["metrics"]["drafted_per_step"]) <= 1

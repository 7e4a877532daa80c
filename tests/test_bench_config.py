"""The bench and ablation configs (``pacer_bench.config``): the shipped ones validate, a bad one is a
one-line error naming what is wrong, the shipped draft where a stack or baseline needs one, the
model sections' dtype and device."""

from __future__ import annotations

from pathlib import Path

import pytest

from pacer_bench.config import (
    HF_BASELINES,
    BenchConfig,
    BenchModelConfig,
    model_config,
    read_ablate_config,
    read_bench_config,
)

from helpers import run_cli, write_bench

ROOT = Path(__file__).resolve().parents[1]


# -- configs and errors -------------------------------------------------------------------------
def shipped_bench(path: Path):
    """A shipped bench config read: the bench and each stack's run config (of its run plan)."""
    bench, plans = read_bench_config(path)
    return bench, {name: plan.config for name, plan in plans.items()}


def shipped_ablate(path: Path):
    bench, plans, ablation = read_ablate_config(path)
    return bench, {name: plan.config for name, plan in plans.items()}, ablation


def _hybrids_beside_their_model_member(stacks) -> list[str]:
    """The config's hybrid stacks, after checking each has a stack of its model member (the first)
    under the same stop beside it."""
    hybrids = [name for name, c in stacks.items() if c.strategy.drafter["name"] == "hybrid"]
    for name in hybrids:
        c = stacks[name]
        model = c.strategy.drafter["members"][0]
        assert any(s.strategy.drafter == model and s.strategy.stop == c.strategy.stop for s in stacks.values()), name
    return hybrids


def test_shipped_bench_and_ablate_configs_validate():
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench.yaml")
    assert list(stacks)[0] == "autoregressive" and len(stacks) >= 6
    log = stacks[cfg.oracle.log_stack].strategy.stop
    assert log == [{"name": "fixed", "gamma": 16}] and cfg.oracle.verify_max_k >= 17
    assert stacks["prompt_lookup+heuristic"].strategy.stop[0]["name"] == "heuristic"
    # the hf_assisted_* baselines and the draft_model/ouroboros stacks use the shipped token-level draft
    assert "hf_assisted_constant" in cfg.baselines and set(cfg.baselines) <= set(HF_BASELINES)
    assert cfg.draft.path.endswith("default")
    # token-tree rows beside the chains, for both drafts, in the same run; the oracle's log is a chain
    trees = {name: c.strategy.drafter for name, c in stacks.items() if c.strategy.drafter.get("tree") is not None}
    assert 6 <= len(trees) <= 8 and {d["name"] for d in trees.values()} == {"eagle", "draft_model"}
    assert all("+tree(" in name for name in trees) and cfg.oracle.log_stack not in trees
    assert {s["name"] for name in trees for s in stacks[name].strategy.stop} == {"fixed", "confidence", "pacer"}
    assert max(cfg.oracle.verify_tree_k) >= max(d["tree"]["nodes"] for d in trees.values()) + 1
    # the hybrid rows: each beside its members (the model member's tree with the same stop, prompt lookup)
    assert _hybrids_beside_their_model_member(stacks) and "prompt_lookup+heuristic" in stacks
    # the tree-shape sweep (exact columns) and the timed shapes beside the best chains and generate
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_tree_sweep.yaml")
    shapes = {
        (d["tree"]["topk"], d["tree"]["depth"]) for d in (c.strategy.drafter for c in stacks.values()) if d.get("tree")
    }
    assert len(shapes) >= 8 and any(
        c.strategy.drafter.get("tree") is None and c.strategy.drafter["name"] == "eagle" for c in stacks.values()
    )
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_tree_shapes.yaml")
    assert cfg.dtype == "bfloat16" and cfg.baselines == ["hf_generate"] and list(stacks)[0] == "autoregressive"
    assert {"eagle+pacer", "eagle+confidence", "prompt_lookup+heuristic"} <= set(stacks)
    assert any(c.strategy.drafter["name"] == "hybrid" for c in stacks.values())
    # the goals' stacks in one run: the eagle chain at γ 1-4, each adaptive stop on it, trees, hybrids beside members
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_goals.yaml")
    assert cfg.dtype == "bfloat16" and cfg.baselines == ["hf_generate"] and list(stacks)[0] == "autoregressive"
    chains = [c for c in stacks.values() if c.strategy.drafter == {"name": "eagle"}]
    assert {s["gamma"] for c in chains for s in c.strategy.stop if s["name"] == "fixed"} == {1, 2, 3, 4}
    assert {s["name"] for c in chains for s in c.strategy.stop} == {"fixed", "confidence", "entropy", "pacer"}
    assert max(cfg.oracle.verify_tree_k) >= max(
        c.strategy.drafter["tree"]["nodes"] for c in stacks.values() if c.strategy.drafter.get("tree")
    )
    assert _hybrids_beside_their_model_member(stacks)
    # the quick tree-vs-chain bench: fp32 (outputs must be identical), chains and trees of both drafts
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_trees.yaml")
    assert cfg.dtype == "float32" and cfg.verify_cost and list(stacks)[0] == "autoregressive"
    kinds = {(c.strategy.drafter["name"], c.strategy.drafter.get("tree") is not None) for c in stacks.values()}
    assert {("eagle", False), ("eagle", True), ("draft_model", False), ("draft_model", True)} <= kinds
    cfg, stacks, ablation = shipped_ablate(ROOT / "configs" / "ablate.yaml")
    assert len(stacks) == 1 + len(ablation["points"]) == 10 and cfg.baselines == []
    assert stacks["gamma=8·max_ngram_size=2"].strategy.stop[0]["gamma"] == 8
    assert stacks["gamma=8·max_ngram_size=2"].strategy.drafter["max_ngram_size"] == 2


def test_every_shipped_bench_config_validates_and_the_engine_and_gpu_benches_compare_with_generate():
    from pacer_bench.config import is_bench_config

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if is_bench_config(path) and not path.name.startswith("ablate"):
            read_bench_config(path)  # raises ConfigError in one line if a shipped bench config broke
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_engine.yaml")  # the engine's own overhead
    assert list(stacks) == ["autoregressive"] and cfg.baselines == ["hf_generate"] and cfg.repeats >= 3
    cfg, stacks = shipped_bench(ROOT / "configs" / "bench_gpu.yaml")  # scripts/gpu_check.sh
    assert cfg.device == "auto" and cfg.dtype == "bfloat16" and "hf_generate" in cfg.baselines
    assert list(stacks)[0] == "autoregressive" and any(c.strategy.drafter.get("tree") for c in stacks.values())


@pytest.mark.parametrize(
    "text, needles",
    [
        ("stackz: {}\n", ["unknown option 'stackz'", "valid options", "stacks"]),
        (
            "stacks: {a: {strategyy: {}}}\n",
            ["unknown option 'stacks.a.strategyy'; valid options: config, strategy, generation, overrides"],
        ),
        ("stacks: {a: {strategy: {drafter: {name: nope}}}}\n", ["stacks.a", "unknown drafter 'nope'", "prompt_lookup"]),
        (
            "target: {path: /my/target}\nstacks: {a: {strategy: {drafter: {name: draft_model}}}}\n",
            ["stacks.a", "needs a draft model", "draft.path"],
        ),
        (  # a composite's member needing a draft model
            "target: {path: /my/target}\nstacks: {h: {strategy: {drafter: {name: hybrid, members: "
            "[{name: draft_model}, {name: prompt_lookup}]}}}}\n",
            ["stacks.h", "members[0] 'draft_model' needs a draft model", "draft.path"],
        ),
        ("stacks: {a: {overrides: [strategy.stop.0.gama=3]}}\n", ["stacks.a", "gama"]),
        ("baselines: [hf_nope]\n", ["unknown baseline 'hf_nope'", "hf_generate"]),
        ("oracle: {log_stack: missing}\n", ["oracle.log_stack 'missing'"]),
        ("max_new_tokens: 0\n", ["max_new_tokens must be >= 1"]),
        ("max_new_tokens: lots\n", ["bad value", "max_new_tokens"]),
        ("prompt_sets: [nope]\n", ["unknown prompt set 'nope'", "humaneval"]),
        ("target: {pth: x}\n", ["unknown option 'target.pth'; valid options: path, dtype"]),
        ("baseline_options: {gamma: 3}\n", ["unknown option 'baseline_options.gamma'; valid options: assisted_gamma"]),
        ("dtype: float8\n", ["unknown dtype 'float8'"]),
        ("stacks: [1, 2\n", ["malformed YAML", "line"]),
        ("- humaneval\n", ["must hold a mapping"]),
        ("target: 3\n", ["'target' must be a mapping of options (path, dtype", "got int 3"]),
        ("stacks: [a, b]\n", ["'stacks' must be a mapping", "got list"]),
        ("stacks: {mine: 3}\n", ["'stacks.mine' must be a mapping of options (config, strategy", "got int 3"]),
        ("stacks: {a: {strategy: 3}}\n", ["'stacks.a.strategy' must be a mapping, got int 3"]),
        ("stacks: {a: {overrides: strategy.stop.0.gamma=3}}\n", ["'stacks.a.overrides' must be a list", "got str"]),
        ("prompt_sets: humaneval\n", ["'prompt_sets' must be a list", "got str"]),
        ("oracle: 5\n", ["'oracle' must be a mapping of options (log_stack", "got int 5"]),
        ("oracle: {verify_tree_k: 4}\n", ["'oracle.verify_tree_k' must be a list, got int 4"]),
        ("sampling: {temperature: hot}\n", ["bad value for 'sampling.temperature'", "give a value of type float"]),
        ("draft: null\nrepeats: 0\n", ["repeats must be >= 1"]),
        ("oracle: {verify_tree_k: [1, 4]}\n", ["oracle.verify_tree_k must list token counts >= 2"]),
        ("oracle: {verify_tree_k: [4, 4]}\n", ["oracle.verify_tree_k names a token count twice"]),
        (
            "stacks: {t: {strategy: {drafter: {name: eagle, tree: {topk: 2}}, stop: [{name: fixed, gamma: 8}]}}}\n"
            "oracle: {log_stack: t}\n",
            ["oracle.log_stack 't' drafts a token tree", "log a stack drafting a long fixed chain"],
        ),
    ],
)
def test_bad_bench_yaml_is_a_one_line_error(tmp_path, capsys, text, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, out, err = run_cli(["bench", "--config", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()  # failed before anything ran


def test_the_bench_config_is_validated_as_every_config_is(tmp_path):
    """One validator (``pacer_core.schema.validate_typed``) for the run, bench and ablation configs:
    an unknown key at any depth is named with the options valid there, in one wording."""
    from pacer_core import ConfigError, load_config

    refusals = [
        (lambda: load_config(overrides=["target.pth=x"]), "target: unknown option 'pth'; valid options: path"),
        (
            lambda: read_bench_config(None, ["target.pth=x"]),
            "bench config: unknown option 'target.pth'; valid options: path",
        ),
        (
            lambda: read_bench_config(None, ["stacks.a.confg=x"]),
            "bench config: unknown option 'stacks.a.confg'; valid options: config, strategy",
        ),
        (
            lambda: read_bench_config(None, ["max_new_tokens"]),
            "bench config: override 'max_new_tokens' is not key=value (e.g. max_new_tokens=32)",
        ),
    ]
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid: {strategy.stop.0.gamma: [1]}\nstack: {overides: []}\n")
    refusals.append(
        (
            lambda: read_ablate_config(grid),
            f"ablate config '{grid}': unknown option 'stack.overides'; valid options: config, strategy",
        )
    )
    grid_value = tmp_path / "grid_value.yaml"
    grid_value.write_text("grid: {strategy.stop.0.gamma: 3}\n")
    refusals.append(
        (
            lambda: read_ablate_config(grid_value),
            f"ablate config '{grid_value}': 'grid.strategy.stop.0.gamma' must be a list, got int 3",
        )
    )
    for read, start in refusals:
        with pytest.raises(ConfigError) as refused:
            read()
        message = str(refused.value)
        assert message.startswith(start) and "\n" not in message and "unknown key" not in message, message


def test_other_command_errors_are_one_line(tmp_path, capsys):
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 2 and "not a bench folder" in err and len(err.splitlines()) == 1
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid: {}\n")
    code, _, err = run_cli(["ablate", "--config", str(grid)], capsys)
    assert code == 2 and "grid is empty" in err and len(err.splitlines()) == 1
    code, _, err = run_cli(["bench", "--config", str(grid), "max_new_tokens"], capsys)
    assert code == 2 and "not key=value" in err


def test_the_embedded_target_gets_its_shipped_draft_when_a_stack_or_baseline_needs_one(tmp_path):
    from pacer_plugins.pacer_builtins.drafters import DEFAULT_DRAFT

    for name in "abcd":
        (tmp_path / name).mkdir()
    needs = write_bench(tmp_path / "a", "stacks: {d: {strategy: {drafter: {name: draft_model}}}}\n")
    cfg, _ = read_bench_config(needs)
    assert cfg.draft.path == DEFAULT_DRAFT and cfg.draft.dtype is None  # the bench's dtype
    assisted = write_bench(tmp_path / "b", "baselines: [hf_assisted_constant]\n")
    assert read_bench_config(assisted)[0].draft.path == DEFAULT_DRAFT
    free = write_bench(
        tmp_path / "c", "stacks: {p: {strategy: {drafter: {name: prompt_lookup}}}}\nbaselines: [hf_generate]\n"
    )
    assert read_bench_config(free)[0].draft is None  # nothing needs a draft: none is loaded
    mine = write_bench(
        tmp_path / "d", "draft: {path: /my/draft}\nstacks: {d: {strategy: {drafter: {name: draft_model}}}}\n"
    )
    assert read_bench_config(mine)[0].draft.path == "/my/draft"


def test_bench_model_sections_take_the_bench_dtype_and_device_unless_they_set_their_own():
    cfg = BenchConfig(dtype="bfloat16", device="cpu")
    mine = model_config(BenchModelConfig(path="x", device_map=None, pack_weights=False), cfg)
    assert (mine.path, mine.dtype, mine.device, mine.pack_weights) == ("x", "bfloat16", "cpu", False)
    own = model_config(BenchModelConfig(dtype="float32", device="meta"), cfg)
    assert (own.path, own.dtype, own.device, own.pack_weights) == (None, "float32", "meta", None)

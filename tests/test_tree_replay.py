"""scripts/tree_replay.py's replay: what a shape sends and accepts, read off a recorded wider tree,
and the analysis's figures on synthetic steps (the oracle tree above every shape, sending the best
nodes above sending all when rows are dear)."""

import json
import random
import re

from helpers import load_script

# node: 0 (main, q .6)  1 (q .3)  | 2 (main, child of 0, q .5)  3 (child of 0, q .4)  4 (child of 1, q .9)
STEP = {"prompt": "gsm8k/20", "tokens": [5, 6, 7, 8, 9], "parents": [-1, -1, 0, 0, 1], "q": [0.6, 0.3, 0.5, 0.4, 0.9],
        "main": [0, 2], "path": [0, 3], "forwards": 2, "draft_s": 0.02}


def replay():
    module = load_script("tree_replay")
    return module


def test_a_shape_sends_the_recorded_trees_best_nodes_and_accepts_the_paths_prefix_among_them():
    module = replay()
    step = json.loads(json.dumps(STEP))
    module.prepare([step])
    assert step["depth"] == [1, 1, 2, 2, 2] and abs(step["cp"][4] - 0.27) < 1e-9
    assert module.shape(step, 1, 2) == [0, 2]  # a chain: the main path
    assert module.shape(step, 2, 1) == [0, 1]
    assert module.shape(step, 2, 2) == [0, 1, 2, 4]  # level 2: the main child, then the likeliest other (.27 > .24)
    assert module.accepted(step, {0, 2}) == 1 and module.accepted(step, {0, 3}) == 2 and module.accepted(step, {1}) == 0
    assert module.best(step, [0, 1, 2, 3, 4], 3) == {0, 2, 1}  # .6, .3 (ties to the earlier node) and .3


def steps(count=400):
    """Wide trees whose accepted path follows the main path with probability .5 a level, else the
    second child once: what the draft's probabilities say, so the best nodes are the likely ones."""
    rng = random.Random(0)
    rows = []
    for s in range(count):
        tokens, parents, q, level_nodes = [], [], [], [-1]
        main, path = [], []
        for depth in range(4):
            new = []
            for parent in level_nodes[:2]:
                for j, p in enumerate((0.5, 0.3, 0.1, 0.05)):
                    new.append(len(tokens))
                    tokens.append(rng.randrange(100))
                    parents.append(parent)
                    q.append(p)
            main.append(new[0])
            level_nodes = new
        tip = -1
        for depth in range(4):
            children = [i for i, p in enumerate(parents) if p == tip]
            r = rng.random()
            if r < 0.5:
                tip = children[0]
                path.append(tip)
            else:
                if r < 0.7:
                    path.append(children[1])
                break
        rows.append({"prompt": f"{['humaneval', 'gsm8k', 'mtbench', 'summarization'][s % 4]}/{s % 24}",
                     "tokens": tokens, "parents": parents, "q": q, "main": main, "path": path,
                     "forwards": 4, "draft_s": 0.024})
    return rows


def test_the_analysis_puts_the_oracle_tree_on_top_and_best_nodes_above_all_nodes(tmp_path, capsys):
    module = replay()
    (tmp_path / "steps.json").write_text(json.dumps(steps()))
    verify = [0.05 + 0.004 * k for k in range(17)]
    (tmp_path / "costs.json").write_text(json.dumps({"verify_s": verify, "tree_k": list(range(2, 34)),
                                                     "tree_verify_s": [0.05 + 0.004 * k for k in range(1, 33)],
                                                     "draft_token_s": 0.005, "step_s": 0.0}))
    assert module.main(["analyse", str(tmp_path / "steps.json"), str(tmp_path / "costs.json")]) == 0
    out = capsys.readouterr().out
    overall = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.{36}) +[\d.]+ .* ([\d.]+)×$", out, re.M)}
    assert overall["oracle tree (4 levels)"] == max(overall.values())
    assert overall["oracle chain (γ ≤ 4)"] > max(overall[f"chain γ={g}"] for g in (1, 2, 3, 4))
    assert overall["topk 8, 4 levels, best 8"] > overall["topk 8, 4 levels, all nodes"]

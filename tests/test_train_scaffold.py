"""pacer_train, the training scaffold of ``pacer distill`` and ``pacer train-preverify``: the recipe
guard's rule, atomic checkpoints (a crash mid-write keeps the previous one), resume (step count and
learning-rate schedule continue), Ctrl-C/SIGTERM (the step finishes, the checkpoint is saved, the
command exits 130), safe loading (a crafted pickle runs nothing; a damaged file is one line), and the
out-folder checks."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import attrs
import pytest
import torch

from pacer_core.errors import InputError
from pacer_train import (
    TrainingRun,
    atomic_save,
    check_out_dir,
    cosine_lr,
    count_parameters,
    guard_recipe,
    load_run_file,
    open_run,
    recipe_difference,
    training_command,
)

from helpers import Planted, bad_out_folders


# -- the learning-rate schedule ---------------------------------------------------------------------
@pytest.mark.parametrize("floor", [0.1, 0.05])
def test_cosine_lr_warms_up_then_decays_to_its_floor(floor):
    base, total, warmup = 2e-3, 100, 10
    assert cosine_lr(0, total, warmup, base, floor) == pytest.approx(base / warmup)
    assert cosine_lr(warmup - 1, total, warmup, base, floor) == pytest.approx(base)
    assert cosine_lr(warmup, total, warmup, base, floor) == pytest.approx(base)
    assert cosine_lr(total, total, warmup, base, floor) == pytest.approx(floor * base)
    assert cosine_lr(10 * total, total, warmup, base, floor) == pytest.approx(floor * base)
    values = [cosine_lr(s, total, warmup, base, floor) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_cosine_lr_equals_the_trainers_former_schedules():
    """distill decayed to 0.1 (math.cos), train-preverify to 0.05: the shared one gives the same floats."""
    for step in range(0, 400, 7):
        progress = (step - 20) / max(1, 300 - 20)
        distill = (
            1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
            if step >= 20
            else 1e-3 * (step + 1) / 20
        )
        preverify = (
            2e-3 * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
            if step >= 20
            else 2e-3 * (step + 1) / 20
        )
        assert cosine_lr(step, 300, 20, 1e-3, 0.1) == distill
        assert cosine_lr(step, 300, 20, 2e-3, 0.05) == preverify


def test_count_parameters():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    net[0].weight.requires_grad_(False)
    assert count_parameters(net) == 3 * 4 + 4 + 4 * 2 + 2
    assert count_parameters(net, trainable_only=True) == 4 + 4 * 2 + 2


# -- the recipe guard -------------------------------------------------------------------------------
@attrs.define
class Data:
    size: int = 10
    files: List[str] = attrs.field(factory=list)


@attrs.define
class Extra:
    on: bool = False


@attrs.define
class Recipe:
    data: Data = attrs.field(factory=Data)
    extra: Extra = attrs.field(factory=Extra)
    drafter: Dict[str, Any] = attrs.field(factory=lambda: {"name": "eagle"})
    draft: Optional[Data] = None
    seed: int = 0
    lr: float = 1e-3


KEYS = ("data", "extra", "drafter", "draft", "seed")


def stored(tmp_path, recipe: dict) -> Path:
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    return tmp_path


def test_recorded_options_must_match_and_free_options_may_change(tmp_path):
    guard_recipe(tmp_path, Recipe(), KEYS, "lr")
    guard_recipe(tmp_path, Recipe(lr=5.0), KEYS, "lr")  # not a data key
    assert json.loads((tmp_path / "recipe.json").read_text())["lr"] == 5.0  # the latest recipe is stored
    for changed, name in [
        (Recipe(seed=1), "seed"),
        (Recipe(data=Data(size=11)), "data.size"),
        (Recipe(drafter={"name": "eagle", "path": "x"}), "drafter"),
        (Recipe(draft=Data()), "draft"),
    ]:
        with pytest.raises(InputError) as info:
            guard_recipe(tmp_path, changed, KEYS, "lr")
        message = str(info.value)
        assert f"made with {name}=" in message and "choose a new out= folder" in message and "\n" not in message
    stored(tmp_path, {**attrs.asdict(Recipe()), "drafter": {"name": "eagle", "path": "x"}})
    with pytest.raises(InputError, match="drafter"):  # a free-form dict is compared whole
        guard_recipe(tmp_path, Recipe(), KEYS, "lr")


def test_options_newer_than_the_folder_must_have_their_default(tmp_path):
    old = attrs.asdict(Recipe())
    del old["data"]["files"], old["extra"], old["seed"]
    stored(tmp_path, old)
    guard_recipe(tmp_path, Recipe(), KEYS, "lr")  # all at their defaults: what the old run did
    for changed in (Recipe(data=Data(files=["a.txt"])), Recipe(extra=Extra(on=True)), Recipe(seed=3)):
        stored(tmp_path, old)
        with pytest.raises(InputError, match=r"not recorded: the option is newer than the run"):
            guard_recipe(tmp_path, changed, KEYS, "lr")
    assert recipe_difference(old, Recipe(extra=Extra(on=True)), KEYS)[:2] == ("extra.on", False)


def test_options_since_removed_are_ignored(tmp_path):
    stored(tmp_path, {**attrs.asdict(Recipe()), "retired": 7, "data": {"size": 10, "files": [], "old": 1}})
    guard_recipe(tmp_path, Recipe(), KEYS, "lr")


def test_a_damaged_recipe_is_one_line(tmp_path):
    (tmp_path / "recipe.json").write_text("{not json")
    with pytest.raises(InputError) as info:
        guard_recipe(tmp_path, Recipe(), KEYS, "lr")
    assert "recipe.json" in str(info.value) and "\n" not in str(info.value)


# -- atomic files and safe loading ------------------------------------------------------------------
def test_a_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    atomic_save(path, {"step": 1, "model": {"w": torch.ones(3)}})
    real_save = torch.save

    def crash(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip")  # a partial write, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        atomic_save(path, {"step": 2, "model": {"w": torch.zeros(3)}})
    monkeypatch.setattr(torch, "save", real_save)
    state = load_run_file(path)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary file left behind


def plant(path: Path, marker: Path, wrap=lambda payload: payload) -> Path:
    torch.save(wrap(Planted(str(marker))), path)
    return path


def test_the_planted_pickle_is_real(tmp_path):
    marker = tmp_path / "marker"
    torch.load(plant(tmp_path / "x.pt", marker), weights_only=False)  # what loading it unsafely would do
    assert marker.exists()


def test_a_crafted_pickle_runs_nothing_and_fails_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    path = plant(tmp_path / "checkpoint.pt", marker, lambda p: {"model": {}, "optimizer": p, "step": 0, "history": []})
    with pytest.raises(InputError) as info:
        load_run_file(path, "checkpoint")
    assert not marker.exists()
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_truncated_file_fails_in_one_line(tmp_path):
    path = tmp_path / "checkpoint.pt"
    atomic_save(path, {"model": {"w": torch.randn(64, 64)}, "step": 3})
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(InputError) as info:
        load_run_file(path, "checkpoint")
    assert "delete it" in str(info.value) and "\n" not in str(info.value)


# -- the out folder ---------------------------------------------------------------------------------
def test_out_folders_that_cannot_hold_a_run_are_refused_in_one_line(tmp_path):
    for folder in bad_out_folders(tmp_path):
        with pytest.raises(InputError) as info:
            check_out_dir(folder)
        assert str(folder) in str(info.value) and "\n" not in str(info.value), folder
    made = check_out_dir(tmp_path / "new" / "out")
    assert made.is_dir() and list(made.iterdir()) == []
    assert check_out_dir(tmp_path / "later" / "export", "export", create=False) == tmp_path / "later" / "export"
    assert not (tmp_path / "later").exists()


def test_open_run_checks_the_folders_then_guards_the_recipe_and_names_the_export(tmp_path):
    run = open_run(tmp_path / "run", Recipe(), KEYS, "lr")
    assert run.out.is_dir() and run.recipe == json.loads((run.out / "recipe.json").read_text())
    assert run.export_dir("draft") == run.out / "draft"
    again = open_run(tmp_path / "run", Recipe(lr=5.0), KEYS, "lr", export=tmp_path / "later" / "export")
    assert again.recipe["lr"] == 5.0 and again.export_dir("draft") == tmp_path / "later" / "export"
    assert not (tmp_path / "later").exists()  # written at the end, by the trainer
    with pytest.raises(InputError, match="made with seed="):
        open_run(tmp_path / "run", Recipe(seed=1), KEYS, "lr")
    (tmp_path / "file").write_text("")
    for out, export in [(tmp_path / "file", None), (tmp_path / "fresh", tmp_path / "file")]:
        with pytest.raises(InputError) as info:
            open_run(out, Recipe(), KEYS, "lr", export=export)
        assert "'" + str(tmp_path / "file") + "'" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "fresh" / "recipe.json").exists()  # refused before the recipe is stored


# -- the training loop ------------------------------------------------------------------------------
def linear_run(
    checkpoint: Path,
    total: int,
    interrupt_at: Optional[int] = None,
    signum=signal.SIGINT,
    deadline: Optional[float] = None,
    extra: Optional[dict] = None,
):
    """A tiny deterministic run: the batch of step s is a function of s alone."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    logs: list[str] = []
    run = TrainingRun(checkpoint, net, optimizer, total, logs.append, extra=extra or {"arch": {"width": 4}})
    lrs: dict[int, float] = {}

    def step_loss(step: int):
        if step == interrupt_at:
            os.kill(os.getpid(), signum)  # arrives while the step runs: it must finish
        lrs[step] = optimizer.param_groups[0]["lr"]
        x = torch.Generator().manual_seed(step)
        inputs = torch.randn(8, 4, generator=x)
        return ((net(inputs).squeeze(-1) - inputs.sum(-1)) ** 2).mean(), {}

    run.finished = run.fit(
        step_loss,
        lambda step: cosine_lr(step, total, 3, 0.1, 0.1),
        checkpoint_every=4,
        record=lambda step, loss, parts: {"step": step, "loss": float(loss.detach())},
        deadline=deadline,
    )
    return run, lrs, logs


def test_a_time_budget_stops_after_a_step_saves_and_the_run_continues(tmp_path):
    whole, _, _ = linear_run(tmp_path / "whole.pt", total=12)
    assert whole.finished
    checkpoint = tmp_path / "budget.pt"
    stopped, lrs, logs = linear_run(checkpoint, total=12, deadline=0.0, extra={"start": {"tokens_before": 7}})
    assert not stopped.finished and sorted(lrs) == [0] and "time budget reached" in logs[-1]
    state = load_run_file(checkpoint)
    assert state["step"] == 1 and [h["step"] for h in state["history"]] == [1]  # recorded at the stop
    resumed, lrs, _ = linear_run(checkpoint, total=12, extra={"start": {"tokens_before": 0}})
    assert resumed.finished and sorted(lrs) == list(range(1, 12))
    assert resumed.extra["start"] == {"tokens_before": 7}  # what the run started from stays
    assert [h["step"] for h in resumed.history] == [1, 4, 8, 12]
    for a, b in zip(resumed.net.parameters(), whole.net.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_saves_and_resumes_where_it_stopped(tmp_path, signum):
    handler = signal.getsignal(signal.SIGINT)  # the default, or SIG_IGN when started in the background
    whole, whole_lrs, _ = linear_run(tmp_path / "whole.pt", total=12)
    checkpoint = tmp_path / "resumed.pt"
    with pytest.raises(KeyboardInterrupt):
        linear_run(checkpoint, total=12, interrupt_at=5, signum=signum)
    state = load_run_file(checkpoint)
    assert state["step"] == 6 and state["arch"] == {"width": 4}  # step 5 finished (6 done), then saved
    assert [h["step"] for h in state["history"]] == [4]
    resumed, lrs, logs = linear_run(checkpoint, total=12)
    assert "resuming at step 6/12" in logs[0] and min(lrs) == 6 and sorted(lrs) == list(range(6, 12))
    assert all(lrs[s] == whole_lrs[s] for s in lrs)  # the schedule continues
    assert resumed.history == whole.history and resumed.step == whole.step == 12
    for a, b in zip(resumed.net.parameters(), whole.net.parameters()):
        assert torch.equal(a, b)
    assert signal.getsignal(signal.SIGINT) is handler  # handlers restored


def test_a_checkpoint_of_another_shape_is_refused_in_one_line(tmp_path):
    linear_run(tmp_path / "c.pt", total=4)
    net = torch.nn.Linear(5, 1)
    with pytest.raises(InputError) as info:
        TrainingRun(tmp_path / "c.pt", net, torch.optim.AdamW(net.parameters()), 4, print)
    assert "another model shape" in str(info.value) and "\n" not in str(info.value)


def test_a_training_command_interrupted_exits_130(tmp_path, request, capsys):
    from pacer_core import cli
    from pacer_core.schema import load_schema

    @attrs.define
    class Toy:
        out: str = str(tmp_path / "run")
        total: int = 12

    def run(cfg: Toy, command_line: str) -> Path:
        out = check_out_dir(cfg.out)
        linear_run(out / "checkpoint.pt", cfg.total, interrupt_at=2)
        return out

    registry = sys.modules[training_command.__globals__["command"].__module__].COMMANDS
    request.addfinalizer(lambda: registry.pop("toy-train", None))
    training_command("toy-train", "a toy", lambda path, overrides: load_schema(Toy, path, overrides, "toy"), run)
    assert cli.main(["toy-train", "total=8"]) == 130
    assert load_run_file(tmp_path / "run" / "checkpoint.pt")["step"] == 3
    assert "interrupted" in capsys.readouterr().err
    assert cli.main(["toy-train", f"out={tmp_path / 'run' / 'checkpoint.pt'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pacer: error: out '") and "is a file, not a folder" in err and len(err.splitlines()) == 1

"""Run folders of ``pacer distill`` and ``pacer train-preverify`` are read safely: a crafted pickle
planted as a checkpoint, a corpus or a simulated item runs nothing (the marker file it would create
stays absent) and the command fails in one line with exit code 2; so does a truncated ``.pt``; an
``out=`` that is a file, lies under a file, is /dev/null or cannot be written is refused in one line
with exit code 2 before any model is loaded. The models are tiny stand-ins for the real loaders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pacer_core.hf as hf
from pacer_core import cli

from helpers import Planted, adapter, bad_out_folders, noisy_copy, one_line_error, tiny_llama


@pytest.fixture
def no_models(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the out folder was checked")

    monkeypatch.setattr(hf, "load_section", refuse)
    monkeypatch.setattr(hf, "load_draft", refuse)


@pytest.mark.parametrize("command", ["distill", "train-preverify"])
def test_unusable_out_folders_are_refused_before_models_load(command, tmp_path, capsys, no_models):
    for folder in bad_out_folders(tmp_path):
        err = one_line_error(capsys, [command, f"out={folder}"])
        assert f"out '{folder}'" in err
    a_file = tmp_path / "a-file"
    err = one_line_error(capsys, [command, f"out={tmp_path / 'run'}", f"export={a_file}"])
    assert "export" in err and "is a file" in err


# -- train-preverify ----------------------------------------------------------------------------------
PREVERIFY = [
    "drafter={name: draft_model}",
    "verifier={name: greedy}",
    "data.window=6",
    "data.max_new_tokens=12",
    "model.width=16",
    "model.heads=2",
    "model.ffn_size=32",
    "model.max_positions=8",
    "train.pack_len=24",
    "train.batch_size=4",
    "train.epochs=1",
    "train.threads=1",
]


@pytest.fixture
def tiny_pair(monkeypatch, tmp_path):
    target = tiny_llama(0, scale=6.0)
    draft = noisy_copy(target)
    monkeypatch.setattr(hf, "load_section", lambda section, role: (adapter(target), None, None))
    monkeypatch.setattr(hf, "load_draft", lambda section, tokenizer: adapter(draft))


def preverify_folder(tmp_path) -> tuple[Path, list[str]]:
    import json

    out = tmp_path / "run"
    (out / "samples").mkdir(parents=True)
    (out / "items.json").write_text(
        json.dumps(
            [
                {"source": "test", "prompt": [5, 9, 13, 5, 9, 21, 7]},
                {"source": "test", "prompt": [1, 2, 3, 4, 5, 6, 7, 8]},
            ]
        )
    )
    return out, ["train-preverify", f"out={out}", f"draft.path={tmp_path / 'draft'}", *PREVERIFY]


def test_train_preverify_refuses_a_crafted_sample_item(tmp_path, capsys, tiny_pair):
    out, argv = preverify_folder(tmp_path)
    marker = tmp_path / "marker"
    torch.save(
        {"hidden": Planted(str(marker)), "labels": [], "confidence": [], "lengths": [], "item": 0},
        out / "samples" / "item_00000.pt",
    )
    err = one_line_error(capsys, argv)
    assert not marker.exists()
    assert "item_00000.pt" in err and "cannot be read safely" in err


def test_train_preverify_refuses_a_crafted_or_truncated_checkpoint(tmp_path, capsys, tiny_pair):
    from pacer_plugins.pacer_stop import train as trainer

    out, argv = preverify_folder(tmp_path)
    checkpoint = out / f"checkpoint-{trainer.shape_tag(trainer.load_train_config(None, argv[3:]))}.pt"
    marker = tmp_path / "marker"
    torch.save({"model": {}, "optimizer": Planted(str(marker)), "step": 0, "history": []}, checkpoint)
    err = one_line_error(capsys, argv)  # the items are simulated first, then the checkpoint is read
    assert not marker.exists() and checkpoint.name in err
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["item_00000.pt", "item_00001.pt"]
    checkpoint.unlink()
    assert cli.main(argv) == 0  # trains and exports
    capsys.readouterr()
    checkpoint.write_bytes(checkpoint.read_bytes()[:300])
    assert checkpoint.name in one_line_error(capsys, argv)
    sample = out / "samples" / "item_00001.pt"
    sample.write_bytes(sample.read_bytes()[:200])
    assert "item_00001.pt" in one_line_error(capsys, argv)


# -- distill ------------------------------------------------------------------------------------------
DISTILL = [
    "corpus.heldout_sequences=2",
    "student.intermediate_size=64",
    "train.epochs=1",
    "train.batch_size=4",
    "train.threads=1",
]


@pytest.fixture
def tiny_target(monkeypatch):
    target = adapter(tiny_llama(0, hidden=32))
    monkeypatch.setattr(hf, "load_section", lambda section, role: (target, None, "digest"))
    monkeypatch.setattr(hf, "materialize", lambda path: Path("/nonexistent"))
    return target


def distill_folder(tmp_path) -> tuple[Path, list[str]]:
    out = tmp_path / "run"
    out.mkdir()
    torch.manual_seed(0)
    torch.save(
        {
            "tokens": torch.randint(3, 64, (18, 16)),
            "sources": {"stdlib": 0, "docs": 0, "chat": 0, "extra": 0},
            "instructions": 0,
            "sources_used": {"seed": 0, "stdlib": [], "docs": [], "instructions": [], "extra": []},
        },
        out / "corpus.pt",
    )
    return out, ["distill", f"out={out}", *DISTILL]


def test_distill_refuses_a_crafted_corpus_or_checkpoint(tmp_path, capsys, tiny_target):
    out, argv = distill_folder(tmp_path)
    good = (out / "corpus.pt").read_bytes()
    marker = tmp_path / "marker"
    torch.save({"tokens": Planted(str(marker)), "sources": {}}, out / "corpus.pt")
    assert "corpus.pt" in one_line_error(capsys, argv) and not marker.exists()
    (out / "corpus.pt").write_bytes(good)
    torch.save({"model": Planted(str(marker)), "optimizer": {}, "step": 0, "history": []}, out / "checkpoint.pt")
    assert "checkpoint.pt" in one_line_error(capsys, argv) and not marker.exists()
    (out / "checkpoint.pt").unlink()
    assert cli.main(argv) == 0 and (out / "draft" / "manifest.json").exists()
    capsys.readouterr()
    (out / "checkpoint.pt").write_bytes((out / "checkpoint.pt").read_bytes()[:400])
    assert "checkpoint.pt" in one_line_error(capsys, argv)
    (out / "corpus.pt").write_bytes(good[:100])
    assert "corpus.pt" in one_line_error(capsys, argv)

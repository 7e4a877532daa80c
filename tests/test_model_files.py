"""Model files on disk, through ``pacer generate``: a folder without weights, truncated safetensors
(token draft, feature draft, PACER checkpoint), a ``.bin`` that does not unpickle as plain tensors —
each is one line on stderr with exit code 2 — and the completed-draft cache, keyed on every file of
the draft folder. Tiny seeded models and a word-level tokenizer are written to tmp_path."""

from __future__ import annotations

import fractions
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from pacer_core import cli
from pacer_core.hf import HFModel, materialize, weights_digest
from pacer_train.students import save_student, student_from_target

from helpers import VOCAB, assert_one_line_error, tiny_llama

PROMPT = "w5 w7 w9 w7 w9 w7"


def save_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="w0", pad_token="w0", bos_token="w1", eos_token="w2"
    ).save_pretrained(folder)


def save_model(folder, seed):
    tiny_llama(seed).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


@pytest.fixture
def target_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    return save_model(tmp_path / "target", 0)


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def generate(capsys, target, *overrides):
    code = cli.main(["generate", "-p", PROMPT, "-n", "6", "--json", f"target.path={target}", *overrides])
    out, err = capsys.readouterr()
    return code, out, err


def shared_draft(target_folder, folder):
    """A token-level draft stored without the embeddings it shares with ``target_folder``."""
    student = student_from_target(HFModel(tiny_llama(0)), [1])
    save_student(
        student, folder, target_path=str(target_folder), target_digest=weights_digest(target_folder), dtype="float32"
    )
    save_tokenizer(folder)
    return folder


def test_the_tiny_folders_generate(target_folder, tmp_path, capsys):
    code, out, err = generate(capsys, target_folder)
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 6
    draft = shared_draft(target_folder, tmp_path / "draft")
    code, out, err = generate(capsys, target_folder, "strategy.drafter.name=draft_model", f"draft.path={draft}")
    assert code == 0, err
    assert json.loads(out)["metrics"]["draft_forwards"] > 0


# -- a folder without weights ------------------------------------------------------------------
def test_a_target_folder_with_a_config_but_no_weights(target_folder, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(target_folder / "config.json", bare / "config.json")
    code, _, err = generate(capsys, bare)
    assert_one_line_error(code, err, f"'{bare}'", "no weights", "copy the model's weights files into it")


# -- truncated safetensors ---------------------------------------------------------------------
def test_a_truncated_target(target_folder, capsys):
    truncate(target_folder / "model.safetensors")
    code, _, err = generate(capsys, target_folder)
    assert_one_line_error(code, err, str(target_folder / "model.safetensors"), "truncated or corrupt")


@pytest.mark.parametrize("kind", ["shared", "plain"])
def test_a_truncated_token_draft(target_folder, tmp_path, capsys, kind):
    folder = tmp_path / "draft"
    if kind == "shared":
        shared_draft(target_folder, folder)
    else:
        save_model(folder, 1)
    truncate(folder / "model.safetensors")
    code, _, err = generate(capsys, target_folder, "strategy.drafter.name=draft_model", f"draft.path={folder}")
    assert_one_line_error(code, err, str(folder / "model.safetensors"), "truncated or corrupt")


def eagle_draft(target_folder, folder):
    from helpers import make_draft

    return make_draft(tiny_llama(0), folder, digest=weights_digest(target_folder))


def test_a_truncated_eagle_draft(target_folder, tmp_path, capsys):
    folder = eagle_draft(target_folder, tmp_path / "eagle")
    code, _, err = generate(capsys, target_folder, f"strategy.drafter={{name: eagle, path: '{folder}'}}")
    assert code == 0, err
    truncate(folder / "draft.safetensors")
    code, _, err = generate(capsys, target_folder, f"strategy.drafter={{name: eagle, path: '{folder}'}}")
    assert_one_line_error(code, err, str(folder / "draft.safetensors"), "truncated or corrupt", "pacer distill")


def test_an_eagle_draft_without_its_weights_file(target_folder, tmp_path, capsys):
    folder = eagle_draft(target_folder, tmp_path / "eagle")
    (folder / "draft.safetensors").unlink()
    code, _, err = generate(capsys, target_folder, f"strategy.drafter={{name: eagle, path: '{folder}'}}")
    assert_one_line_error(code, err, str(folder / "draft.safetensors"), "does not exist", "pacer distill")


def test_a_truncated_pacer_checkpoint(target_folder, tmp_path, capsys):
    from helpers import write_checkpoint

    eagle = eagle_draft(target_folder, tmp_path / "eagle")
    checkpoint = write_checkpoint(tmp_path / "mb", 32)
    stack = [
        f"strategy.drafter={{name: eagle, path: '{eagle}'}}",
        f"strategy.stop=[{{name: pacer, checkpoint: '{checkpoint}'}}]",
    ]
    code, _, err = generate(capsys, target_folder, *stack)
    assert code == 0, err
    truncate(checkpoint / "preverify.safetensors")
    code, _, err = generate(capsys, target_folder, *stack)
    assert_one_line_error(
        code, err, str(checkpoint / "preverify.safetensors"), "truncated or corrupt", "pacer train-preverify"
    )


# -- pytorch_model.bin ---------------------------------------------------------------------------
def bin_folder(target_folder, folder, state):
    folder.mkdir()
    for item in target_folder.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, folder / item.name)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_a_bin_target_loads_and_equals_the_safetensors_one(target_folder, tmp_path, capsys):
    folder = bin_folder(target_folder, tmp_path / "bin", tiny_llama(0).state_dict())
    code, out, err = generate(capsys, folder)
    assert code == 0, err
    code, reference, err = generate(capsys, target_folder)
    assert json.loads(out)["tokens"] == json.loads(reference)["tokens"]


@pytest.mark.parametrize("content", ["garbage", "truncated", "not-tensors"])
def test_a_bin_that_does_not_unpickle(target_folder, tmp_path, capsys, content):
    if content == "not-tensors":  # unpickling it would run more than tensor code: weights_only refuses
        folder = bin_folder(target_folder, tmp_path / "bin", {"weight": fractions.Fraction(1, 3)})
    else:
        folder = bin_folder(target_folder, tmp_path / "bin", tiny_llama(0).state_dict())
        if content == "garbage":
            (folder / "pytorch_model.bin").write_bytes(b"not a pickle at all\n" * 8)
        else:
            truncate(folder / "pytorch_model.bin")
    code, _, err = generate(capsys, folder)
    assert_one_line_error(code, err, str(folder / "pytorch_model.bin"), "cannot be loaded as PyTorch weights")


# -- the completed-draft cache -------------------------------------------------------------------
def test_the_completed_draft_is_remade_when_any_file_of_the_draft_changes(target_folder, tmp_path):
    folder = shared_draft(target_folder, tmp_path / "draft")
    first = materialize(str(folder))
    assert materialize(str(folder)) == first  # completed once
    for name, edit in (
        ("config.json", lambda c: {**c, "pacer_note": 1}),
        ("tokenizer_config.json", lambda c: {**c, "model_max_length": 77}),
        ("pacer-vocab-subset.json", lambda c: [3, 4, 5]),
    ):
        path = folder / name
        before = json.loads(path.read_text()) if path.exists() else None
        path.write_text(json.dumps(edit(before) if before is not None else edit({})))
        again = materialize(str(folder))
        assert again != first and again.parent == first.parent, name
        assert (again / name).read_text() == path.read_text(), f"stale {name} in the cached copy"
        first = again
    assert json.loads((first / "tokenizer_config.json").read_text())["model_max_length"] == 77


# -- folders transformers cannot load as a causal LM, and damaged JSON files --------------------
def test_a_target_folder_without_tokenizer_files(target_folder, tmp_path, capsys):
    bare = tmp_path / "no-tokenizer"
    tiny_llama(0).save_pretrained(bare)
    capsys.readouterr()  # the save's progress bar
    code, _, err = generate(capsys, bare)
    assert_one_line_error(code, err, f"'{bare}'", "no tokenizer files", "copy the model's tokenizer files")
    (bare / "tokenizer.json").write_text("{not json")  # present but unreadable
    code, _, err = generate(capsys, bare)
    assert_one_line_error(code, err, f"'{bare}'", "tokenizer cannot be loaded")


def test_a_model_type_that_needs_remote_code(target_folder, capsys):
    config = json.loads((target_folder / "config.json").read_text())
    config.update(model_type="fancy_custom", auto_map={"AutoModelForCausalLM": "modeling_fancy.FancyForCausalLM"})
    (target_folder / "config.json").write_text(json.dumps(config))
    code, _, err = generate(capsys, target_folder)
    assert_one_line_error(
        code, err, "'fancy_custom'", "auto_map", "never runs a model's own code", "convert the weights"
    )
    del config["auto_map"]
    (target_folder / "config.json").write_text(json.dumps(config))
    code, _, err = generate(capsys, target_folder)
    assert_one_line_error(code, err, "'fancy_custom' is not one transformers")


def test_an_encoder_decoder_target(tmp_path, capsys):
    from transformers import T5Config, T5ForConditionalGeneration

    folder = tmp_path / "t5"
    T5ForConditionalGeneration(
        T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    ).save_pretrained(folder)
    save_tokenizer(folder)
    capsys.readouterr()  # the save's progress bar
    code, _, err = generate(capsys, folder)
    assert_one_line_error(
        code, err, "a t5 model, an encoder-decoder model", "causal (decoder-only) language models only"
    )


DAMAGES = {"truncated": lambda text: text[: len(text) // 2], "a list": lambda text: "[1, 2]"}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize(
    "kind, name",
    [
        ("plain", "config.json"),
        ("shared", "config.json"),
        ("shared", "pacer-shared.json"),
        ("shared", "pacer-vocab-subset.json"),
    ],
)
def test_damaged_json_of_a_token_draft(target_folder, tmp_path, capsys, kind, name, damage):
    folder = tmp_path / "draft"
    if kind == "shared":
        shared_draft(target_folder, folder)
        (folder / "pacer-vocab-subset.json").write_text(json.dumps(list(range(40))))
    else:
        save_model(folder, 1)
    path = folder / name
    path.write_text(
        DAMAGES[damage](path.read_text())
        if not (damage == "a list" and name.endswith("subset.json"))
        else '{"ids": [1]}'
    )
    code, _, err = generate(capsys, target_folder, "strategy.drafter.name=draft_model", f"draft.path={folder}")
    assert_one_line_error(code, err, f"'{path}'", "damaged")


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
def test_damaged_json_of_an_eagle_draft(target_folder, tmp_path, capsys, name, damage):
    folder = eagle_draft(target_folder, tmp_path / "eagle")
    path = folder / name
    path.write_text(DAMAGES[damage](path.read_text()))
    code, _, err = generate(capsys, target_folder, f"strategy.drafter={{name: eagle, path: '{folder}'}}")
    assert_one_line_error(code, err, f"'{path}'", "damaged", "pacer distill")


def test_an_eagle_draft_config_with_options_of_another_draft(target_folder, tmp_path, capsys):
    folder = eagle_draft(target_folder, tmp_path / "eagle")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "colour": "red"}))
    code, _, err = generate(capsys, target_folder, f"strategy.drafter={{name: eagle, path: '{folder}'}}")
    assert_one_line_error(code, err, f"'{folder / 'config.json'}'", "colour", "damaged")


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
def test_damaged_json_of_a_pacer_checkpoint(target_folder, tmp_path, capsys, name, damage):
    from helpers import write_checkpoint

    eagle = eagle_draft(target_folder, tmp_path / "eagle")
    checkpoint = write_checkpoint(tmp_path / "mb", 32)
    path = checkpoint / name
    path.write_text(DAMAGES[damage](path.read_text()))
    code, _, err = generate(
        capsys,
        target_folder,
        f"strategy.drafter={{name: eagle, path: '{eagle}'}}",
        f"strategy.stop=[{{name: pacer, checkpoint: '{checkpoint}'}}]",
    )
    assert_one_line_error(code, err, f"'{path}'", "damaged", "pacer train-preverify")


def _documented_model_errors() -> dict[str, str]:
    """docs/config.md's table of model folder errors: input (first cell) -> message (second, in backticks)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    part = text.split("## Model folder and data file errors", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ", 1) for line in part.splitlines() if line.startswith("| ") and "`" in line]
    return {cells[0][2:]: re.search(r"`(.+)` \|$", cells[1]).group(1) for cells in rows}


def test_the_documented_model_folder_errors_are_the_real_messages(target_folder, tmp_path, capsys):
    bare = tmp_path / "bare"
    tiny_llama(0).save_pretrained(bare)
    remote = tmp_path / "remote"
    shutil.copytree(target_folder, remote)
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "model_type": "fancy_custom", "auto_map": {}}))
    from transformers import T5Config, T5ForConditionalGeneration

    t5 = tmp_path / "t5"
    T5ForConditionalGeneration(
        T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    ).save_pretrained(t5)
    save_tokenizer(t5)
    draft = save_model(tmp_path / "draft", 1)
    (draft / "config.json").write_text("{")
    scenarios = {
        "a folder with a config and weights but no tokenizer files": [bare],
        "a `model_type` transformers does not know, with `auto_map` (custom code)": [remote],
        "an encoder-decoder model such as T5": [t5],
        "a damaged `config.json` of a model or token draft": [
            target_folder,
            "strategy.drafter.name=draft_model",
            f"draft.path={draft}",
        ],
    }
    documented = _documented_model_errors()
    assert set(documented) == set(scenarios)
    capsys.readouterr()  # progress bars of the saves
    for name, (target, *overrides) in scenarios.items():
        code, _, err = generate(capsys, target, *overrides)
        assert_one_line_error(code, err)
        pattern = ".*".join(re.escape(part) for part in documented[name].split("…"))
        assert re.fullmatch(pattern, err.strip()[len("pacer: error: ") :]), (name, err)

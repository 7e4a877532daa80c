"""Token-level draft students (``pacer_train.students``): built from target layers, saved without
shared tensors, completed on load; a draft's vocabulary subset gives the full head's logits on its
ids and -inf elsewhere."""

from __future__ import annotations

import json

import pytest
import torch

from pacer_core.errors import InputError
from pacer_core.hf import SHARED_FILE, SUBSET_FILE, HFModel, materialize, weights_digest
from pacer_train.students import save_student, student_from_target

from helpers import adapter, tiny_llama


def _tied_target(tmp_path):
    model = tiny_llama(3, layers=3)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    folder = tmp_path / "target"
    model.save_pretrained(folder)
    return HFModel(model), folder


def test_student_copies_the_chosen_layers(tmp_path):
    target, _ = _tied_target(tmp_path)
    student = student_from_target(target, [0, 2])
    assert student.config.num_hidden_layers == 2
    got = student.base_model.layers[1].mlp.up_proj.weight
    assert torch.equal(got, target.model.base_model.layers[2].mlp.up_proj.weight)
    assert not torch.equal(got, target.model.base_model.layers[1].mlp.up_proj.weight)
    assert torch.equal(student.get_input_embeddings().weight, target.model.get_input_embeddings().weight)


def test_saved_student_omits_shared_tensors_and_loads_complete(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    target, target_folder = _tied_target(tmp_path)
    student = student_from_target(target, [0, 2])
    with torch.no_grad():
        student.base_model.layers[0].mlp.up_proj.weight.add_(0.5)  # "trained"
    folder = tmp_path / "draft"
    save_student(
        student,
        folder,
        target_path=str(target_folder),
        target_digest=weights_digest(target_folder),
        dtype="float32",
        vocab_subset=[5, 3, 9],
    )
    from safetensors.torch import load_file

    stored = load_file(folder / "model.safetensors")
    assert "model.embed_tokens.weight" not in stored and "lm_head.weight" not in stored
    assert json.loads((folder / SUBSET_FILE).read_text()) == [3, 5, 9]
    complete = materialize(str(folder))
    assert complete != folder and (complete / "model.safetensors").exists()
    assert materialize(str(folder)) == complete  # completed once
    draft = HFModel.load(complete)
    ids = torch.tensor([[1, 4, 7]])
    want = student(input_ids=ids).logits
    got = draft.model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_shared_draft_refuses_another_target(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "cache"))
    target, target_folder = _tied_target(tmp_path)
    folder = tmp_path / "draft"
    save_student(
        student_from_target(target, [0]),
        folder,
        target_path=str(target_folder),
        target_digest="0" * 16,
        dtype="float32",
    )
    with pytest.raises(InputError, match="digest"):
        materialize(str(folder))
    assert (folder / SHARED_FILE).exists()


def test_vocab_subset_logits_match_the_full_head():
    model = adapter(tiny_llama(4))
    full = adapter(tiny_llama(4))
    subset = [0, 2, 7, 8, 30, 63]
    model.use_vocab_subset(subset)
    tokens = [1, 5, 9, 11]
    out = model.forward(tokens, logits_from=1, hidden=True)
    ref = full.forward(tokens, logits_from=1, hidden=True)
    assert out.logits.shape == ref.logits.shape
    assert torch.allclose(out.logits[:, subset], ref.logits[:, subset], atol=1e-5)
    outside = torch.ones(model.vocab_size, dtype=torch.bool)
    outside[subset] = False
    assert torch.isinf(out.logits[:, outside]).all()
    assert torch.allclose(out.hidden_states, ref.hidden_states, atol=1e-5)
    assert model.cached_tokens == tokens
    nxt = model.forward([3])  # continues from the cache
    assert torch.allclose(nxt.logits[:, subset], full.forward([3]).logits[:, subset], atol=1e-5)


def test_vocab_subset_rejects_ids_outside_the_vocabulary():
    model = adapter(tiny_llama(4))
    with pytest.raises(InputError, match="subset"):
        model.use_vocab_subset([1, 64])

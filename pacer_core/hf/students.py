"""Training helpers: token-level students built from target layers and saved without the tensors
they share with it, the target's hidden states for a batch, batched greedy answers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from .adapter import DTYPES, HFModel, _quiet_transformers
from .artifacts import SHARED_FILE, SUBSET_FILE


def student_from_target(target: "HFModel", layers: Sequence[int]) -> Any:
    """A small causal LM of the target's architecture: ``layers`` (indices into the target's decoder
    layers) copied in order, with the target's embeddings, final norm and output layer (float32,
    trainable; the caller freezes what it shares)."""
    transformers = _quiet_transformers()
    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    student = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = target.model.base_model
    with torch.no_grad():
        for mine, index in zip(student.base_model.layers, layers):
            mine.load_state_dict({k: v.float() for k, v in source.layers[index].state_dict().items()})
        student.base_model.norm.load_state_dict({k: v.float() for k, v in source.norm.state_dict().items()})
        student.get_input_embeddings().weight.copy_(target.model.get_input_embeddings().weight.float())
        if not getattr(config, "tie_word_embeddings", False):
            student.get_output_embeddings().weight.copy_(target.model.get_output_embeddings().weight.float())
    return student


def save_student(student: Any, folder: Path, *, target_path: Optional[str], target_digest: str,
                 dtype: str = "bfloat16", vocab_subset: Optional[Sequence[int]] = None) -> int:
    """Write ``student`` as an HF folder without the tensors it shares with its target (the input
    embeddings, and the tied output layer): ``pacer-shared.json`` says where to get them, and
    ``materialize`` completes the folder on first load. Returns the bytes written for the weights."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    embed_name = "model.embed_tokens.weight"
    state = {k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in student.state_dict().items()
             if k != embed_name and not (k == "lm_head.weight" and student.config.tie_word_embeddings)}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(student.config)
    config.dtype = dtype
    config.save_pretrained(folder)
    if student.generation_config is not None:
        student.generation_config.save_pretrained(folder)
    (folder / SHARED_FILE).write_text(json.dumps(
        {"target_path": target_path, "target_digest": target_digest,
         "tensors": {embed_name: embed_name}}, indent=2))
    if vocab_subset is not None:
        (folder / SUBSET_FILE).write_text(json.dumps(sorted(int(t) for t in vocab_subset)))
    return (folder / "model.safetensors").stat().st_size


@torch.inference_mode()
def last_hidden_states(target: HFModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The target's last-layer hidden states (after the final norm) for a batch [B, L] → [B, L, d],
    without touching its KV cache (training data for feature-level drafts)."""
    out = target.model.base_model(input_ids=input_ids.to(target.device), use_cache=False)
    return out.last_hidden_state


@torch.inference_mode()
def batch_generate(target: HFModel, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers for several prompts at once (left-padded batch), each cut at its first EOS."""
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p))
        mask[i, width - len(p):] = 1
    out = target.model.generate(ids.to(target.device), attention_mask=mask.to(target.device), do_sample=False,
                                max_new_tokens=max_new_tokens, pad_token_id=pad)
    answers = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in target.eos_token_ids), len(row))
        answers.append(row[:cut])
    return answers

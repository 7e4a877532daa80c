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
def layer_inputs(target: HFModel, input_ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """The inputs of the target's decoder ``layers`` for a batch [B, L], concatenated in that order →
    [B, L, len(layers) × d] (index i: transformers' ``hidden_states[i]``, as ``HFModel.forward(hidden=
    layers)`` returns them; what an EAGLE-3-style draft fuses), without touching its KV cache."""
    out = target.model.base_model(input_ids=input_ids.to(target.device), use_cache=False, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1)


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


@torch.inference_mode()
def greedy_batch(target: HFModel, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers (each ending with its EOS token when it reached one) for ``prompts``, one
    batch, dropping the rows that finished (their KV-cache rows too), so short answers do not pay
    for the longest; position ids follow each row's own tokens (self-distillation corpora)."""
    model = target.model
    eos = set(int(t) for t in target.eos_token_ids)
    pad = min(eos) if eos else 0
    count, width = len(prompts), max(len(p) for p in prompts)
    device = target.device
    ids = torch.full((count, width), pad, dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                cache=cache, use_cache=True, logits_to_keep=1)
    following = out.logits[:, -1].argmax(-1).cpu()
    answers: list[list[int]] = [[] for _ in prompts]
    alive = list(range(count))  # rows of the batch → prompt index
    next_pos = mask.sum(-1)  # the position id of each row's next token
    while True:
        keep = []
        for row, (index, token) in enumerate(zip(alive, following.tolist())):
            answers[index].append(token)
            if token not in eos and len(answers[index]) < max_new_tokens:
                keep.append(row)
        if not keep:
            return answers
        if len(keep) < len(alive):
            rows = torch.tensor(keep, dtype=torch.long)
            cache.batch_select_indices(rows.to(device))
            mask, following, next_pos = mask[rows], following[rows], next_pos[rows]
            alive = [alive[r] for r in keep]
        mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long)], dim=1)
        out = model(input_ids=following[:, None].to(device), attention_mask=mask.to(device),
                    position_ids=next_pos[:, None].to(device), cache=cache, use_cache=True)
        next_pos = next_pos + 1
        following = out.logits[:, -1].argmax(-1).cpu()

"""Training helpers: token-level students built from target layers and saved without the tensors
they share with it, the target's hidden states for a batch, batched greedy answers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

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


def last_hidden_states(target: HFModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The target's last-layer hidden states (after the final norm) for a batch [B, L] → [B, L, d],
    without touching its KV cache (training data for feature-level drafts)."""
    return target_states(target, input_ids, [None])[0]


@torch.inference_mode()
def target_states(target: HFModel, input_ids: torch.Tensor, groups: Sequence[Optional[Sequence[int]]]
                  ) -> list[torch.Tensor]:
    """Several kinds of target states from one forward over a batch [B, L]: per group, None = the
    last-layer states after the final norm ([B, L, d], ``last_hidden_states``), else the inputs of
    those decoder layers concatenated ([B, L, len × d], ``layer_inputs``)."""
    fused = any(group is not None for group in groups)
    out = target.model.base_model(input_ids=input_ids.to(target.device), use_cache=False,
                                  output_hidden_states=fused)
    return [out.last_hidden_state if group is None else torch.cat([out.hidden_states[i] for i in group], dim=-1)
            for group in groups]


def layer_inputs(target: HFModel, input_ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """The inputs of the target's decoder ``layers`` for a batch [B, L], concatenated in that order →
    [B, L, len(layers) × d] (index i: transformers' ``hidden_states[i]``, as ``HFModel.forward(hidden=
    layers)`` returns them; what an EAGLE-3-style draft fuses), without touching its KV cache."""
    return target_states(target, input_ids, [layers])[0]


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
def greedy_batch(target: HFModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, rows: Optional[int] = None,
                 on_answer: Optional[Callable[[int, list[int]], None]] = None) -> list[list[int]]:
    """Greedy answers (each ending with its EOS token when it reached one) for ``prompts``, with
    continuous batching: at most ``rows`` prompts run at once (default: all), a row that finishes
    leaves the batch (its KV-cache rows too) and the next prompt, in order, takes its place. Rows are
    left-padded to a common cache width (padding masked out) and position ids follow each row's own
    tokens, so a row computes what it would alone, up to rounding (self-distillation corpora).
    ``on_answer(index, answer)`` is called as each answer completes."""
    model, device = target.model, target.device
    eos = set(int(t) for t in target.eos_token_ids)
    rows = len(prompts) if rows is None else rows
    if rows < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    answers: list[list[int]] = [[] for _ in prompts]
    waiting = list(range(len(prompts)))[::-1]  # popped from the end: prompt order
    batch: Optional[_Batch] = None

    def record(indices: list[int], tokens: torch.Tensor) -> list[int]:
        """Append each row's new token; the rows that go on."""
        going = []
        for row, (index, token) in enumerate(zip(indices, tokens.tolist())):
            answers[index].append(token)
            if token not in eos and len(answers[index]) < max_new_tokens:
                going.append(row)
            elif on_answer is not None:
                on_answer(index, answers[index])
        return going

    while True:
        while waiting and (batch is None or len(batch.alive) < rows):  # fill the free rows
            new = [waiting.pop() for _ in range(min(rows - (len(batch.alive) if batch else 0), len(waiting)))]
            admitted = _Batch.prefill(model, device, [prompts[i] for i in new], new)
            admitted = admitted.select(record(new, admitted.following), device)
            if admitted.alive:
                batch = admitted if batch is None else batch.join(admitted, device)
        if batch is None or not batch.alive:
            return answers
        batch.step(model, device)
        batch = batch.select(record(batch.alive, batch.following), device)
        if not batch.alive:
            batch = None


class _Batch:
    """The running rows of ``greedy_batch``: their prompt indices, KV cache (left-padded to one
    width), attention mask [rows, width], next position ids and pending tokens."""

    def __init__(self, alive: list[int], cache: Any, mask: torch.Tensor, next_pos: torch.Tensor,
                 following: torch.Tensor):
        self.alive, self.cache, self.mask, self.next_pos, self.following = alive, cache, mask, next_pos, following

    @classmethod
    def prefill(cls, model: Any, device: Any, prompts: Sequence[Sequence[int]], indices: list[int]) -> "_Batch":
        from transformers import DynamicCache

        count, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros((count, width), dtype=torch.long)
        mask = torch.zeros((count, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                    cache=cache, use_cache=True, logits_to_keep=1)
        return cls(list(indices), cache, mask, mask.sum(-1), out.logits[:, -1].argmax(-1).cpu())

    def step(self, model: Any, device: Any) -> None:
        """One forward over every row's pending token; ``following`` becomes the next ones."""
        self.mask = torch.cat([self.mask, torch.ones((len(self.alive), 1), dtype=torch.long)], dim=1)
        out = model(input_ids=self.following[:, None].to(device), attention_mask=self.mask.to(device),
                    position_ids=self.next_pos[:, None].to(device), cache=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        self.following = out.logits[:, -1].argmax(-1).cpu()

    def select(self, keep: list[int], device: Any) -> "_Batch":
        """Only the rows ``keep``; cache columns every remaining row pads are dropped."""
        if len(keep) < len(self.alive) and keep:
            rows = torch.tensor(keep, dtype=torch.long)
            self.cache.batch_select_indices(rows.to(device))
            self.mask, self.following, self.next_pos = self.mask[rows], self.following[rows], self.next_pos[rows]
        self.alive = [self.alive[r] for r in keep]
        if keep:
            lead = int(self.mask.any(0).long().argmax())  # the first column some row uses
            if lead > 0:
                self.mask = self.mask[:, lead:]
                for layer in self.cache.layers:
                    layer.keys, layer.values = layer.keys[..., lead:, :], layer.values[..., lead:, :]
        return self

    def join(self, other: "_Batch", device: Any) -> "_Batch":
        """Both batches' rows in one, the narrower left-padded to the wider's cache width."""
        if not other.alive:
            return self
        width = max(self.mask.shape[1], other.mask.shape[1])
        for layer, new in zip(self.cache.layers, other.cache.layers):
            layer.keys = torch.cat([_left_pad(layer.keys, width), _left_pad(new.keys, width)])
            layer.values = torch.cat([_left_pad(layer.values, width), _left_pad(new.values, width)])
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(other.mask, width)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.following = torch.cat([self.following, other.following])
        self.alive = self.alive + other.alive
        return self


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` ([rows, width'] or [rows, heads, width', dim]) with zero columns on the left up to ``width``."""
    dim = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

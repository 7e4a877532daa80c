"""Batched greedy answers from the target: ``greedy_batch`` (continuous batching: finished rows
leave, waiting prompts join) and ``batch_generate`` (transformers' ``generate`` on a left-padded
batch). What corpus-making and draft evaluation generate with; kept in the adapter, the one package
that touches transformers' cache."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from .adapter import HFModel, cache_keyword


@torch.inference_mode()
def batch_generate(target: HFModel, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers for several prompts at once (left-padded batch), each cut at its first EOS."""
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        mask[i, width - len(p) :] = 1
    out = target.model.generate(
        ids.to(target.device),
        attention_mask=mask.to(target.device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
    )
    answers = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in target.eos_token_ids), len(row))
        answers.append(row[:cut])
    return answers


@torch.inference_mode()
def greedy_batch(
    target: HFModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    rows: Optional[int] = None,
    on_answer: Optional[Callable[[int, list[int]], None]] = None,
) -> list[list[int]]:
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

    def __init__(
        self, alive: list[int], cache: Any, mask: torch.Tensor, next_pos: torch.Tensor, following: torch.Tensor
    ):
        self.alive, self.cache, self.mask, self.next_pos, self.following = alive, cache, mask, next_pos, following

    @classmethod
    def prefill(cls, model: Any, device: Any, prompts: Sequence[Sequence[int]], indices: list[int]) -> "_Batch":
        from transformers import DynamicCache

        count, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros((count, width), dtype=torch.long)
        mask = torch.zeros((count, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            **{cache_keyword(model): cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return cls(list(indices), cache, mask, mask.sum(-1), out.logits[:, -1].argmax(-1).cpu())

    def step(self, model: Any, device: Any) -> None:
        """One forward over every row's pending token; ``following`` becomes the next ones."""
        self.mask = torch.cat([self.mask, torch.ones((len(self.alive), 1), dtype=torch.long)], dim=1)
        out = model(
            input_ids=self.following[:, None].to(device),
            attention_mask=self.mask.to(device),
            position_ids=self.next_pos[:, None].to(device),
            **{cache_keyword(model): self.cache},
            use_cache=True,
        )
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

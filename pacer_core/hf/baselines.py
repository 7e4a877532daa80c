"""transformers' own ``generate`` on an adapter's model: the exactness reference and the external
baseline of the benchmarks, optionally traced step by step."""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Optional, Sequence

import torch

from .adapter import HFModel


@torch.inference_mode()
def hf_generate(
    target: HFModel,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    ignore_eos: bool = False,
    assistant: Optional[HFModel] = None,
    **generate_kwargs: Any,
) -> list[int]:
    """transformers' own ``generate`` on the adapter's model (greedy unless told otherwise): the
    reference for exactness and the external baseline in benchmarks. ``assistant`` turns on its
    assisted generation; ``prompt_lookup_num_tokens=...`` its prompt lookup."""
    input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=target.device)
    kwargs: dict[str, Any] = {
        "do_sample": False,
        "max_new_tokens": max_new_tokens,
        "attention_mask": torch.ones_like(input_ids),
    }
    eos = sorted(target.eos_token_ids)
    kwargs["pad_token_id"] = eos[0] if eos else 0
    if ignore_eos:
        kwargs["eos_token_id"] = None
        kwargs["min_new_tokens"] = max_new_tokens
    if assistant is not None:
        kwargs["assistant_model"] = assistant.model
    kwargs.update(generate_kwargs)
    out = target.model.generate(input_ids, **kwargs)
    return out[0, input_ids.shape[1] :].tolist()


class _GenerateTrace:
    """Watches one ``generate`` call: a streamer (``put``/``end``) receiving the tokens each step
    emits, and forward hooks counting and timing the target's and the assistant's forwards.

    Step i's drafted count is read from the target's i-th forward: it is fed the committed tokens
    not yet in its cache plus the candidates, so drafted = cache length + fed − committed.
    """

    def __init__(self, prompt_length: int, clock: Callable[[], float]):
        self.clock = clock
        self.committed = prompt_length
        self.seen_prompt = False
        self.accept_lengths: list[int] = []  # emitted tokens per step
        self.drafted_per_step: list[int] = []
        self.target_forwards = self.draft_forwards = 0
        self.verify_s = 0.0
        self._t0 = 0.0

    # streamer protocol
    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:  # generate streams the prompt first
            self.seen_prompt = True
            return
        emitted = int(value.numel())
        self.accept_lengths.append(emitted)
        self.committed += emitted

    def end(self) -> None:
        pass

    # hooks
    def target_pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        fed = int(ids.shape[-1]) if ids is not None else 0
        self.drafted_per_step.append(max(0, past + fed - self.committed))
        self._t0 = self.clock()

    def target_post(self, module, args, output) -> None:
        self.verify_s += self.clock() - self._t0
        self.target_forwards += 1

    def draft_pre(self, module, args) -> None:
        self.draft_forwards += 1


@torch.inference_mode()
def hf_generate_traced(
    target: HFModel,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    ignore_eos: bool = False,
    assistant: Optional[HFModel] = None,
    assistant_settings: Optional[dict[str, Any]] = None,
    clock: Callable[[], float] = time.perf_counter,
    **generate_kwargs: Any,
) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    """``hf_generate`` with a per-step trace, for benchmarks: (tokens, trace, assistant settings after).

    ``assistant_settings`` (e.g. ``num_assistant_tokens``, ``num_assistant_tokens_schedule``,
    ``assistant_confidence_threshold``) are set on the assistant's generation config for this call
    only; their values after the call (transformers' heuristic schedule updates
    ``num_assistant_tokens``) are returned so a caller can carry them to the next prompt. The trace
    holds ``accept_lengths`` (emitted tokens per step), ``drafted_per_step``, ``target_forwards``,
    ``draft_forwards``, ``verify_s`` (time inside target forwards) and ``wall_s``. ``clock`` times the
    whole call and should synchronise CUDA on a GPU; the forwards are timed on the host clock, which
    adds no sync of its own to ``generate`` (on a GPU ``verify_s`` is then the host's share).
    """
    trace = _GenerateTrace(len(prompt), time.perf_counter)
    handles = [
        target.model.register_forward_pre_hook(trace.target_pre, with_kwargs=True),
        target.model.register_forward_hook(trace.target_post),
    ]
    saved = None
    if assistant is not None:
        handles.append(assistant.model.register_forward_pre_hook(trace.draft_pre))
        if assistant_settings:
            saved = copy.deepcopy(assistant.model.generation_config)
            for key, value in assistant_settings.items():
                setattr(assistant.model.generation_config, key, value)
    after: dict[str, Any] = {}
    try:
        start = clock()
        tokens = hf_generate(
            target,
            prompt,
            max_new_tokens,
            ignore_eos=ignore_eos,
            assistant=assistant,
            streamer=trace,
            **generate_kwargs,
        )
        wall = clock() - start
        if saved is not None and assistant is not None and assistant_settings:  # saved: both given
            after = {key: getattr(assistant.model.generation_config, key) for key in assistant_settings}
    finally:
        for handle in handles:
            handle.remove()
        if saved is not None and assistant is not None:
            assistant.model.generation_config = saved
    drafted = trace.drafted_per_step
    if len(drafted) != len(trace.accept_lengths):  # forwards and steps out of step: no per-step drafts
        drafted = [0] * len(trace.accept_lengths)
    return (
        tokens,
        {
            "accept_lengths": trace.accept_lengths,
            "drafted_per_step": drafted,
            "target_forwards": trace.target_forwards,
            "draft_forwards": trace.draft_forwards,
            "verify_s": trace.verify_s,
            "wall_s": wall,
        },
        after,
    )

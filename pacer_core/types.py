"""Value objects passed between the engine and plugins.

Tensors are excluded from equality and shown by shape in ``repr``. Shapes are noted as
``# [n, vocab]`` comments; ``n`` is the number of draft tokens, ``vocab`` the model vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Optional, Protocol, Sequence, runtime_checkable

import attrs
import torch

__all__ = [
    "AttentionShape",
    "Component",
    "Draft",
    "DraftBlock",
    "FeatureModel",
    "GenerationResult",
    "LanguageModel",
    "ModelOutput",
    "Resources",
    "SamplingParams",
    "StepRecord",
    "Stop",
    "Verdict",
]


def _shape_repr(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}"
    if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
        return "(" + ", ".join(f"Tensor{tuple(v.shape)}" for v in value) + ")"
    return repr(value)


def tensor_field(**kwargs: Any) -> Any:
    """An attrs field holding a tensor: excluded from equality, shown by shape."""
    return attrs.field(eq=False, repr=_shape_repr, **kwargs)


@attrs.frozen
class SamplingParams:
    """How tokens are chosen. ``temperature == 0`` means greedy decoding.

    ``top_k == 0`` and ``top_p == 1.0`` disable those filters. The same parameters apply to the
    target's and the draft's distributions, as lossless speculative sampling requires.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@attrs.frozen
class DraftBlock:
    """Tokens one ``pacer_propose`` call adds to the current draft.

    ``draft_probs`` is the distribution each token was sampled from (after temperature, top-k and
    top-p), or None for drafters without probabilities (n-gram, phrase pool): the verifier then
    treats each token as drawn from a point mass. ``hidden_states`` are the draft model's last-layer
    hidden states that produced each token (PACER reads them), or None. ``forwards`` counts the
    draft-model forward passes the block cost (0 for model-free drafters). ``branches`` are candidate
    token chains that continue *after* the whole draft (Ouroboros' candidate suffixes); the target
    scores them in the same forward, and a greedy verifier may accept the longest matching one when
    every draft token is accepted.
    """

    tokens: torch.Tensor = tensor_field()  # [n] int64
    draft_probs: Optional[torch.Tensor] = tensor_field(default=None)  # [n, vocab]
    hidden_states: Optional[torch.Tensor] = tensor_field(default=None)  # [n, hidden]
    branches: tuple[torch.Tensor, ...] = tensor_field(default=())  # each [m_i] int64
    forwards: int = 0  # draft-model forwards spent on this block (reported in metrics)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _cat(parts: Sequence[Optional[torch.Tensor]], what: str) -> Optional[torch.Tensor]:
    present = [p is not None for p in parts]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"draft blocks disagree on whether they carry {what}")
    return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=0)  # type: ignore[arg-type]


@attrs.frozen
class Draft:
    """The draft of the current step: the blocks proposed so far.

    ``tokens``, ``draft_probs`` and ``hidden_states`` are the blocks' rows concatenated (computed
    once per draft, on first use); a stop policy that looks only at the latest block should read
    ``draft.blocks[-1]`` (or slice with ``draft.last_block``), which costs nothing.
    ``block_starts`` holds the index of each block's first token. ``branches`` are those of the
    latest block (they continue the whole draft); truncating the draft drops them.
    """

    blocks: tuple[DraftBlock, ...] = ()

    def __len__(self) -> int:
        return sum(len(b) for b in self.blocks)

    @functools.cached_property
    def tokens(self) -> torch.Tensor:  # [n] int64
        if not self.blocks:
            return torch.empty(0, dtype=torch.long)
        return _cat([b.tokens for b in self.blocks], "tokens")

    @functools.cached_property
    def draft_probs(self) -> Optional[torch.Tensor]:  # [n, vocab]
        return _cat([b.draft_probs for b in self.blocks], "draft_probs")

    @functools.cached_property
    def hidden_states(self) -> Optional[torch.Tensor]:  # [n, hidden]
        return _cat([b.hidden_states for b in self.blocks], "hidden_states")

    @property
    def branches(self) -> tuple[torch.Tensor, ...]:
        return self.blocks[-1].branches if self.blocks else ()

    @property
    def block_starts(self) -> tuple[int, ...]:
        starts, total = [], 0
        for block in self.blocks:
            starts.append(total)
            total += len(block)
        return tuple(starts)

    @property
    def forwards(self) -> int:
        """Draft-model forwards spent on this draft (blocks cut off by ``truncate`` included)."""
        return sum(b.forwards for b in self.blocks)

    @property
    def last_block(self) -> slice:
        """Index range of the latest block (empty slice for an empty draft)."""
        return slice(len(self) - len(self.blocks[-1]) if self.blocks else 0, len(self))

    def extend(self, block: DraftBlock) -> "Draft":
        return Draft(self.blocks + (block,))

    def truncate(self, length: int) -> "Draft":
        """The first ``length`` tokens; branches are dropped since they continued the full draft.
        Forwards spent on the cut tokens stay counted (on the last kept block)."""
        if length >= len(self):
            return self
        kept, total = [], 0
        for block in self.blocks:
            take = min(len(block), length - total)
            if take <= 0 and kept:
                break
            kept.append(DraftBlock(
                block.tokens[:take],
                None if block.draft_probs is None else block.draft_probs[:take],
                None if block.hidden_states is None else block.hidden_states[:take],
                (),
                block.forwards,
            ))
            total += take
        cut = self.forwards - sum(b.forwards for b in kept)
        kept[-1] = attrs.evolve(kept[-1], forwards=kept[-1].forwards + cut)
        return Draft(tuple(kept))


@attrs.frozen
class Stop:
    """Returned by ``pacer_draft_more`` to end drafting. ``keep`` trims the draft to its first
    ``keep`` tokens before verification (e.g. PACER not sending a block it predicts will fail)."""

    keep: Optional[int] = None


@attrs.frozen
class Verdict:
    """A verifier's decision for one step.

    ``accepted`` draft tokens are kept; if every draft token was accepted and ``branch`` is not None,
    the first ``branch_accepted`` tokens of that branch are kept too. Then ``next_token`` follows:
    ``recovered`` (sampled at the first rejection) or ``bonus`` (after the last accepted token).
    """

    accepted: int
    next_token: int
    next_kind: Literal["recovered", "bonus"]
    branch: Optional[int] = None
    branch_accepted: int = 0


@attrs.frozen
class ModelOutput:
    logits: torch.Tensor = tensor_field()  # [k, vocab] float32
    hidden_states: Optional[torch.Tensor] = tensor_field(default=None)  # [k, hidden]


class LanguageModel(Protocol):
    """What the engine and drafters need of a causal LM with a KV cache (see ``hf.HFModel``).

    The model adapter owns the cache and the token ids in it (``cached_tokens``).
    """

    vocab_size: int
    hidden_size: int
    max_length: int
    eos_token_ids: frozenset[int]
    num_forwards: int  # forward passes so far (the engine reports the target's)
    # a content hash of the weights: components trained for one model (a feature draft, PACER's M_B)
    # compare it with the one they were trained for; None when unknown (models built in memory)
    digest: Optional[str]

    @property
    def cached_tokens(self) -> Sequence[int]: ...

    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: bool = False,
    ) -> ModelOutput: ...

    def crop(self, length: int) -> None: ...

    def reset(self) -> None: ...


@attrs.frozen
class AttentionShape:
    """The attention layout of a model's decoder layers (a feature-level draft copies its target's)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float  # epsilon of the RMS norms


@runtime_checkable
class FeatureModel(LanguageModel, Protocol):
    """A ``LanguageModel`` that also shows its weights and layout: what feature-level drafts (``eagle``)
    and the trainers distilling drafts from a target read (see ``hf.HFModel``). ``hidden_size`` (from
    ``LanguageModel``) is the width of its hidden states and embeddings."""

    num_layers: int  # decoder layers
    packed_weights: bool  # its linear layers multiply with packed weights (``pacer_core.kernels``)

    def embedding_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input embeddings [vocab, hidden], output layer [vocab, hidden]), shared, not copied."""
        ...

    def attention_shape(self) -> AttentionShape: ...


@attrs.frozen
class Resources:
    """What a plugin constructor may use besides its own config."""

    target: LanguageModel
    draft: Optional[LanguageModel]
    sampling: SamplingParams
    tokenizer: Any = None
    # names the draft weights drafts come from, for components trained on one draft/target pair
    # (PACER's M_B): the drafter's ``draft_identity`` attribute, else the draft model's ``digest``
    draft_identity: Optional[str] = None


@attrs.frozen
class Component:
    """A named strategy a plugin module offers, returned by ``pacer_components``.

    ``kind`` is the role; ``config`` an attrs class (validated with OmegaConf in struct mode, so
    unknown keys fail); ``factory(config, resources)`` builds the object whose ``pacer_*`` hook
    implementations the engine registers.

    ``needs`` and ``provides`` are sets of capability names (``pacer_core.registry.CAPABILITIES``
    lists them): what the component relies on and what it supplies to the rest of the stack. The
    run supplies ``greedy`` (when ``sampling.temperature`` is 0), ``draft_model`` (the engine loads
    the ``draft`` model for a stack that needs it) and ``target_hidden`` (the target pass returns
    hidden states); components supply the rest (a model drafter ``provides`` ``draft_probs`` and
    ``draft_hidden``, which stop policies ``need``). A stack in which something needed is supplied
    by nobody is refused before any model loads, with one generic check.
    """

    kind: Literal["drafter", "stop", "verifier", "observer"]
    name: str
    config: type
    factory: Callable[[Any, Resources], Any]
    description: str = ""
    needs: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    provides: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    default_draft: Optional[str] = None  # a drafter's shipped draft model folder, used when a config
    # that runs the embedded target omits ``draft`` (see ``pacer_core.config.draft_model_config``)


@attrs.frozen
class StepRecord:
    """What happened in one step, given to every ``pacer_observe_step`` implementation."""

    index: int
    draft: Draft
    verdict: Verdict
    emitted: tuple[int, ...]  # accepted + branch tokens + next token, after EOS/budget truncation
    committed_before: int  # length of the committed sequence (prompt included) before this step
    draft_s: float
    verify_s: float
    draft_forwards: int
    stop_s: float = 0.0  # time spent in stop policies (part of draft_s)
    target_hidden: Optional[torch.Tensor] = tensor_field(default=None)  # [k, hidden]
    target_hidden_start: int = 0  # index in state.tokens of target_hidden's first row
    target_argmax: Optional[torch.Tensor] = tensor_field(default=None)  # [n + 1 + Σ m_j] int64

    @property
    def drafted(self) -> int:
        return len(self.draft)


@attrs.frozen
class GenerationResult:
    tokens: list[int]
    text: Optional[str]
    metrics: dict[str, Any]
    finish_reason: Literal["eos", "length"]

"""What the engine and plugins need of a model: ``LanguageModel`` (a causal LM with its KV cache) and
``FeatureModel`` (one that also shows its weights and layout), implemented by ``pacer_core.hf.HFModel``
and, in tests, ``pacer_core.testing.ScriptedLM``; only the model adapter imports transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol, Sequence, Union, runtime_checkable

import attrs
import torch

from .fields import tensor_field

__all__ = [
    "AttentionShape",
    "FeatureModel",
    "LanguageModel",
    "MASK_ROW",
    "ModelOutput",
    "ParallelDraftModel",
    "StoredModel",
]

# a row that ``ParallelDraftModel.forward(mask_embedding=)`` feeds a learned mask embedding instead of a
# token's (a parallel draft's mask token, which its tokenizer lacks: the pard drafter)
MASK_ROW = -1


@attrs.frozen
class ModelOutput:
    logits: torch.Tensor = tensor_field()  # [k, vocab] float32, on the model's device (docs/gpu.md)
    hidden_states: Optional[torch.Tensor] = tensor_field(default=None)  # [k, hidden] or [k, layers × hidden]


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
    dtype: torch.dtype  # of the weights (the logits are float32 whatever it is)
    device: torch.device  # where forward's outputs live (docs/gpu.md)

    @property
    def cached_tokens(self) -> Sequence[int]: ...

    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: Union[bool, Sequence[int]] = False,
    ) -> ModelOutput:
        """Run ``tokens`` after the cached ones (appending them to the cache): logits [k - logits_from,
        vocab]; hidden states of all k rows when ``hidden``: True = the last layer's (after the final
        norm) [k, hidden]; a sequence of decoder-layer indices = the input of each of those layers
        (i = 0 the embeddings), concatenated in order: [k, len(layers) × hidden]. Both stay on the
        model's device: reading their values on the host (``tolist``, ``int``, ``.cpu()``) waits for
        a GPU, so a caller reads only what it needs, once (docs/gpu.md)."""
        ...

    def crop(self, length: int, rows: Sequence[int] = ()) -> None:
        """Keep the first ``length`` cached positions, then the cached ``rows`` (ascending indices
        ≥ ``length``: an accepted tree path) moved into the positions after them; drop the rest."""
        ...

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


@runtime_checkable
class ParallelDraftModel(LanguageModel, Protocol):
    """A ``LanguageModel`` a parallel draft runs on (the ``pard`` drafter; ``hf.HFModel`` is one): its
    ``forward`` also takes ``mask_embedding`` ([hidden]), fed as the input of every row whose token is
    ``MASK_ROW`` (a mask token the draft learned, which its vocabulary lacks; such rows are cached as
    ``MASK_ROW`` and are the caller's to crop), and it may compute logits over a subset of its
    vocabulary only (``vocab_subset``). ``runtime_checkable``: the pard drafter refuses another model
    with an ``InputError``."""

    # [w] the token ids its logits cover (every other token's logit is -inf); None: the whole vocabulary
    vocab_subset: Optional[torch.Tensor]

    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: Union[bool, Sequence[int]] = False,
        mask_embedding: Optional[torch.Tensor] = None,
    ) -> ModelOutput:
        """``LanguageModel.forward``, the rows whose token is ``MASK_ROW`` fed ``mask_embedding``."""
        ...

    def embedding_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input embeddings [vocab, hidden], output layer [vocab, hidden]), shared, not copied (a
        published PARD checkpoint's mask rows take the input embedding of its ``pard_token``)."""
        ...


@runtime_checkable
class StoredModel(Protocol):
    """A model read from a folder (``hf.HFModel`` as ``load_model`` returns it): ``folder`` holds its
    weights and what was saved beside them (a ``pard`` draft's mask embedding); None for a model
    built in memory."""

    folder: Optional[Path]


def feature_target(target: LanguageModel, drafter: str) -> FeatureModel:
    """``target`` when it shows its weights (a ``FeatureModel``), as the drafters that read them
    (``eagle``, ``dflash``) need; else one ``InputError`` naming ``drafter`` and the fix."""
    from .errors import InputError

    if not isinstance(target, FeatureModel):
        raise InputError(
            f"the {drafter} drafter reads its target's weights, which this target "
            f"({type(target).__name__}) does not show: give it a pacer_core.protocols.FeatureModel "
            "such as pacer_core.hf.HFModel"
        )
    return target

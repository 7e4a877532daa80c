"""Value objects passed between the engine and plugins: sampling parameters, the decode state, a
stop's and a verifier's answers, what a plugin is built with (``Resources``, ``DraftInfo``,
``Component``) and what a step and a generation report. The draft and its tree live in
``pacer_core.draft_values``, the model protocols in ``pacer_core.protocols``.

Tensors are excluded from equality and shown by shape in ``repr``. Shapes are noted as
``# [n, vocab]`` comments; ``n`` is the number of draft tokens, ``vocab`` the model vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Mapping, Optional, Protocol, runtime_checkable

import attrs
import torch

from .cost_profiles import DRAFTER_KINDS
from .draft_values import Draft
from .fields import tensor_field
from .protocols import LanguageModel
from .trees import TreeConfig

__all__ = [
    "Component",
    "DecodeState",
    "DeclaresDraftInfo",
    "DraftInfo",
    "GenerationResult",
    "Resources",
    "SamplingParams",
    "StepRecord",
    "StepWatch",
    "Stop",
    "Verdict",
]


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


@attrs.define(eq=False)
class DecodeState:
    """The generation in progress, as hooks see it. Plugins read it; only the engine writes it."""

    tokens: list[int]  # prompt + committed new tokens
    prompt_length: int
    max_new_tokens: int
    sampling: SamplingParams
    generator: torch.Generator
    eos_token_ids: frozenset[int]
    max_draft_tokens: int = 0  # bound on this step's draft (engine limit, budget left)
    step_index: int = 0

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def budget_left(self) -> int:
        return self.max_new_tokens - (len(self.tokens) - self.prompt_length)


class StepWatch:
    """How a component keeping per-step state tells that a step began: from ``state.step_index``,
    never from an empty draft (a composite drafter asks its members with one, and the engine's
    draft gate skips steps without asking). ``starts(state)`` is True at the first call it is asked
    in each step and False at the later ones; ``restart()`` in ``pacer_start``, as every generation
    counts its steps from 0.

    Worked example: a tree drafter asked to grow levels at steps 0, 0, 0, 1, 1 gets True, False,
    False, True, False, so it grows from the root at the first call of each step and continues its
    tree at the others."""

    def __init__(self) -> None:
        self.step: Optional[int] = None  # the step the last call was in (None: none yet this generation)

    def restart(self) -> None:
        self.step = None

    def starts(self, state: DecodeState) -> bool:
        if state.step_index == self.step:
            return False
        self.step = state.step_index
        return True


@attrs.frozen
class Stop:
    """Returned by ``pacer_draft_more`` to end drafting. ``keep`` trims the draft to its first
    ``keep`` main-path tokens before verification (e.g. PACER not sending a block it predicts will
    fail); on a tree it cuts every node deeper than ``keep`` (``Draft.truncate``)."""

    keep: Optional[int] = None


def _path(value: Optional[Iterable[int]]) -> Optional[tuple[int, ...]]:
    """``Verdict.path``'s converter: ``attrs.converters.optional(tuple)``, typed (mypy's attrs plugin
    cannot type the generic ``tuple``)."""
    return None if value is None else tuple(value)


@attrs.frozen
class Verdict:
    """A verifier's decision for one step.

    ``accepted`` draft tokens are kept: the nodes ``path`` of ``draft.tree`` (root first), or, when
    ``path`` is None, the first ``accepted`` tokens of the draft's main path (what a chain verifier
    returns). Then ``next_token`` follows: ``recovered`` (drawn at the first rejection) or
    ``bonus`` (after a leaf of the tree: every candidate along the path was accepted).
    """

    accepted: int
    next_token: int
    next_kind: Literal["recovered", "bonus"]
    path: Optional[tuple[int, ...]] = attrs.field(default=None, converter=_path)

    def __attrs_post_init__(self) -> None:
        if self.path is not None and len(self.path) != self.accepted:
            raise ValueError(f"a verdict's path has {len(self.path)} nodes but accepted is {self.accepted}")

    def nodes(self, draft: "Draft") -> tuple[int, ...]:
        """The accepted nodes of ``draft.tree``, root first."""
        return self.path if self.path is not None else draft.path_nodes[: self.accepted]


@attrs.frozen
class Resources:
    """What a plugin constructor may use besides its own config."""

    target: LanguageModel
    draft: Optional[LanguageModel]
    sampling: SamplingParams
    tokenizer: Any = None
    # names the draft weights drafts come from, for components trained on one draft/target pair
    # (PACER's M_B): the drafter's ``DraftInfo.identity``, else the draft model's ``digest``
    draft_identity: Optional[str] = None
    # thresholds the drafter's draft recommends to the stop policies that read its probabilities, by
    # stop name (the drafter's ``DraftInfo.stop_thresholds``: e.g. measured for a draft whose priors
    # make its probabilities run high); a stop whose own threshold is unset takes its entry
    stop_thresholds: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    # how cost profiles price the stack's draft forwards (the drafter's ``Component.cost_kind``, a
    # composite's main member's); None: no draft forward
    draft_cost_kind: Optional[str] = None
    # the draft tokens one of its draft forwards yields (the drafter's ``DraftInfo.tokens_per_forward``):
    # a cost model prices a draft token at a forward's seconds over it
    draft_tokens_per_forward: int = 1


def _layers(value: Optional[Iterable[int]]) -> Optional[tuple[int, ...]]:
    return None if value is None else tuple(int(i) for i in value)


@attrs.frozen
class DraftInfo:
    """What a drafter tells the engine and the components built after it: its side channel.

    A drafter declares it as its ``draft_info`` attribute (``DeclaresDraftInfo``); the engine builds
    the drafter first and reads it once, with ``DraftInfo.of``: ``identity``, ``stop_thresholds`` and
    ``tokens_per_forward`` become the later components' ``Resources.draft_identity``,
    ``Resources.stop_thresholds`` and ``Resources.draft_tokens_per_forward``, and ``target_layers``
    what the target pass returns as hidden states; ``tree`` the token tree it grows
    (read by a composite drafter, which sizes its own tree by its main member's). A drafter declaring
    nothing tells nothing (every field at its default). A composite drafter (``hybrid``) declares what
    it read of its members the same way.
    """

    identity: Optional[str] = None  # names the draft weights (PACER's M_B); None: the draft model's digest
    # by stop name: thresholds the draft recommends to the stops reading its probabilities; empty: theirs
    stop_thresholds: Mapping[str, float] = attrs.field(factory=dict, converter=dict, hash=False)
    # target decoder layers whose inputs the drafter reads (EAGLE-3), concatenated; None: the last layer's
    # output, when it needs ``target_hidden``
    target_layers: Optional[tuple[int, ...]] = attrs.field(default=None, converter=_layers)
    # the token tree it grows (its config's ``tree``); None: a chain. A composite drafter (``hybrid``)
    # sizes its merged tree by its main member's
    tree: Optional[TreeConfig] = None
    # the draft tokens one draft forward yields along its main path: 1 (a token a forward), or a block
    # drafter's block (one forward drafts the whole block); cost models price its forwards by it
    tokens_per_forward: int = attrs.field(default=1, validator=attrs.validators.ge(1))

    @staticmethod
    def of(drafter: Any) -> "DraftInfo":
        """What ``drafter`` declares (its ``draft_info``), else an empty ``DraftInfo``: the one way
        the engine, and a composite drafter, read a drafter's side channel."""
        if not isinstance(drafter, DeclaresDraftInfo):
            return DraftInfo()
        if not isinstance(drafter.draft_info, DraftInfo):
            raise TypeError(
                f"{type(drafter).__name__}.draft_info must be a pacer_core.DraftInfo, "
                f"got {type(drafter.draft_info).__name__}"
            )
        return drafter.draft_info


@runtime_checkable
class DeclaresDraftInfo(Protocol):
    """A drafter object with a side channel (``DraftInfo``) for the engine and later components."""

    draft_info: DraftInfo


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
    hidden states: the last layer's, or, when the drafter declares ``DraftInfo.target_layers``,
    the inputs of those decoder layers concatenated); components supply the rest (a model
    drafter ``provides`` ``draft_probs`` and ``draft_hidden``, which stop policies ``need``). A
    stack in which something needed is supplied by nobody is refused before any model loads, with
    one generic check.
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
    # a drafter reading its own draft weights (not a draft model): ``draft_folder(config)`` is the folder
    # its config names (its shipped draft when it names none), found without loading any model; trainers
    # read the draft's manifest there (``pacer train-preverify``: what the draft was distilled on)
    draft_folder: Optional[Callable[[Any], Any]] = None
    # how cost profiles price a drafter's forwards (pacer_core.cost_profiles.DRAFTER_KINDS): 'feature' (a head
    # over the target's states, eagle), 'token' (a draft model), 'block' (one forward drafts a block);
    # None: no draft forward (lookups), or for a drafter of members (hybrid) its main member's kind.
    # Declared once here; the stops read it as ``Resources.draft_cost_kind``, the bench records it.
    cost_kind: Optional[str] = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(DRAFTER_KINDS))
    )


@attrs.frozen(kw_only=True)
class StepRecord:
    """What happened in one step, given to every ``pacer_observe_step`` implementation (its fields
    are given by name)."""

    index: int
    draft: Draft
    verdict: Verdict
    emitted: tuple[int, ...]  # accepted path + next token, after EOS/budget truncation
    committed_before: int  # length of the committed sequence (prompt included) before this step
    draft_s: float
    verify_s: float
    draft_forwards: int
    stop_s: float = 0.0  # time spent in stop policies (part of draft_s)
    target_hidden: Optional[torch.Tensor] = tensor_field(default=None)  # [k, hidden] (or [k, layers × hidden])
    target_hidden_start: int = 0  # index in state.tokens of target_hidden's first row
    target_logits: Optional[torch.Tensor] = tensor_field(default=None)  # [N + 1, vocab], as the verifier saw them
    _argmax: Optional[torch.Tensor] = tensor_field(default=None, alias="target_argmax")

    @property
    def target_argmax(self) -> Optional[torch.Tensor]:
        """[N + 1] int64, the target's argmax at each row of ``target_logits``, computed on first use
        (on the logits' device: no host sync until a caller reads it)."""
        if self._argmax is None and self.target_logits is not None:
            object.__setattr__(self, "_argmax", self.target_logits.argmax(-1))
        return self._argmax

    @property
    def drafted(self) -> int:
        """Main-path tokens drafted (a chain's length; a tree's depth)."""
        return len(self.draft)

    @property
    def main_accepted(self) -> int:
        """Main-path tokens accepted: where the accepted path leaves the main path (all of
        ``verdict.accepted`` for a chain). What policies judging the main path learn from."""
        count = 0
        for node, main in zip(self.verdict.nodes(self.draft), self.draft.path_nodes):
            if node != main:
                break
            count += 1
        return count


@attrs.frozen
class GenerationResult:
    tokens: list[int]
    text: Optional[str]
    metrics: dict[str, Any]
    finish_reason: Literal["eos", "length"]

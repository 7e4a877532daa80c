"""The plugin author's manual: every hook the engine calls, when, and what to return.

A plugin module offers named strategies through ``pacer_components``; the engine builds each
strategy the YAML names and registers the object with a fresh ``pluggy.PluginManager`` (one per
engine, none global). Those objects implement some of the ``pacer_*`` hooks below as methods
decorated with ``pacer_core.hookimpl``. Call order of one ``generate``:

0. ``pacer_step_costs`` (all) once, when the engine is built.
1. ``pacer_start`` (all) before step 0, whose target forward prefills the prompt with its draft.
2. Each step: the engine's draft gate may decode the step plainly (an empty draft, no draft hook
   called: ``pacer_core.skipping``); else the draft starts empty; repeat ``pacer_draft_more`` (all
   stop policies) → if none says stop, ``pacer_propose`` (the one drafter) for that many tokens;
   ``pacer_select_nodes`` (all) may leave some tree nodes out; then the target scores the draft
   tree (every node sent, with the ancestor mask) in one forward; ``pacer_verify`` (the one
   verifier) picks the accepted path; the engine commits the emitted tokens and keeps only the accepted
   path's rows in the target's KV cache; ``pacer_observe_step`` (all).
3. ``pacer_finish`` (all) once EOS or the token budget is reached; returned dicts become metrics.

Hooks are called with keyword arguments, so an implementation may declare only the arguments it
uses, and new arguments can be added later without breaking plugins. Names: ``target_*`` and
``draft_*`` for the two models; accepted / recovered / bonus / emitted tokens as in docs/concepts.md.

Besides the hooks, a drafter has one side channel, read once when the engine is built: its
``draft_info`` attribute, a ``pacer_core.DraftInfo`` (the ``DeclaresDraftInfo`` protocol). The
engine builds the drafter first and reads it with ``DraftInfo.of(drafter)``: ``identity`` names the
draft weights (``Resources.draft_identity`` of the components built after it, else the draft
model's ``digest``), ``stop_thresholds`` are the thresholds the draft recommends by stop name
(``Resources.stop_thresholds``), ``target_layers`` the target decoder layers whose inputs the
target pass returns as ``StepRecord.target_hidden`` (None: the last layer's output), and ``tree`` the
token tree it grows. A drafter without ``draft_info`` declares nothing; other attributes are never
read. A composite drafter (``hybrid``) reads its members with ``DraftInfo.of`` and declares the result
the same way, and calls its members' hooks through a plugin manager of their own
(``registry.member_hooks``).

A component keeping state per step tells a new step by ``state.step_index`` (``types.StepWatch``),
never by an empty draft.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Union

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import torch

    from .cost_profiles import CostModel
    from .draft_values import Draft, DraftBlock
    from .types import Component, DecodeState, GenerationResult, StepRecord, Stop, Verdict

PROJECT = "pacer_sd"
"""The pluggy project name, also the setuptools entry-point group plugins register under."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def pacer_components() -> "list[Component]":  # type: ignore[empty-body]  # a spec: its body never runs
    """Declare the strategies this plugin module offers.

    Called once per engine on each module found through the ``pacer_sd`` entry-point group (and on
    modules passed as ``extra_plugins``). Return a list of ``pacer_core.Component``: its kind
    (``drafter``, ``stop``, ``verifier`` or ``observer``), its short name used in YAML, its attrs
    config class, and a factory ``factory(config, resources)`` building the object that implements
    the hooks. Names must be unique within a kind.
    """


@hookspec
def pacer_shipped() -> "Optional[Mapping[str, Path]]":
    """Declare the data folders this plugin ships for other packages, by name.

    Called on each module found through the ``pacer_sd`` entry-point group when a package asks for
    shipped data (``pacer_core.registry.shipped_folder(name)``), never while a plugin is imported.
    Return ``{name: folder}`` (the ``pacer_builtins`` drafters: ``token_draft``, the token-level draft
    ``draft_model`` and ``ouroboros`` run; the ``eagle`` drafter's module: the self-distillation
    corpora) or None. Another package reaches the folder by its name, never by a path into this
    plugin's folder. Names must be unique across the installed plugins.
    """


@hookspec
def pacer_step_costs() -> "Optional[CostModel]":
    """The cost model this component prices steps with, or None.

    Called once on every strategy when the engine is built. A cost-aware component (a tree drafter
    with ``nodes: auto``, the ``pacer`` stop's throughput rule) returns its
    ``pacer_core.cost_profiles.CostModel``; the engine's draft gate (``generation.skip_drafting``,
    ``pacer_core.skipping``) then prices drafted and plain steps with it and decodes a step plainly,
    deciding before any draft hook runs, when this generation's drafted steps have emitted fewer
    tokens per second than plain decoding would (docs/costs.md#skipping-drafting). The first
    component in the stack that returns one prices the gate (the drafter before the stops).
    Components then see steps with an empty draft that no ``pacer_draft_more``, ``pacer_propose``
    or ``pacer_select_nodes`` call preceded: ``pacer_observe_step`` is still called for them.
    """


@hookspec
def pacer_start(state: "DecodeState") -> None:
    """A generation begins: the prompt is in ``state.tokens``, nothing is in the target's cache yet.

    Called on every registered strategy. Reset per-prompt state here; keep state that should
    survive across prompts (learned thresholds, phrase pools) on the object. State carried across
    generations must not change which random numbers a sampled generation sees: when
    ``state.sampling.greedy`` is false, reset adaptive state (a learned gamma or threshold) to its
    initial value, so a seed reproduces the output (docs/hooks.md). Step 0's target forward
    prefills the prompt together with step 0's draft, so a drafter that reads the target's hidden
    states has none yet: it proposes nothing in step 0 and gets the prompt's rows with step 0's
    record (``StepRecord.target_hidden``, from row 0), as ``generate`` gets the first token from
    its prefill.
    """


@hookspec
def pacer_draft_more(state: "DecodeState", draft: "Draft") -> "Optional[Union[int, Stop]]":
    """Should drafting go on, and for how many tokens before asking again?

    Called on every stop policy before each ``pacer_propose`` (the first time with an empty draft).
    Return a positive int ``k`` to have ``k`` more tokens drafted before this policy is asked again,
    ``pacer_core.Stop()`` to end drafting (``Stop(keep=m)`` also trims the draft to its first ``m``
    tokens), or None for no opinion. The engine drafts the smallest ``k`` asked for and stops when
    any policy says stop; it also never drafts past ``state.max_draft_tokens`` (budget and context).

    Trees: a policy judges the draft's **main path** — ``draft.tokens``, ``draft_probs``,
    ``hidden_states``, ``len(draft)`` and the blocks are the path, side nodes are in ``draft.tree``
    — so ``k`` counts levels of depth: a tree drafter grows ``k`` more levels (one draft forward
    each) and ``Stop(keep=m)`` cuts every node deeper than ``m``. A tree drafter's main path is its
    most likely path (docs/trees.md), so a policy asks "is the best guess still worth a level?".
    """


@hookspec(firstresult=True)
def pacer_propose(state: "DecodeState", draft: "Draft", num_tokens: int) -> "Optional[DraftBlock]":
    """Propose the next draft block: up to ``num_tokens`` tokens continuing ``state.tokens + draft``.

    Exactly one drafter is registered. Return a ``DraftBlock`` with its tokens (more than
    ``num_tokens`` is allowed for drafters that emit several per forward, e.g. phrases; the engine
    cuts the draft at ``state.max_draft_tokens``), the distributions they were sampled from when the
    drafter has them (``state.sampling`` applied), and the draft's hidden states when available.
    The tokens continue the draft's main path; a tree drafter also returns ``side`` nodes (other
    candidates, each with its parent in ``draft.tree``) and grows ``num_tokens`` levels. Return
    None or an empty block when there is nothing to propose: drafting then ends.
    Use ``state.generator`` for any randomness.
    """


@hookspec
def pacer_select_nodes(state: "DecodeState", draft: "Draft") -> "Optional[Iterable[int]]":
    """Drafting has ended: which nodes of ``draft.tree`` should the target score?

    Called on every strategy once per step, after the stop policies stopped (and the draft was cut
    to ``state.max_draft_tokens``), before the target's forward. Return the indices of the nodes to
    send, or None to send them all. The engine sends the nodes every answer keeps, less any whose
    ancestor is left out (``Draft.select``). Choose from the draft alone, never the target, and
    keep or drop a node's sampled children together, so verification stays lossless. Tree drafters
    send their best ``nodes`` by cumulative draft probability here (EAGLE-2's re-ranking:
    ``pacer_core.trees.best_nodes``).
    """


@hookspec(firstresult=True)
def pacer_verify(  # type: ignore[empty-body]  # a spec: its body never runs
    state: "DecodeState", draft: "Draft", target_logits: "torch.Tensor"
) -> "Verdict":
    """Decide which draft tokens to keep and the token that follows.

    Exactly one verifier is registered. ``target_logits`` is [N + 1, vocab] over the nodes of
    ``draft.tree``: row 0 scores the token after the committed sequence, row i + 1 the token after
    node i's root path (for a chain, row i scores the token after ``draft.tokens[:i]``). Return a
    ``pacer_core.Verdict`` whose ``path`` names the accepted nodes (a chain verifier may give only
    ``accepted``). Lossless verifiers apply ``state.sampling`` to the target logits exactly as the
    drafter applied it to its own, and draw randomness only from ``state.generator``.
    """


@hookspec
def pacer_observe_step(state: "DecodeState", step: "StepRecord") -> None:
    """A step is committed: ``state.tokens`` already holds ``step.emitted``.

    Called on every strategy. Drafters roll their caches back here; adaptive stop policies learn
    from ``step.verdict.accepted`` vs ``len(step.draft)``; observers aggregate. When a component
    declares ``needs={"target_hidden"}``, ``step.target_hidden`` holds the target's last-layer hidden
    states (after the final norm) of the committed tokens this step's forward computed, row 0 being
    ``state.tokens[step.target_hidden_start]`` (feature-level drafters in the EAGLE family read them;
    the inputs of the layers the drafter's ``DraftInfo.target_layers`` names, concatenated, when it
    names some).
    ``step.target_logits`` are the verifier's ``target_logits`` and ``step.target_argmax`` the
    target's argmax at each of their rows, computed when first read (Ouroboros' phrase pool learns
    the target's phrases from it). On a GPU both live on the target's device: read them only when
    needed (each read on the host is a sync; docs/gpu.md).
    """


@hookspec
def pacer_finish(state: "DecodeState", result: "GenerationResult") -> "Optional[dict[str, Any]]":
    """The generation has ended (EOS or budget). Return a dict to merge into ``result.metrics``."""

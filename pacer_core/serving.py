"""Drafting for a serving engine that scores and verifies drafts itself (vLLM): a strategy stack's
drafter and stop policies decide each request's draft, its length included (docs/serving.md).

- ``ServedTarget``: the engine's target as the stack's components see it (sizes, end-of-sequence ids,
  weights digest); it has no forward, the engine runs the target.
- ``ServingDrafter``: one stack per request (an ``Engine`` of the config's components with a draft
  model of its own cache, sharing the loaded weights), found again at each call by the request's
  tokens. A call commits what the engine verified since the last one (the components observe the
  step, as in ``Engine.generate``; the draft model drops rejected rows on its next proposal) and
  drafts the next step with the engine's own draft stage (``Engine.draft_step``).
- ``VllmProposer``: vLLM's custom proposer (``speculative_config`` method ``custom_class``); turns the
  arguments vLLM's model runner gives ``propose`` into ``ServingDrafter``'s rows.

Nothing here imports vllm: ``VllmProposer`` reads the ``VllmConfig`` it is given by attribute.
"""

from __future__ import annotations

import collections
import copy
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import attrs
import torch

from .config import PacerConfig, RunPlan, load_plan, plan_run
from .draft_values import Draft
from .engine import Engine, load_stack_draft
from .errors import InputError
from .protocols import LanguageModel, ModelOutput
from .registry import ResolvedStack, new_plugin_manager
from .types import DecodeState, StepRecord, Verdict

Row = tuple[Sequence[int], Sequence[int]]  # (a request's tokens now, the tokens committed since the last call)

# VllmConfig.additional_config keys the proposer reads (vLLM passes the mapping through untouched)
CONFIG_KEY, OVERRIDES_KEY, RECORD_KEY = "pacer_config", "pacer_overrides", "pacer_record"


@attrs.define(eq=False)
class ServedTarget:
    """The target a serving engine runs, as the components of a stack drafting for it see it
    (``LanguageModel``): its sizes, end-of-sequence ids and weights digest (PACER's M_B checks its
    draft/target pair by digest). The engine scores the drafts, so ``forward`` is refused."""

    vocab_size: int
    hidden_size: int
    max_length: int  # the engine's context length (vLLM's max_model_len)
    eos_token_ids: frozenset[int] = attrs.field(converter=frozenset)
    digest: Optional[str] = None
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    num_forwards: int = 0

    @classmethod
    def from_folder(cls, folder: Path, max_length: Optional[int] = None) -> "ServedTarget":
        """The model of a Hugging Face folder, read without its weights (``hf.model_facts``)."""
        from .hf import model_facts  # the model adapter; only it imports transformers

        facts = model_facts(folder, "target")
        return cls(
            vocab_size=facts["vocab_size"],
            hidden_size=facts["hidden_size"],
            max_length=max_length or facts["max_positions"],
            eos_token_ids=facts["eos_token_ids"],
            digest=facts["digest"],
        )

    @property
    def cached_tokens(self) -> Sequence[int]:
        return ()

    def forward(
        self,
        tokens: Sequence[int],
        *,
        positions: Optional[torch.Tensor] = None,
        tree_mask: Optional[torch.Tensor] = None,
        logits_from: int = 0,
        hidden: Union[bool, Sequence[int]] = False,
    ) -> ModelOutput:
        raise InputError(
            "a component of the stack ran the target, which the serving engine runs: use components "
            "that draft from the draft model or the context only"
        )

    def crop(self, length: int, rows: Sequence[int] = ()) -> None:
        pass

    def reset(self) -> None:
        pass


def own_cache(model: LanguageModel) -> LanguageModel:
    """``model`` with a KV cache of its own, sharing the weights: a ``LanguageModel``'s mutable state is
    its cache, which ``reset`` replaces (``HFModel``, ``ScriptedLM``), so a shallow copy reset holds
    another request's cache beside this one's."""
    twin = copy.copy(model)
    twin.reset()
    return twin


def check_servable(cfg: PacerConfig, stack: ResolvedStack) -> None:
    """Refuse, before any model loads, a stack that cannot draft for an engine verifying itself."""
    if cfg.sampling.temperature != 0:
        raise InputError(
            "a stack drafting for a serving engine drafts greedily (the engine verifies the draft "
            "tokens as point masses, without their probabilities, whatever the request samples with): "
            "set sampling.temperature: 0 in its config"
        )
    if stack.needs("target_hidden"):
        users = sorted(
            {item.component.name for top in stack for item in top.walk() if "target_hidden" in item.component.needs}
        )
        raise InputError(
            f"{', '.join(users)} reads the target's hidden states, which the serving engine does not "
            "hand its proposer: use a drafter of its own model or of the context (draft_model, "
            "prompt_lookup, ...)"
        )


@attrs.define(eq=False)
class RequestStack:
    """One request's stack: its engine (components and draft model), its decode state, and the draft
    sent at the last call, awaiting the engine's verdict."""

    engine: Engine
    state: DecodeState
    sent: Draft = attrs.field(factory=Draft)
    call: int = 0  # the ServingDrafter.propose call that sent it
    draft_s: float = 0.0
    stop_s: float = 0.0


class ServingDrafter:
    """Drafts for the requests a serving engine verifies itself: one stack per request.

    ``cfg`` names the stack; ``target`` is the engine's target (``ServedTarget``), ``draft`` the loaded
    draft model a stack needing one drafts with (each request gets it with a cache of its own,
    ``own_cache``). A draft is at most ``max_draft_tokens`` long (the engine's, e.g. vLLM's
    ``num_speculative_tokens``; also ``generation.max_draft_tokens``) and never past the target's
    context. ``record``: a file to which each verified step appends one JSON line (drafted, accepted,
    emitted tokens, and the call that drafted it: the requests of one batch share it); ``outcomes``
    counts the (drafted, accepted) pairs in memory.
    """

    def __init__(
        self,
        cfg: PacerConfig,
        target: LanguageModel,
        draft: Optional[LanguageModel] = None,
        tokenizer: Any = None,
        *,
        max_draft_tokens: int,
        stack: Optional[ResolvedStack] = None,
        extra_plugins: Sequence[Any] = (),
        record: Optional[Path] = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if isinstance(max_draft_tokens, bool) or not isinstance(max_draft_tokens, int) or max_draft_tokens < 1:
            raise InputError(f"the engine's draft length bound must be a positive int, got {max_draft_tokens!r}")
        self.extra_plugins = tuple(extra_plugins)
        self.stack = stack if stack is not None else plan_run(cfg, self.extra_plugins, require_models=False).stack
        check_servable(cfg, self.stack)
        self.cfg, self.target, self.draft, self.tokenizer = cfg, target, draft, tokenizer
        self.max_draft_tokens = min(max_draft_tokens, cfg.generation.max_draft_tokens)
        self.record, self.clock = record, clock
        self.requests: dict[tuple[int, ...], list[RequestStack]] = {}  # by the tokens each has committed
        self.outcomes: collections.Counter[tuple[int, int]] = collections.Counter()  # (drafted, accepted) → steps
        self.calls = 0  # propose calls so far

    @classmethod
    def from_folder(
        cls,
        folder: Union[str, Path],
        config: Optional[Union[str, Path]] = None,
        overrides: Sequence[str] = (),
        *,
        max_length: Optional[int] = None,
        max_draft_tokens: int,
        record: Optional[Union[str, Path]] = None,
    ) -> "ServingDrafter":
        """The drafter of the stack ``config`` + ``overrides`` names (default: the default config) for the
        target in the Hugging Face folder ``folder``; the config is checked before any model loads, then
        the target's tokenizer and the stack's draft model (``draft.path``, or its drafter's shipped
        draft) are loaded."""
        from .hf import load_tokenizer  # the model adapter; only it imports transformers

        plan = load_plan(config, overrides)
        cfg, stack = plan.config, plan.stack
        check_servable(cfg, stack)
        folder = Path(folder).expanduser()
        if not (folder / "config.json").is_file():
            raise InputError(
                f"the served target '{folder}' is not a model folder (no config.json): serve a local "
                "Hugging Face folder"
            )
        target = ServedTarget.from_folder(folder, max_length)
        tokenizer = load_tokenizer(folder, "target")
        draft = load_stack_draft(plan, tokenizer)
        return cls(
            cfg,
            target,
            draft,
            tokenizer,
            max_draft_tokens=max_draft_tokens,
            stack=stack,
            record=None if record is None else Path(record),
        )

    # -- one call: commit what was verified, then draft ------------------------------------------
    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """The next draft of every request of the engine's batch, in the batch's order.

        ``rows``: per request, (its tokens now: prompt and every committed token; the tokens committed
        since the last call: the verified step's accepted draft tokens and then the engine's own token,
        or empty when nothing was verified, as for a prompt still being prefilled in chunks). A request
        is found by the tokens it had committed; one not found (new, or resumed after the engine
        dropped it) gets a fresh stack, its committed tokens taken as its prompt. Stacks of requests
        absent from the batch (finished) are dropped. Worked example, one request, prompt ``p``:

            call 1  rows [(p + [a], [a])]         a new stack (a: the prefill's token); drafts [b, c, d]
            call 2  rows [(p + [a, b, c, x], [b, c, x])]
                                                  the engine accepted b, c and rejected d for its x: the
                                                  components observe the step (accepted 2, recovered x);
                                                  the next draft starts after x (the draft model's cache
                                                  is cropped to p a b c before it feeds x)
        """
        self.calls += 1
        kept: dict[tuple[int, ...], list[RequestStack]] = {}
        drafts: list[list[int]] = []
        for tokens, new in rows:
            tokens, new = [int(t) for t in tokens], [int(t) for t in new]
            if not new or len(new) >= len(tokens):  # nothing verified since the last call
                found = self._take(tuple(tokens))
                if found is not None:
                    kept.setdefault(tuple(tokens), []).append(found)
                drafts.append([])
                continue
            before = len(tokens) - len(new)
            request = self._take(tuple(tokens[:before]))
            if request is None or not self._commit(request, new):
                request = self._begin(tokens, before)
            drafts.append(self._draft(request))
            kept.setdefault(tuple(request.state.tokens), []).append(request)
        self.requests = kept
        return drafts

    def _take(self, key: tuple[int, ...]) -> Optional[RequestStack]:
        """The stack of a request that had committed ``key`` (requests with the same tokens so far are
        interchangeable: under greedy drafting their stacks decide alike), removed from the table."""
        found = self.requests.get(key)
        return found.pop() if found else None

    def _begin(self, tokens: list[int], prompt_length: int) -> RequestStack:
        """A new request's stack: its components built through the registry, its draft model with a
        cache of its own. Step 0 was the engine's prefill, so the first draft is step 1."""
        draft = None if self.draft is None else own_cache(self.draft)
        # the stack was resolved once; each request's strategy objects go into a plugin manager of its own
        plan = RunPlan(self.cfg, new_plugin_manager(self.extra_plugins), self.stack)
        engine = Engine.build(self.target, draft=draft, tokenizer=self.tokenizer, plan=plan)
        eos = frozenset() if self.cfg.generation.ignore_eos else self.target.eos_token_ids
        state = DecodeState(
            list(tokens),
            prompt_length,
            self.target.max_length - prompt_length,
            engine.sampling,
            torch.Generator().manual_seed(engine.seed),
            eos,
            step_index=1,
        )
        engine.start_generation(state)
        return RequestStack(engine, state)

    def _commit(self, request: RequestStack, new: list[int]) -> bool:
        """The engine verified ``request``'s last draft and committed ``new`` (accepted tokens, then its
        own): the components observe the step. False when ``new`` does not continue that draft (not the
        step this stack drafted for): the caller starts the request afresh."""
        sent, state = request.sent, request.state
        proposed = sent.tokens.tolist()
        accepted = len(new) - 1
        if accepted > len(proposed) or new[:accepted] != proposed[:accepted]:
            return False
        verdict = Verdict(
            accepted=accepted, next_token=new[-1], next_kind="bonus" if accepted == len(proposed) else "recovered"
        )
        record = StepRecord(
            index=state.step_index,
            draft=sent,
            verdict=verdict,
            emitted=tuple(new),
            committed_before=len(state.tokens),
            draft_s=request.draft_s,
            verify_s=0.0,
            draft_forwards=sent.forwards,
            stop_s=request.stop_s,
        )
        state.tokens.extend(new)
        request.engine.observe_step(state, record)
        state.step_index += 1
        self.outcomes[len(proposed), accepted] += 1
        if self.record is not None:
            with open(self.record, "a") as handle:
                handle.write(
                    json.dumps(
                        {"drafted": len(proposed), "accepted": accepted, "emitted": len(new), "call": request.call}
                    )
                    + "\n"
                )
        return True

    def _draft(self, request: RequestStack) -> list[int]:
        """The request's next draft by the engine's draft stage (the stop policies decide its length),
        bounded by the engine's limit and the context; a token tree is sent as its main path (the
        engine verifies one chain per request)."""
        state = request.state
        state.max_draft_tokens = max(0, min(self.max_draft_tokens, state.budget_left))
        start = self.clock()
        request.sent, request.stop_s = request.engine.draft_step(state)
        request.draft_s, request.call = self.clock() - start, self.calls
        return request.sent.tokens.tolist()


# -- vLLM ---------------------------------------------------------------------------------------
def vllm_rows(sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any) -> list[Row]:
    """``ServingDrafter.propose``'s rows from what vLLM's model runner hands a custom proposer
    (``GPUModelRunner.propose_draft_token_ids``, after its bookkeeping): per request of the batch, the
    tokens committed this step (``sampled_token_ids``: accepted, then the recovered or bonus token;
    empty for a prefill chunk) and the batch's token table (``token_ids_cpu`` [max_num_reqs,
    max_model_len], of which the first ``num_tokens_no_spec[i]`` of row i are committed, this step's
    tokens included)."""
    return [
        (token_ids_cpu[i, : int(num_tokens_no_spec[i])].tolist(), [int(t) for t in sampled])
        for i, sampled in enumerate(sampled_token_ids)
    ]


def stack_options(additional_config: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The stack a ``VllmProposer`` runs, from ``VllmConfig.additional_config``: ``pacer_config`` (a YAML
    config; absent: the default config), ``pacer_overrides`` (a list of ``key=value``) and
    ``pacer_record`` (a file for ``ServingDrafter``'s step records)."""
    options = dict(additional_config or {})
    overrides = options.get(OVERRIDES_KEY) or []
    if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
        raise InputError(f"additional_config's {OVERRIDES_KEY} must be a list of key=value strings, got {overrides!r}")
    return {"config": options.get(CONFIG_KEY), "overrides": list(overrides), "record": options.get(RECORD_KEY)}


class VllmProposer:
    """A strategy stack as vLLM's custom proposer:

        LLM(model=FOLDER, speculative_config={"method": "custom_class",
            "model": "pacer_core.serving.VllmProposer", "num_speculative_tokens": K},
            additional_config={"pacer_config": "configs/vllm.yaml", "pacer_overrides": [...]})

    vLLM builds it with its ``VllmConfig`` in the worker (``vllm/v1/spec_decode/custom_class_proposer.py``)
    and, after each step's bookkeeping, calls ``propose`` for the whole batch; each request's list
    may be shorter than K or empty, and the scheduler then schedules that many draft tokens for it.
    It has no ``model`` attribute on purpose: vLLM treats a drafter's ``model`` as a network of its
    own (loading, graph capture).
    """

    def __init__(self, vllm_config: Any):
        options = stack_options(getattr(vllm_config, "additional_config", None))
        model_config = vllm_config.model_config
        self.drafter = ServingDrafter.from_folder(
            model_config.model,
            options["config"],
            options["overrides"],
            max_length=model_config.max_model_len,
            max_draft_tokens=vllm_config.speculative_config.num_speculative_tokens,
            record=options["record"],
        )

    def load_model(self, target_model: Any = None) -> None:
        """Nothing to load: the stack's models were loaded when it was built. vLLM's CPU model runner
        calls every drafter's ``load_model`` with its target network (``CPUModelRunner.load_model``)."""

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        return self.drafter.propose(vllm_rows(sampled_token_ids, num_tokens_no_spec, token_ids_cpu))

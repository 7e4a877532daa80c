"""The decode loop: draft until a stop policy says stop → score → verify → commit → observe
(step 0's forward also prefills the prompt).

The engine knows token ids, tensors and hooks; strategies live in plugins, models behind adapters.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
import weakref
from typing import Any, Callable, Literal, Optional, Sequence, Union, cast

import attrs
import numpy as np
import pluggy
import torch

from .config import PacerConfig, RunPlan, check_seed, draft_model_config, plan_run
from .draft_values import Draft, TokenTree
from .errors import ConfigError, InputError
from .hookcheck import check_results
from .hostmemory import reuse_freed_memory
from .protocols import LanguageModel, StoredModel
from .registry import ResolvedStack, check_hooks
from .skipping import SkipConfig, draft_gate
from .types import DecodeState, DraftInfo, GenerationResult, Resources, SamplingParams, StepRecord, Stop


def tree_layout(n_pending: int, tree: TokenTree) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and mask for [pending, tree nodes] scored in one forward.

    The pending tokens are causal; each node sees the pending tokens, its ancestors and itself, at
    the position of its depth after the last pending token. Returns (positions [k] offsets from the
    cache length, tree_mask [k, k] bool).
    """
    k = n_pending + len(tree)
    positions = torch.tensor(
        list(range(n_pending)) + [n_pending - 1 + depth for depth in tree.depth_list], dtype=torch.long
    )
    mask = np.zeros((k, k), dtype=bool)  # built in numpy: small tensor operations cost more
    mask[:n_pending, :n_pending] = np.tri(n_pending, dtype=bool)
    mask[n_pending:, :n_pending] = True
    mask[n_pending:, n_pending:] = tree.ancestor_mask().numpy()
    return positions, torch.from_numpy(mask)


def committed_rows(rows: torch.Tensor, n_pending: int, path: Sequence[int]) -> torch.Tensor:
    """The rows of a verification forward's output that were committed: the pending tokens', then
    the accepted path's nodes' (node i is row ``n_pending + i``). A chain's are a prefix (a view);
    a tree's are gathered with an index sent to the rows' device without a host sync."""
    if list(path) == list(range(len(path))):
        return rows[: n_pending + len(path)]
    index = torch.tensor(list(range(n_pending)) + [n_pending + i for i in path])
    return rows[index.to(rows.device, non_blocking=True)]


def check_target_layers(target: LanguageModel, layers: Sequence[int]) -> tuple[int, ...]:
    """``layers`` (decoder-layer indices whose inputs a drafter reads) as a tuple, refused in one line
    when the target has no such layers (``num_layers``, when it tells)."""
    layers = tuple(int(i) for i in layers)
    count = getattr(target, "num_layers", None)
    if count is not None and any(not 0 <= i <= count for i in layers):
        raise InputError(
            f"the drafter reads the inputs of target layers {list(layers)}, but the target has "
            f"{count} decoder layers (0..{count}): use a draft made for this target"
        )
    return layers


def load_stack_draft(
    plan: RunPlan, tokenizer: Any, loaded: Optional[dict[str, LanguageModel]] = None
) -> Optional[LanguageModel]:
    """The draft model the plan's stack needs (``draft.path``, else its drafter's shipped draft), or None.

    ``loaded`` maps draft folders to models already loaded, so several stacks share one copy.
    """
    if not plan.stack.needs("draft_model"):
        return None
    from .hf import load_draft  # the model adapter; only it imports transformers

    user = plan.stack.draft_model_user()
    section = draft_model_config(plan.config, user)
    if section is None:
        raise InputError(f"drafter '{user.name}' needs a draft model: set draft.path")
    if loaded is None:
        return load_draft(section, tokenizer)
    path = cast(str, section.path)  # draft_model_config's section always names one
    if path not in loaded:
        loaded[path] = load_draft(section, tokenizer)
    return loaded[path]


@attrs.frozen
class DraftSource:
    """The draft weights a built engine's stack reads, as the engine resolved them (``Engine.draft_source``;
    the bench records them in each unit of bench.json)."""

    folder: Optional[Any]  # the folder they were read from (a Path); None for a draft model built in memory
    identity: Optional[str]  # their identity, ``Resources.draft_identity`` of the components; None when unknown


def stack_draft_source(
    stack: ResolvedStack, draft: Optional[LanguageModel], identity: Optional[str]
) -> Optional[DraftSource]:
    """What the stack's drafter reads: its own draft weights (``ResolvedComponent.draft_folder``: a hybrid's
    main member's), else the draft model when its drafter needs one (``ResolvedStack.draft_model_entry``,
    the rule the bench and train-preverify read); None when it reads no draft.
    ``identity``: the engine's ``Resources.draft_identity`` once the drafter is built."""
    folder = stack.drafter.draft_folder
    if folder is not None:
        return DraftSource(folder, identity)
    if draft is not None and stack.draft_model_entry() is not None:
        return draft_model_source(draft, identity)
    return None


def draft_model_source(draft: LanguageModel, identity: Optional[str]) -> DraftSource:
    """A draft model read as ``identity``: the folder it was read from (``StoredModel``), None when built in memory."""
    return DraftSource(draft.folder if isinstance(draft, StoredModel) else None, identity)


@attrs.define(eq=False)
class CacheLock:
    """The lock of one model's KV cache and the thread holding it."""

    lock: threading.Lock = attrs.Factory(threading.Lock)
    owner: Optional[int] = None


_CACHE_LOCKS: dict[int, CacheLock] = {}
_CACHE_LOCKS_GUARD = threading.Lock()


def cache_lock(model: Any) -> CacheLock:
    """The lock of ``model``'s KV cache, one per model object, shared by every engine built on it
    (two engines on one loaded target take turns, as one engine's threads do); dropped with it."""
    with _CACHE_LOCKS_GUARD:
        lock = _CACHE_LOCKS.get(id(model))
        if lock is None:
            lock = _CACHE_LOCKS[id(model)] = CacheLock()
            try:
                weakref.finalize(model, _CACHE_LOCKS.pop, id(model), None)
            except TypeError:  # a model without weak references keeps its lock for the process's life
                pass
        return lock


class Engine:
    """Speculative decoding with one target model and a strategy stack of plugins.

    An engine may be shared between threads: ``generate`` calls are serialised by a lock, since the
    engine owns its components' state; engines built on the same model object (target or draft)
    also take turns, since its KV cache is the model's. For parallel decoding build one engine per
    thread, each with its own models.
    """

    def __init__(
        self,
        target: LanguageModel,
        pm: pluggy.PluginManager,
        *,
        sampling: SamplingParams,
        seed: int = 0,
        max_new_tokens: int = 128,
        max_draft_tokens: int = 64,
        ignore_eos: bool = False,
        chat_template: bool = True,
        tokenizer: Any = None,
        draft: Optional[LanguageModel] = None,
        needs_target_hidden: bool = False,
        target_layers: Optional[Sequence[int]] = None,
        clock: Callable[[], float] = time.perf_counter,
        skip_drafting: Optional[SkipConfig] = None,
        draft_cost_kind: Optional[str] = None,
        draft_source: Optional[DraftSource] = None,
    ):
        self.target, self.draft, self.pm, self.tokenizer = target, draft, pm, tokenizer
        self.draft_cost_kind = draft_cost_kind  # how cost profiles price its draft forwards (Component.cost_kind)
        self.draft_source = draft_source  # the draft weights its stack reads (None: none)
        self.sampling, self.seed, self.clock = sampling, seed, clock
        self.max_new_tokens, self.max_draft_tokens = max_new_tokens, max_draft_tokens
        self.ignore_eos, self.chat_template = ignore_eos, chat_template
        # what the target pass returns as hidden states: the last layer (True), or the inputs of the
        # decoder layers the drafter declared (``DraftInfo.target_layers``), concatenated; False: none
        self.target_hidden: Union[bool, tuple[int, ...]] = bool(needs_target_hidden)
        if needs_target_hidden and target_layers:
            self.target_hidden = check_target_layers(target, target_layers)
        self._lock = threading.Lock()  # one generation at a time: the models' caches are the engine's
        self._generating: Optional[int] = None  # the thread inside generate, to refuse re-entry
        models = {id(m): m for m in (target, draft) if m is not None}
        self._cache_locks = [cache_lock(models[key]) for key in sorted(models)]  # taken in one global order
        for hook, role in (("pacer_propose", "drafter"), ("pacer_verify", "verifier")):
            impls = getattr(pm.hook, hook).get_hookimpls()
            if len(impls) != 1:
                names = ", ".join(i.plugin_name for i in impls) or "none"
                raise InputError(f"exactly one {role} must be registered, found {len(impls)}: {names}")
        # the draft gate: a cost-aware stack decodes a step plainly when drafting does not pay
        # (pacer_core.skipping); priced by the first component in the stack that declares a cost model
        costs = check_results(pm, "pacer_step_costs", pm.hook.pacer_step_costs())
        self.gate = draft_gate(skip_drafting or SkipConfig(), list(reversed(costs)))
        reuse_freed_memory()  # a step's large buffers (the tree's logits, the draft's rows) reuse memory

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def from_plan(cls, plan: RunPlan) -> "Engine":
        """Load the models the plan's config names and build its strategy stack (``load_plan``
        checked everything before any model loads)."""
        from .hf import load_section  # the model adapter; only it imports transformers

        target, tokenizer, _ = load_section(plan.config.target, "target")
        draft = load_stack_draft(plan, tokenizer)
        return cls.build(target, draft=draft, tokenizer=tokenizer, plan=plan)

    @classmethod
    def from_config(cls, cfg: PacerConfig, extra_plugins: Sequence[Any] = ()) -> "Engine":
        """``from_plan`` of ``cfg``'s plan (``plan_run``: the stack resolved once, here)."""
        return cls.from_plan(plan_run(cfg, extra_plugins))

    @classmethod
    def build(
        cls,
        target: LanguageModel,
        *,
        draft: Optional[LanguageModel] = None,
        tokenizer: Any = None,
        cfg: Optional[PacerConfig] = None,
        extra_plugins: Sequence[Any] = (),
        plan: Optional[RunPlan] = None,
        **overrides: Any,
    ) -> "Engine":
        """An engine around already-loaded models, building the stack of ``plan`` (``load_plan``,
        ``plan_run``), or else of ``cfg`` (default config if None) planned here with ``extra_plugins``.

        The strategy objects are registered into the plan's plugin manager and their hooks checked,
        so a plan builds one engine. ``overrides``: engine settings replacing the config's.
        """
        if plan is None:
            plan = plan_run(cfg or PacerConfig(), extra_plugins, require_models=False)
        elif cfg is not None or extra_plugins:
            raise InputError(
                "Engine.build takes a plan, or a cfg with its extra_plugins, not both: the plan "
                "holds its config and plugins"
            )
        cfg, pm, stack = plan.config, plan.pm, plan.stack
        if pm.has_plugin(f"{stack.drafter.where}:{stack.drafter.component.name}"):
            raise InputError(
                "this run plan has built an engine already; a plan builds one engine: plan the run "
                "again (load_plan, plan_run) for another"
            )
        s = cfg.sampling
        sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        resources = Resources(
            target=target,
            draft=draft,
            sampling=sampling,
            tokenizer=tokenizer,
            draft_identity=None if draft is None else draft.digest,
            draft_cost_kind=stack.drafter.cost_kind,
        )
        target_layers = None
        for item in stack:
            for part in item.walk():
                if "draft_model" in part.component.needs and draft is None:
                    raise InputError(f"{part.where}: '{part.component.name}' needs a draft model; set draft.path")
            # a composite's factory gets its members resolved (config.members: ResolvedComponents)
            config = attrs.evolve(item.config, members=item.members) if item.members else item.config
            plugin = item.component.factory(config, resources)
            if item is stack.drafter:  # built first: what it declares reaches the components after it
                info = DraftInfo.of(plugin)
                resources = attrs.evolve(
                    resources,
                    draft_identity=info.identity or resources.draft_identity,
                    stop_thresholds=dict(info.stop_thresholds),
                    draft_tokens_per_forward=info.tokens_per_forward,
                )
                target_layers = info.target_layers  # e.g. EAGLE-3: three layers' inputs
            pm.register(plugin, name=f"{item.where}:{item.component.name}")
        check_hooks(pm)  # a misspelled hook on a strategy object is an error, not a silent no-op
        g = cfg.generation
        kwargs = dict(
            sampling=sampling,
            seed=s.seed,
            max_new_tokens=g.max_new_tokens,
            max_draft_tokens=g.max_draft_tokens,
            ignore_eos=g.ignore_eos,
            chat_template=g.chat_template,
            tokenizer=tokenizer,
            draft=draft,
            needs_target_hidden=stack.needs("target_hidden"),
            target_layers=target_layers,
            skip_drafting=g.skip_drafting,
            draft_cost_kind=stack.drafter.cost_kind,
            draft_source=stack_draft_source(stack, draft, resources.draft_identity),
        )
        kwargs.update(overrides)
        return cls(target, pm, **kwargs)

    # -- input -------------------------------------------------------------------------------
    _PROMPT_TYPES = "a str or a sequence of int token ids"

    def encode(self, prompt: Union[str, Sequence[int]]) -> list[int]:
        """The prompt's token ids: a str is tokenized (chat template per config), a sequence of int
        token ids (a list, tuple, 1-D integer tensor or array) is checked. Raises ``InputError``."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError("the prompt is empty: give some text to continue")
            if self.tokenizer is None:
                raise InputError("this engine has no tokenizer: pass the prompt as a list of token ids")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer can encode it
                raise InputError(
                    f"the prompt is not valid Unicode text (U+{ord(prompt[exc.start]):04X}, a lone "
                    f"surrogate, at character {exc.start}): give UTF-8 text"
                ) from None
            return self.tokenizer.encode(prompt, chat_template=self.chat_template)
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            raise InputError(
                f"the prompt must be {self._PROMPT_TYPES}, got {type(prompt).__name__}: decode the bytes to str first"
            )
        if prompt is None or isinstance(prompt, (dict, set, frozenset)) or not hasattr(prompt, "__iter__"):
            hint = f": put a single token id in a list, [{prompt}]" if isinstance(prompt, int) else ""
            raise InputError(f"the prompt must be {self._PROMPT_TYPES}, got {type(prompt).__name__}{hint}")
        tokens = []
        for i, token in enumerate(prompt):
            try:
                if isinstance(token, bool):
                    raise TypeError
                tokens.append(operator.index(token))  # int, numpy and 0-d torch integers; not floats
            except TypeError:
                raise InputError(
                    f"the prompt must be {self._PROMPT_TYPES}: item {i} is "
                    f"{type(token).__name__} {token!r}; convert the ids to int"
                ) from None
        if not tokens:
            raise InputError("the prompt is empty: give at least one token")
        if not all(0 <= t < self.target.vocab_size for t in tokens):
            raise InputError(f"prompt token ids must lie in [0, {self.target.vocab_size})")
        return tokens

    @staticmethod
    def _whole(value: Any, name: str, fix: str) -> int:
        """``value`` as an int (a Python or numpy integer, not a bool or a float), else ``InputError``."""
        try:
            if isinstance(value, bool):
                raise TypeError
            return operator.index(value)
        except TypeError:
            raise InputError(f"{name} must be {fix}, got {type(value).__name__} {value!r}") from None

    # -- the loop ----------------------------------------------------------------------------
    def generate(
        self, prompt: Union[str, Sequence[int]], max_new_tokens: Optional[int] = None, seed: Optional[int] = None
    ) -> GenerationResult:
        """Decode up to ``max_new_tokens`` (default: the config's) new tokens after ``prompt``.

        ``seed`` (default: ``sampling.seed``) seeds the generation's random numbers: the same seed
        gives the same output on the same engine. Calls from several threads run one at a time.
        Raises ``InputError`` for a prompt or budget that cannot be decoded.
        """
        budget = (
            self.max_new_tokens
            if max_new_tokens is None
            else self._whole(max_new_tokens, "max_new_tokens", "a positive int")
        )
        if budget <= 0:
            raise InputError(f"max_new_tokens must be positive, got {budget}")
        seed = self.seed if seed is None else self._whole(seed, "seed", "an int")
        try:
            check_seed(seed, "seed")
        except ConfigError as exc:
            raise InputError(str(exc)) from None
        if self._generating == threading.get_ident():
            raise InputError(
                "generate was called from inside a hook of the same engine's generation: "
                "build a second engine for nested decoding"
            )
        if any(lock.owner == threading.get_ident() for lock in self._cache_locks):
            raise InputError(
                "generate was called during another engine's generation on the same model (from one "
                "of its hooks): build the nested engine on its own copy of the model"
            )
        with self._lock, contextlib.ExitStack() as held:
            self._generating = threading.get_ident()
            for lock in self._cache_locks:
                held.enter_context(lock.lock)
                lock.owner = self._generating
                held.callback(setattr, lock, "owner", None)
            try:
                return self._generate(prompt, budget, seed)
            finally:
                self._generating = None

    def _generate(self, prompt: Union[str, Sequence[int]], budget: int, seed: Optional[int]) -> GenerationResult:
        tokens = self.encode(prompt)
        state = self._decode_state(tokens, budget, seed)
        hook, clock = self.pm.hook, self.clock
        target_forwards, draft_forwards = self.target.num_forwards, 0
        start = clock()
        # 1. nothing is cached yet: step 0's forward prefills the whole prompt along with its draft
        self.target.reset()
        pending = list(tokens)  # committed tokens not yet in the target's cache
        self.start_generation(state)
        finish: Literal["eos", "length"] = "length"
        while state.budget_left > 0:
            # 2. draft until a stop policy says stop, unless the gate decodes this step plainly
            # (decided from earlier steps only, before any draft hook runs)
            t0 = clock()
            state.max_draft_tokens = min(self.max_draft_tokens, state.budget_left)
            draft, stop_s = self.draft_step(state)
            t1 = clock()
            # 3. score pending + the draft tree with the target in one forward, then verify
            cached, tree, n_pending = len(self.target.cached_tokens), draft.tree, len(pending)
            layout, nodes = (None, None) if tree.is_chain else tree_layout(n_pending, tree), tree.tokens.tolist()
            out = self.target.forward(
                pending + nodes,
                positions=layout[0],
                tree_mask=layout[1],
                logits_from=n_pending - 1,
                hidden=self.target_hidden,
            )
            verdict = hook.pacer_verify(state=state, draft=draft, target_logits=out.logits)  # [N + 1, vocab]
            check_results(self.pm, "pacer_verify", verdict, draft=draft)
            # 4. commit: emitted = accepted path + next; the cache keeps the path's rows, moved into place
            path = list(verdict.nodes(draft))
            emitted, hit_eos = self._truncate([nodes[i] for i in path] + [verdict.next_token], state)
            before = len(state.tokens)
            state.tokens.extend(emitted)
            base = cached + n_pending
            kept = path[: len(emitted)]  # EOS or the budget may cut the path
            self.target.crop(base, [base + i for i in kept])
            pending = state.tokens[len(self.target.cached_tokens) :]
            t2 = clock()
            # 5. observe: hidden states of the committed rows this forward computed (pending + path)
            hidden = None if out.hidden_states is None else committed_rows(out.hidden_states, n_pending, kept)
            record = StepRecord(
                index=state.step_index,
                draft=draft,
                verdict=verdict,
                emitted=tuple(emitted),
                committed_before=before,
                draft_s=t1 - t0,
                verify_s=t2 - t1,
                draft_forwards=draft.forwards,
                stop_s=stop_s,
                target_hidden=hidden,
                target_hidden_start=cached,
                target_logits=out.logits,
            )
            self.observe_step(state, record)
            draft_forwards += draft.forwards
            state.step_index += 1
            if hit_eos:
                finish = "eos"
                break
        wall = clock() - start
        return self._result(state, finish, wall, self.target.num_forwards - target_forwards, draft_forwards)

    def _decode_state(self, tokens: list[int], budget: int, seed: Optional[int]) -> DecodeState:
        """A generation's state over the encoded prompt ``tokens``, refused when the prompt and ``budget``
        exceed the target's context."""
        if len(tokens) + budget > self.target.max_length:
            raise InputError(
                f"prompt ({len(tokens)} tokens) + max_new_tokens ({budget}) exceeds the target's "
                f"context of {self.target.max_length} tokens: shorten the prompt or lower the budget"
            )
        generator = torch.Generator().manual_seed(self.seed if seed is None else seed)
        eos = frozenset() if self.ignore_eos else self.target.eos_token_ids
        return DecodeState(list(tokens), len(tokens), budget, self.sampling, generator, eos)

    def _result(
        self,
        state: DecodeState,
        finish: Literal["eos", "length"],
        wall: float,
        target_forwards: int,
        draft_forwards: int,
    ) -> GenerationResult:
        """A finished generation's result: its new tokens, text and metrics, with each component's
        ``pacer_finish`` metrics added."""
        new = state.new_tokens
        text = self.tokenizer.decode(new) if self.tokenizer is not None else None
        metrics = {
            "new_tokens": len(new),
            "wall_s": wall,
            "tokens_per_s": len(new) / wall if wall > 0 else 0.0,
            "target_forwards": target_forwards,
            "draft_forwards": draft_forwards,
        }
        if self.gate is not None:
            metrics["skipped_steps"] = self.gate.skipped
        result = GenerationResult(tokens=new, text=text, metrics=metrics, finish_reason=finish)
        for extra in self.pm.hook.pacer_finish(state=state, result=result):
            if extra:
                metrics.update(extra)
        return result

    # -- the stages a serving engine shares (pacer_core.serving: it scores and verifies itself) --------
    def start_generation(self, state: DecodeState) -> None:
        """A generation begins: every component's ``pacer_start``, and the draft gate restarts."""
        self.pm.hook.pacer_start(state=state)
        if self.gate is not None:
            self.gate.restart()

    def draft_step(self, state: DecodeState) -> tuple[Draft, float]:
        """A step's draft, bounded by ``state.max_draft_tokens``, and the seconds the stop policies
        took: empty when the draft gate decodes the step plainly (decided from earlier steps only,
        before any draft hook runs), else drafted until a stop policy stops."""
        if self.gate is None or self.gate.drafts():
            return self._draft(state)
        return Draft(), 0.0

    def observe_step(self, state: DecodeState, record: StepRecord) -> None:
        """A step is committed (``state.tokens`` holds ``record.emitted``): every component's
        ``pacer_observe_step``, then the draft gate learns from it."""
        self.pm.hook.pacer_observe_step(state=state, step=record)
        if self.gate is not None:
            self.gate.observe(record)

    def _draft(self, state: DecodeState) -> tuple[Draft, float]:
        """Ask the stop policies, then the drafter, until a policy stops or the bound is reached;
        then every strategy may leave tree nodes out."""
        hook, clock = self.pm.hook, self.clock
        draft, stop_s = Draft(), 0.0
        while len(draft) < state.max_draft_tokens:
            t = clock()
            wants = hook.pacer_draft_more(state=state, draft=draft)
            stop_s += clock() - t
            check_results(self.pm, "pacer_draft_more", wants, draft=draft)
            stops = [w for w in wants if isinstance(w, Stop)]
            if stops:  # Stop() keeps the whole tree (side nodes may hang deeper than the main path)
                keep = min((s.keep for s in stops if s.keep is not None), default=None)
                if keep is not None:
                    draft = draft.truncate(keep)
                break
            room = state.max_draft_tokens - len(draft)
            asked = min((w for w in wants if w is not None), default=room)
            block = hook.pacer_propose(state=state, draft=draft, num_tokens=max(1, min(asked, room)))
            check_results(self.pm, "pacer_propose", block)
            if block is None or len(block) == 0:
                break
            draft = draft.extend(block)
        draft = draft.truncate(state.max_draft_tokens)
        chosen = [set(nodes) for nodes in hook.pacer_select_nodes(state=state, draft=draft) if nodes is not None]
        return (draft.select(set.intersection(*chosen)) if chosen else draft), stop_s

    @staticmethod
    def _truncate(emitted: list[int], state: DecodeState) -> tuple[list[int], bool]:
        """Cut the emitted tokens at the first EOS (kept) and at the token budget."""
        emitted = emitted[: state.budget_left]
        for i, token in enumerate(emitted):
            if token in state.eos_token_ids:
                return emitted[: i + 1], True
        return emitted, False

"""What ``pacer check`` runs: a strategy stack on tiny models it builds itself, against the target's
own decoding (greedy), its exact distribution (sampling), plain sampling with the same seed
(``sample_match``), itself (repeatability) and its own options' bad values.

Every case has an id (``check/case``); ``pacer check ... --case ID`` reruns one. A case fails on a
wrong output, a refused contract (``Contract``: a draft cache not rolled back, a block longer than
asked), a hook's result ``pacer_core.hookcheck`` refuses (a stop keeping more tokens than were
drafted, a verdict accepting more than was drafted, a wrong type), a hook changing the state or the
draft in place, a plugin's exception (``Watch`` names the plugin and the hook) or any error other
than a one-line refusal.
"""

from __future__ import annotations

import contextlib
import hashlib
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import attrs
import torch

from pacer_core import Engine, PacerError, hookcheck, hookimpl, load_plan
from pacer_core.draft_values import DraftBlock
from pacer_core.errors import PluginError
from pacer_core.types import Stop, Verdict

FALSE_ALARM = 1e-3  # the chance a correct stack fails the distribution check (all its cases together)
PROMPTS = {"plain": [5, 9, 13, 7, 22], "one_token": [17], "repetitive": [5, 9, 13, 5, 9, 13, 5, 9]}
DIST_PROMPT = [3, 7, 11, 5]
DIST_LENGTH = 3  # tokens per sampled continuation: 16**3 outcomes, enumerated exactly
SAMPLINGS = {
    "t0.7": {"temperature": 0.7},
    "t1.0": {"temperature": 1.0},
    "t1.0-topk4": {"temperature": 1.0, "top_k": 4},
    "t0.7-topp0.8": {"temperature": 0.7, "top_p": 0.8},
}
QUICK_SAMPLINGS = ("t0.7", "t1.0-topk4")
EOS_BIAS = 0.03  # added to the EOS logit of the EOS target: EOS becomes its argmax after a few tokens
CONTEXT = 40  # the context-limit case's target context (prompt + budget fill it)


class Contract(Exception):
    """A component broke what the engine relies on (one line: what, and which component)."""


@attrs.frozen
class Case:
    id: str  # "check/case"
    run: Callable[[], None]  # raises AssertionError/Contract (or anything) when the case fails


@attrs.define
class Outcome:
    check: str
    cases: int = 0
    failed: Optional[str] = None  # the first failing case's id
    reason: str = ""
    note: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """No case failed (a check with no case applies not to this stack: the note says why)."""
        return self.failed is None


# -- the draft cache and the hooks' contracts ----------------------------------------------------------
class WatchedLM:
    """A draft model whose cache is checked before every chain forward: it must agree with what is
    true then (the committed tokens and the current draft, which ``Truth`` records before each
    ``pacer_propose``), up to the shorter of the two. Rejected tokens left in it mean the drafter did
    not roll back its cache (its later drafts would continue a text that was never emitted)."""

    def __init__(self, model: Any, truth: "Truth"):
        self._model, self._truth = model, truth

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, tokens, *, positions=None, tree_mask=None, logits_from=0, hidden=False, **options):
        cached = list(self._model.cached_tokens)
        truth = self._truth.tokens
        if truth is not None and positions is None and tree_mask is None:
            n = min(len(cached), len(truth))
            if cached[:n] != truth[:n]:
                at = next(i for i in range(n) if cached[i] != truth[i])
                raise Contract(
                    f"the draft model's cache holds token {cached[at]} at position {at} where the "
                    f"committed text and draft hold {truth[at]}: the drafter did not roll back its "
                    "draft cache"
                )
        return self._model.forward(
            tokens, positions=positions, tree_mask=tree_mask, logits_from=logits_from, hidden=hidden, **options
        )

    def crop(self, length, rows=()):
        return self._model.crop(length, rows)

    def reset(self):
        return self._model.reset()

    @property
    def cached_tokens(self):
        return self._model.cached_tokens


class Truth:
    """A plugin of the check's: before every ``pacer_propose`` the engine asks the stops, so this
    records the committed tokens and the draft's main path then (no opinion of its own: a wrapper,
    so it adds no result to the stops' list)."""

    def __init__(self):
        self.tokens: Optional[list[int]] = None

    @hookimpl(wrapper=True)
    def pacer_draft_more(self, state, draft):
        self.tokens = list(state.tokens) + draft.tokens.tolist()
        return (yield)

    @hookimpl
    def pacer_start(self, state):
        self.tokens = None


CHECK_PREFIX = "check:"  # the names the check registers its own plugins under
DECISIONS = ("pacer_draft_more", "pacer_propose", "pacer_select_nodes", "pacer_verify")


class Watch:
    """The check's eye on every hook call, through pluggy's call monitoring (nothing is wrapped):
    a plugin's exception (``SystemExit`` included) becomes a ``PluginError`` naming the plugin and
    the hook; a result the hook does not allow is refused by ``hookcheck.check_results`` (what the
    engine refuses too); a hook that changed ``state`` or the draft in place is refused; a block
    longer than asked is a ``Contract``. With ``log`` set it also records each decision (for the
    isolation check) and every strategy object's state after ``pacer_start``."""

    def __init__(self, pm):
        self.pm = pm
        self._before: list[Any] = []
        self.log: Optional[list[tuple[str, Any]]] = None
        self.starts: list[dict[str, dict[str, Any]]] = []  # per generation: plugin name -> its state

    def install(self) -> "Watch":
        self.pm.add_hookcall_monitoring(self.before, self.after)
        return self

    def names(self, hook: str) -> list[str]:
        """The strategies implementing ``hook`` (the check's own plugins left out)."""
        return [
            i.plugin_name for i in hookcheck.implementers(self.pm, hook) if not i.plugin_name.startswith(CHECK_PREFIX)
        ]

    def before(self, hook_name, hook_impls, kwargs):
        self._before.append(_inputs(kwargs))

    def after(self, outcome, hook_name, hook_impls, kwargs):
        inputs = self._before.pop()
        theirs = [i for i in hook_impls if not i.plugin_name.startswith(CHECK_PREFIX)]
        who = " or ".join(i.plugin_name for i in theirs if not (i.wrapper or i.hookwrapper)) or "?"
        exc = outcome.exception
        if exc is not None:
            if isinstance(exc, (PacerError, Contract, KeyboardInterrupt)):
                return  # a one-line refusal, or the check's own finding: as raised
            impl = hookcheck.blame(exc, theirs)
            where = hookcheck.origin(exc)
            raise PluginError(
                f"{impl.plugin_name if impl else who}: {hook_name} raised {hookcheck.describe(exc)}"
                + (f" at {where}" if where else "")
            ) from None
        changed = _changed(inputs, _inputs(kwargs))
        if changed:
            raise PluginError(
                f"{who}: {hook_name} changed {changed} in place, which only the engine writes: "
                "copy it before changing it (docs/hooks.md)"
            )
        result = outcome.get_result()
        hookcheck.check_results(self.pm, hook_name, result, **kwargs)
        if hook_name == "pacer_propose" and isinstance(result, DraftBlock) and len(result) > kwargs["num_tokens"]:
            raise Contract(f"drafter '{who}' proposed {len(result)} tokens when asked for {kwargs['num_tokens']}")
        if self.log is not None:
            if hook_name in DECISIONS:
                self.log.append((hook_name, decision(result)))
            elif hook_name == "pacer_start":
                self.starts.append({name: state_of(plugin) for name, plugin in strategies(self.pm)})


def _inputs(kwargs: dict) -> tuple:
    """What a hook must leave as it found it: the state's tokens and counters, the draft's nodes."""
    state, draft = kwargs.get("state"), kwargs.get("draft")
    seen = []
    if state is not None:
        seen.append(("state.tokens", list(state.tokens)))
        seen.append(("state.max_draft_tokens", state.max_draft_tokens))
        seen.append(("state.step_index", state.step_index))
    if draft is not None:
        tree = draft.tree
        seen.append(("the draft's tokens", draft.tokens.tolist()))
        seen.append(("the draft tree's tokens", tree.tokens.tolist()))
        seen.append(("the draft's parents", tree.parents.tolist()))
        try:
            probs = draft.draft_probs
        except ValueError:  # blocks that disagree on carrying probabilities: the engine's error, later
            probs = None
        seen.append(("the draft's probabilities", None if probs is None else probs.clone()))
    return tuple(seen)


def _changed(before: tuple, after: tuple) -> Optional[str]:
    for (name, old), (_, new) in zip(before, after):
        same = (old is None) == (new is None) and (
            old is None or (torch.equal(old, new) if isinstance(old, torch.Tensor) else old == new)
        )
        if not same:
            return name
    return None


def decision(result: Any) -> Any:
    """A hook's result as comparable data: a stop's ints and Stops, a block's tokens, a verdict."""
    if isinstance(result, list):
        return tuple(decision(r) for r in result)
    if isinstance(result, Stop):
        return ("Stop", result.keep)
    if isinstance(result, DraftBlock):
        return ("block", tuple(result.tokens.tolist()))
    if isinstance(result, Verdict):
        return ("verdict", result.accepted, result.next_token, result.path)
    if isinstance(result, (set, frozenset, range)) or hasattr(result, "__iter__") and not isinstance(result, str):
        return tuple(sorted(int(i) for i in result))
    return result


def strategies(pm) -> list[tuple[str, Any]]:
    """The strategy objects an engine registered (``where:name`` -> object), not modules nor the check's."""
    return [
        (name, plugin)
        for name, plugin in pm.list_name_plugin()
        if not name.startswith(CHECK_PREFIX) and not isinstance(plugin, types.ModuleType)
    ]


MAX_STATE_LEAVES = 20_000  # values read from one strategy object's state; more are not compared


def state_of(obj: Any, depth: int = 6) -> dict[str, Any]:
    """An object's state as ``{attribute path: comparable value}``: numbers, strings, tensors (by
    their bytes), generators (by their state), read through attributes, attrs fields, lists, dicts
    and sets, ``depth`` levels deep. Models (anything with a ``forward``), modules, functions and
    classes are left out: their weights and caches are not a strategy's state."""
    leaves: dict[str, Any] = {}
    seen: set[int] = set()

    def visit(value: Any, path: str, left: int) -> None:
        if len(leaves) >= MAX_STATE_LEAVES:
            return
        if value is None or isinstance(value, (bool, int, str, bytes)):
            leaves[path] = value
        elif isinstance(value, float):
            leaves[path] = _Shown(repr(value))  # NaN equals NaN here
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu()
            t = t.float() if t.dtype == torch.bfloat16 else t
            digest = hashlib.sha1(t.contiguous().numpy().tobytes()).hexdigest()
            leaves[path] = (tuple(t.shape), str(value.dtype), digest)
        elif isinstance(value, torch.Generator):
            leaves[path] = hashlib.sha1(value.get_state().numpy().tobytes()).hexdigest()
        elif (
            left <= 0
            or id(value) in seen
            or callable(getattr(value, "forward", None))
            or isinstance(value, (types.ModuleType, types.FunctionType, types.MethodType, type, torch.nn.Module))
        ):
            return
        else:
            seen.add(id(value))
            if isinstance(value, dict):
                for key in sorted(value, key=repr):
                    visit(value[key], f"{path}[{key!r}]", left - 1)
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    visit(item, f"{path}[{i}]", left - 1)
            elif isinstance(value, (set, frozenset)):
                leaves[path] = tuple(sorted(map(repr, value)))
            else:
                names = [f.name for f in attrs.fields(type(value))] if attrs.has(type(value)) else []
                names += list(getattr(value, "__dict__", {}))
                for name in dict.fromkeys(names):
                    if hasattr(value, name):
                        visit(getattr(value, name), f"{path}.{name}" if path else name, left - 1)

    visit(obj, "", depth)
    return leaves


class _Shown(str):
    """A float's repr, compared as text (so NaN equals NaN) and shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> Optional[tuple[str, Any, Any]]:
    """The first attribute path whose value differs between two ``state_of`` results."""
    for key in list(a) + [k for k in b if k not in a]:
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            return key, a.get(key, "<absent>"), b.get(key, "<absent>")
    return None


# -- tiny pairs and the stack's stand-in artifacts -----------------------------------------------------
class Pairs:
    """The tiny models (built once) and the artifacts the stack's components read, made for them:
    a random feature-level draft for ``eagle``, a random block draft for ``dflash``, a random mask
    embedding beside the tiny draft for ``pard``, a random M_B for ``pacer``."""

    def __init__(self, folder: Path):
        from pacer_core.hf.tiny import noisy_copy, tiny_llama

        self.folder = folder
        self.models = {
            "target": tiny_llama(0),
            "eos_target": tiny_llama(0, eos_bias=EOS_BIAS),
            "dist_target": tiny_llama(0, vocab=16, scale=25.0),
        }
        self.models["draft"] = noisy_copy(self.models["target"], 0.1, seed=123)
        self.models["eos_draft"] = noisy_copy(self.models["eos_target"], 0.1, seed=123)
        self.models["dist_draft"] = noisy_copy(self.models["dist_target"], 0.3, seed=1)
        self._made: dict[tuple[str, int], str] = {}

    def pair(self, kind: str = "", eos: bool = False):
        """(target, draft) adapters, fresh (each engine owns its models' caches)."""
        from pacer_core.hf.tiny import tiny_model

        prefix = f"{kind}_" if kind else ""
        return tiny_model(self.models[prefix + "target"], eos=eos), tiny_model(self.models[prefix + "draft"], eos=eos)

    def standins(self, stack, target) -> list[str]:
        """Overrides pointing the stack's artifact-reading components at stand-ins for ``target``."""
        extra = []
        for top in stack:
            for part in top.walk():
                key = part.where.replace("[", ".").replace("]", "")
                if part.component.name == "eagle":
                    extra.append(f"{key}.path={self._eagle(target)}")
                if part.component.name == "dflash":
                    extra.append(f"{key}.path={self._dflash(target)}")
                if part.component.name == "pacer" and getattr(part.config, "checkpoint", 0) is None:
                    extra.append(f"{key}.checkpoint={self._mb(target)}")
        return extra

    def stand_in_draft(self, stack, draft) -> None:
        """Give the tiny ``draft`` what the stack's draft-reading components read beside a draft model:
        for ``pard``, a folder with a random mask embedding (block 4) as the draft's folder."""
        if any(part.component.name == "pard" for top in stack for part in top.walk()):
            draft.folder = self._pard(draft.hidden_size)

    def _pard(self, hidden_size: int) -> Path:
        from pacer_plugins.block_draft.pard_files import save_pard_files

        key = ("pard", hidden_size)
        if key not in self._made:
            folder = self.folder / f"pard-{hidden_size}"
            folder.mkdir(parents=True, exist_ok=True)
            with _seeded(0):
                save_pard_files(folder, torch.randn(hidden_size), 4)
            self._made[key] = str(folder)
        return Path(self._made[key])

    def _eagle(self, target) -> str:
        from pacer_plugins.eagle.model import ArchConfig, FeatureDraft

        key = ("eagle", target.vocab_size)
        if key not in self._made:
            folder = self.folder / f"eagle-{target.vocab_size}"
            arch = ArchConfig(
                hidden_size=target.hidden_size,
                vocab_size=target.vocab_size,
                subset_size=min(48, target.vocab_size),
                intermediate_size=64,
                **attrs.asdict(target.attention_shape()),
            )
            with _seeded(0):
                net = FeatureDraft(arch)
            net.subset.copy_(torch.arange(arch.subset_size))
            net.save(folder, {"target_digest": None})
            self._made[key] = str(folder)
        return self._made[key]

    def _dflash(self, target) -> str:
        from pacer_plugins.block_draft.model import BlockArch, BlockDraft, save_block_draft

        key = ("dflash", target.vocab_size)
        if key not in self._made:
            folder = self.folder / f"dflash-{target.vocab_size}"
            arch = BlockArch(
                hidden_size=target.hidden_size,
                intermediate_size=64,
                vocab_size=target.vocab_size,
                subset_size=min(48, target.vocab_size),
                target_layers=[0, 1],
                block=4,
                **attrs.asdict(target.attention_shape()),
            )
            with _seeded(0):
                net = BlockDraft(arch)
            net.subset.copy_(torch.arange(arch.subset_size))
            save_block_draft(net, folder, {"target_digest": None})
            self._made[key] = str(folder)
        return self._made[key]

    def _mb(self, target) -> str:
        from pacer_plugins.pacer_stop.model import PreVerifier, PreVerifierArch

        key = ("mb", target.hidden_size)
        if key not in self._made:
            folder = self.folder / f"mb-{target.hidden_size}"
            with _seeded(0):
                net = PreVerifier(
                    PreVerifierArch(input_size=target.hidden_size, width=16, heads=2, ffn_size=32, max_positions=16)
                )
            net.save(folder, {"target_digest": None, "draft_identity": None})
            self._made[key] = str(folder)
        return self._made[key]


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


# -- the stack under test --------------------------------------------------------------------------
class Stack:
    """The stack as the user gave it (config file, overrides, plugin modules), built into engines on
    the tiny pairs with the check's own overrides on top."""

    def __init__(self, config: Optional[str], overrides: Sequence[str], plugins: Sequence[Any], pairs: Pairs):
        self.config, self.overrides, self.plugins, self.pairs = config, list(overrides), list(plugins), pairs
        self.last_watch: Optional[Watch] = None  # the latest watched engine's (the isolation check reads it)
        self.stack = load_plan(config, self.overrides, extra_plugins=self.plugins, require_models=False).stack
        self.needs_draft = self.stack.needs("draft_model")
        verifier = self.stack.verifier.component
        # a greedy-only verifier (``needs greedy``) is replaced by speculative_sampling when sampling
        self.sampling_verifier = None if "greedy" not in verifier.needs else "speculative_sampling"

    def engine(
        self,
        target,
        draft,
        extra: Sequence[str] = (),
        *,
        sampling: Optional[dict] = None,
        verifier: Optional[str] = None,
        watch: bool = True,
    ) -> Engine:
        extra = list(extra)
        if sampling is not None:
            extra += [f"sampling.{k}={v}" for k, v in {"top_k": 0, "top_p": 1.0, **sampling}.items()]
            verifier = verifier or self.sampling_verifier
        else:
            extra += ["sampling.temperature=0"]
        if verifier is not None:
            extra.append(f"strategy.verifier={{name: {verifier}}}")
        overrides = self.overrides + self.pairs.standins(self.stack, target) + extra
        plan = load_plan(self.config, overrides, extra_plugins=self.plugins, require_models=False)
        truth = Truth()
        if watch:
            plan.pm.register(truth, name=f"{CHECK_PREFIX}truth")
            self.last_watch = Watch(plan.pm).install()
        used = None
        if self.needs_draft:
            self.pairs.stand_in_draft(self.stack, draft)
            used = WatchedLM(draft, truth) if watch else draft
        return Engine.build(target, draft=used, plan=plan, max_draft_tokens=16)

    def plain(self, target, *, sampling: Optional[dict] = None) -> Engine:
        """The target's own decoding through the engine: the autoregressive drafter, no stop."""
        extra = [
            "strategy.drafter={name: autoregressive}",
            "strategy.stop=[]",
            "strategy.observers=[]",
            "strategy.verifier={name: greedy}"
            if sampling is None
            else "strategy.verifier={name: speculative_sampling}",
        ]
        settings = {"temperature": 0, "top_k": 0, "top_p": 1.0, **(sampling or {})}
        extra += [f"sampling.{k}={v}" for k, v in settings.items()]
        return Engine.build(target, plan=load_plan(None, extra, require_models=False))


def expect_equal(got: Sequence[int], want: Sequence[int], what: str) -> None:
    if list(got) != list(want):
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise AssertionError(
            f"{what}: differs at new token {at} (got {list(got)[at : at + 4]}, want {list(want)[at : at + 4]})"
        )

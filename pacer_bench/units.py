"""What runs per prompt: a ``Unit`` is a strategy stack on the engine, or one of transformers' own
``generate`` baselines; both decode the same prompt ids with the models loaded once (``Models``)."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import attrs

from pacer_core.config import RunPlan, to_dict
from pacer_core.engine import DraftSource, Engine, draft_model_source
from pacer_core.errors import InputError
from pacer_core.metrics import step_metrics

from .answers import shown_path
from .config import HF_BASELINES, BenchConfig, model_config


@attrs.define
class Models:
    target: Any
    draft: Any = None
    tokenizer: Any = None


def load_models(bench: BenchConfig) -> Models:
    """Load the bench's target (and draft) once. Tests replace this function to inject tiny models."""
    from pacer_core.hf import load_draft, load_section

    target, tokenizer, _ = load_section(model_config(bench.target, bench), "target")
    draft = None
    if bench.draft is not None:
        if not bench.draft.path:
            raise InputError("bench draft section needs a path: an HF folder or .gguf sharing the target's tokenizer")
        draft = load_draft(model_config(bench.draft, bench), tokenizer)
    return Models(target, draft, tokenizer)


@attrs.define
class Unit:
    name: str
    kind: str  # "stack" | "baseline"
    run: Callable[[list[int], int, int], tuple[list[int], dict, str]]  # (ids, repeat, budget) → tokens, metrics, finish
    description: dict
    cost_kind: Optional[str] = None  # how cost profiles price its draft forwards (Component.cost_kind)
    draft: Optional[dict] = None  # the draft weights it reads: {folder, identity} (draft_entry); None: none


def draft_entry(source: Optional[DraftSource]) -> Optional[dict]:
    """A unit's ``draft`` in bench.json: the folder of the draft weights it reads (as the report shows a
    path: relative when inside the working folder) and their identity; None when it reads no draft."""
    if source is None:
        return None
    return {"folder": None if source.folder is None else shown_path(source.folder), "identity": source.identity}


def engine_unit(name: str, plan: RunPlan, models: Models, bench: BenchConfig, clock, forwards: Any = None) -> Unit:
    """Stack ``name``: an engine built once around the shared models, on the stack's run plan
    (``pacer_bench.config.plan_stack``). ``clock`` (synchronised on a
    GPU) times each whole generation; the engine's per-step split runs on the host clock, adding no
    sync of its own (each phase ends in a host read of its result anyway: docs/gpu.md). ``forwards``
    (a ``hosttime.ForwardClock`` shared by the units, on a CPU) times the model forwards, so the
    record's ``forward_s`` leaves the host time per step (docs/host-time.md)."""
    engine = Engine.build(
        models.target, draft=models.draft, tokenizer=models.tokenizer, plan=plan, clock=time.perf_counter
    )
    if forwards is not None:
        forwards.watch_engine(engine)

    def run(ids: list[int], repeat: int, budget: int):
        spent = forwards.seconds if forwards is not None else 0.0
        start = clock()
        result = engine.generate(ids, max_new_tokens=budget, seed=bench.sampling.seed + repeat)
        wall = clock() - start
        metrics = dict(result.metrics, wall_s=wall, tokens_per_s=len(result.tokens) / wall if wall > 0 else 0.0)
        if forwards is not None:
            metrics["forward_s"] = forwards.seconds - spent
        return list(result.tokens), metrics, result.finish_reason

    description = {k: v for k, v in to_dict(plan.config).items() if k in ("sampling", "generation", "strategy")}
    return Unit(name, "stack", run, description, engine.draft_cost_kind, draft_entry(engine.draft_source))


def hf_unit(name: str, models: Models, bench: BenchConfig, clock) -> Unit:
    """transformers' ``generate`` as configured for baseline ``name`` (traced: steps, drafts, timings)."""
    from pacer_core.hf import hf_generate_traced

    o, s = bench.baseline_options, bench.sampling
    assistant = models.draft if HF_BASELINES[name] else None
    kwargs: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    if name == "hf_prompt_lookup":
        kwargs = {
            "prompt_lookup_num_tokens": o.prompt_lookup_num_tokens,
            "max_matching_ngram_size": o.max_matching_ngram_size,
        }
    elif name == "hf_assisted_constant":
        settings = {
            "num_assistant_tokens": o.assisted_gamma,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        }
    elif name == "hf_assisted_heuristic":
        settings = {
            "num_assistant_tokens": o.assisted_gamma,
            "num_assistant_tokens_schedule": "heuristic",
            "assistant_confidence_threshold": 0.0,
        }
    elif name == "hf_assisted_confidence":
        settings = {
            "num_assistant_tokens": o.confidence_max_tokens,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": o.confidence_threshold,
        }
    if s.temperature > 0:
        kwargs.update(do_sample=True, temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    eos = set() if bench.ignore_eos else set(models.target.eos_token_ids)
    description = {"baseline": name, "generate_kwargs": dict(kwargs), "assistant_settings": dict(settings)}

    def run(ids: list[int], repeat: int, budget: int):
        if s.temperature > 0:
            import torch

            torch.manual_seed(s.seed + repeat)
        tokens, trace, after = hf_generate_traced(
            models.target,
            ids,
            budget,
            ignore_eos=bench.ignore_eos,
            assistant=assistant,
            assistant_settings=settings or None,
            clock=clock,
            **kwargs,
        )
        settings.update(after)  # transformers' heuristic schedule carries over to the next prompt
        accepted = [max(0, min(e - 1, d)) for e, d in zip(trace["accept_lengths"], trace["drafted_per_step"])]
        metrics = {
            "new_tokens": len(tokens),
            "wall_s": trace["wall_s"],
            "tokens_per_s": len(tokens) / trace["wall_s"] if trace["wall_s"] > 0 else 0.0,
            "target_forwards": trace["target_forwards"],
            "draft_forwards": trace["draft_forwards"],
        }
        metrics.update(step_metrics(trace["accept_lengths"], trace["drafted_per_step"], accepted))
        metrics.update(verify_s=trace["verify_s"], draft_s=max(0.0, trace["wall_s"] - trace["verify_s"]), stop_s=0.0)
        finish = "eos" if tokens and tokens[-1] in eos else "length"
        return tokens, metrics, finish

    source = None if assistant is None else draft_model_source(assistant, assistant.digest)
    return Unit(name, "baseline", run, description, draft=draft_entry(source))

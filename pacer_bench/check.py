"""``pacer check``: what a strategy stack must pass to call itself lossless (docs/writing-plugins.md).

The checks (``pacer_bench.conformance`` builds the tiny models and engines):

- ``greedy``: greedy output equals the target's own greedy decoding, by the engine's
  ``autoregressive`` drafter and by transformers' ``generate``: several prompts, budgets ending
  inside a draft, EOS inside a draft, a prompt + budget filling the target's whole context;
- ``distribution``: sampled continuations (T 0.7 and 1.0, with and without top-k / top-p) against
  the target's exact distribution, a chi-square test whose cases together fail a correct stack
  with probability ``FALSE_ALARM``;
- ``sample_match``: the stack with the ``sample_match`` verifier, sampled, is token for token plain
  sampling with the same seed;
- ``repeatability``: the same seed gives the same sampled output on one engine and on two;
- ``isolation``: under sampling a generation decides as a fresh engine's would (every hook's result,
  step by step) and every strategy object starts generations 2 onwards in the same state;
- ``options``: every option of the stack's components, given a value of the wrong type or out of
  range, is refused with one line or decodes; never a traceback.

Before them the ``load`` row imports the ``--plugin`` modules and builds the stack: a module that
raises (``SystemExit`` included) or offers a wrong component list fails it. Every failure of a
plugin is a failing row naming the plugin, the hook, the case and its rerun command; the exit
status is 0 only when every check ran and passed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import attrs

from pacer_core import ConfigError, InputError, PacerError, hookcheck
from pacer_core.commands import Runner, command
from pacer_core.errors import UnknownHookError

from .conformance import (
    CONTEXT,
    DIST_LENGTH,
    DIST_PROMPT,
    FALSE_ALARM,
    PROMPTS,
    QUICK_SAMPLINGS,
    SAMPLINGS,
    Case,
    Contract,
    Outcome,
    Pairs,
    Stack,
    expect_equal,
    first_difference,
)

CHECKS = ("greedy", "distribution", "sample_match", "repeatability", "isolation", "options")
SAMPLED = ("distribution", "sample_match", "repeatability", "isolation")  # not applicable to a greedy-only stack
LOAD = "load"  # the row of loading the --plugin modules and building the stack (before the checks)


# -- the cases -------------------------------------------------------------------------------------
def greedy_cases(s: Stack, quick: bool) -> Iterator[Case]:
    from pacer_core.hf.baselines import hf_generate

    budget = 16 if quick else 22

    def against_references(prompt, n, eos=False, kind="", context=None):
        def run():
            target, draft = s.pairs.pair(kind, eos=eos)
            if context is not None:
                target.max_length = context
            got = (
                s.engine(target, draft, [f"generation.ignore_eos={str(not eos).lower()}"])
                .generate(prompt, max_new_tokens=n)
                .tokens
            )
            expect_equal(
                got,
                s.plain(s.pairs.pair(kind, eos=eos)[0]).generate(prompt, max_new_tokens=n).tokens,
                "the stack against the engine's autoregressive decoding",
            )
            expect_equal(got, hf_generate(target, prompt, n, ignore_eos=not eos), "the stack against generate")

        return run

    for name, prompt in PROMPTS.items():
        yield Case(f"greedy/prompt={name}", against_references(prompt, budget))
    for n in (1, 3, 7) if quick else (1, 2, 3, 5, 7, 11):
        yield Case(f"greedy/budget={n}", against_references(PROMPTS["repetitive"], n))
    for name in ("one_token", "repetitive"):
        yield Case(f"greedy/eos-prompt={name}", against_references(PROMPTS[name], 22, eos=True, kind="eos"))
    prompt = PROMPTS["repetitive"]
    yield Case(f"greedy/context={CONTEXT}", against_references(prompt, CONTEXT - len(prompt), context=CONTEXT))


def distribution_cases(s: Stack, quick: bool) -> Iterator[Case]:
    from pacer_core.testing import chisquare_pvalue, exact_continuation_probs

    samplings = QUICK_SAMPLINGS if quick else tuple(SAMPLINGS)
    samples = 1000 if quick else 4000
    threshold = FALSE_ALARM / len(samplings)  # Bonferroni: all cases together fail a correct stack ≤ FALSE_ALARM

    def run_case(name):
        def run():
            target, draft = s.pairs.pair("dist")
            engine = s.engine(target, draft, ["generation.ignore_eos=true"], sampling=SAMPLINGS[name])
            outputs = [
                tuple(engine.generate(DIST_PROMPT, max_new_tokens=DIST_LENGTH, seed=seed).tokens)
                for seed in range(samples)
            ]
            expected = exact_continuation_probs(s.pairs.pair("dist")[0], DIST_PROMPT, DIST_LENGTH, engine.sampling)
            p_value = chisquare_pvalue(outputs, expected)
            if p_value < threshold:
                raise AssertionError(
                    f"{samples} sampled continuations are not the target's distribution: "
                    f"chi-square p = {p_value:.3g} < {threshold:.3g}"
                )

        return run

    for name in samplings:
        yield Case(f"distribution/{name}", run_case(name))


def sample_match_cases(s: Stack, quick: bool) -> Iterator[Case]:
    seeds = range(3 if quick else 10)
    budget = 16 if quick else 24

    def run_case(name, prompt_name):
        def run():
            target, draft = s.pairs.pair()
            engine = s.engine(
                target, draft, ["generation.ignore_eos=true"], sampling=SAMPLINGS[name], verifier="sample_match"
            )
            plain = s.plain(s.pairs.pair()[0], sampling=SAMPLINGS[name])
            for seed in seeds:
                prompt = PROMPTS[prompt_name]
                expect_equal(
                    engine.generate(prompt, max_new_tokens=budget, seed=seed).tokens,
                    plain.generate(prompt, max_new_tokens=budget, seed=seed).tokens,
                    f"seed {seed}: the stack with sample_match against plain sampling",
                )

        return run

    for name in ("t0.7", "t1.0"):
        for prompt_name in ("plain", "repetitive") if quick else tuple(PROMPTS):
            yield Case(f"sample_match/{name}-prompt={prompt_name}", run_case(name, prompt_name))


def repeatability_cases(s: Stack, quick: bool) -> Iterator[Case]:
    def run_case(name):
        def run():
            prompt = PROMPTS["plain"]
            first = s.engine(*s.pairs.pair(), ["generation.ignore_eos=true"], sampling=SAMPLINGS[name])
            second = s.engine(*s.pairs.pair(), ["generation.ignore_eos=true"], sampling=SAMPLINGS[name])
            for seed in range(2 if quick else 5):
                a = first.generate(prompt, max_new_tokens=16, seed=seed).tokens
                expect_equal(
                    first.generate(prompt, max_new_tokens=16, seed=seed).tokens,
                    a,
                    f"seed {seed}: the same engine's second run",
                )
                expect_equal(
                    second.generate(prompt, max_new_tokens=16, seed=seed).tokens, a, f"seed {seed}: a second engine"
                )

        return run

    for name in ("t0.7", "t1.0"):
        yield Case(f"repeatability/{name}", run_case(name))


def isolation_cases(s: Stack, quick: bool) -> Iterator[Case]:
    generations = 3 if quick else 5

    def run_case(name):
        def run():
            prompt, budget, seed = PROMPTS["plain"], 16, 3
            extra = ["generation.ignore_eos=true"]
            used = s.engine(*s.pairs.pair(), extra, sampling=SAMPLINGS[name])
            watch = s.last_watch
            logs = []
            for _ in range(generations):
                watch.log = []
                used.generate(prompt, max_new_tokens=budget, seed=seed)
                logs.append(watch.log)
            fresh = s.engine(*s.pairs.pair(), extra, sampling=SAMPLINGS[name])
            fresh_watch = s.last_watch
            fresh_watch.log = []
            fresh.generate(prompt, max_new_tokens=budget, seed=seed)
            for g, log in enumerate(logs[1:] + [fresh_watch.log], start=2):
                _same_decisions(logs[0], log, "a fresh engine's" if g > generations else f"generation {g}'s", watch)
            for g in range(2, generations):  # generation 1 may fill caches; from 2 on, every start is the same
                for plugin, state in watch.starts[1].items():
                    diff = first_difference(state, watch.starts[g][plugin])
                    if diff is not None:
                        path, was, now = diff
                        raise AssertionError(
                            f"{plugin} starts generation {g + 1} with {path} = {now!r} where generation 2 started "
                            f"with {was!r}: under sampling every generation must start from the same state "
                            "(reset it in pacer_start)"
                        )

        return run

    for name in ("t0.7",) if quick else ("t0.7", "t1.0-topk4"):
        yield Case(f"isolation/{name}", run_case(name))


def _same_decisions(want: list, got: list, what: str, watch) -> None:
    """Refuse a generation whose hooks decided otherwise than generation 1's on the same prompt and seed."""
    for i, (a, b) in enumerate(zip(want, got)):
        if a != b:
            hook = a[0]
            step = sum(1 for entry in want[:i] if entry[0] == "pacer_verify")
            who = " or ".join(watch.names(hook)) or "?"
            raise AssertionError(
                f"{who}: {hook} decides {b[1]!r} at step {step} of {what} run where generation 1 decided {a[1]!r} "
                "(same prompt and seed): under sampling every generation must start from the same state "
                "(reset it in pacer_start)"
            )
    if len(want) != len(got):
        raise AssertionError(
            f"{what} run makes {len(got)} hook decisions where generation 1 made {len(want)} "
            "(same prompt and seed): under sampling every generation must start from the same state"
        )


def _bad_values(field: attrs.Attribute) -> list[Any]:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    kind = str(kind)
    if "bool" in kind:
        return ["'not-a-bool'"]
    if "int" in kind or "float" in kind:
        return ["'not-a-number'", -1, 0] if "int" in kind else ["'not-a-number'", -1.0, 0.0]
    return []


def option_cases(s: Stack, quick: bool) -> Iterator[Case]:
    seen = set()
    for top in s.stack:
        for part in top.walk():
            key = part.where.replace("[", ".").replace("]", "")
            for field in attrs.fields(type(part.config)):
                values = _bad_values(field)
                if field.name == "members" or not values or (key, field.name) in seen:
                    continue
                seen.add((key, field.name))
                yield Case(f"options/{part.component.name}.{field.name}", _option_case(s, key, part, field, values))


def _option_case(s: Stack, key: str, part, field, values):
    def run():
        for value in values:
            override = f"{key}.{field.name}={value}"
            try:
                target, draft = s.pairs.pair()
                engine = s.engine(target, draft, ["generation.ignore_eos=true", override], watch=False)
                engine.generate(PROMPTS["plain"], max_new_tokens=6)
            except (ConfigError, InputError) as exc:
                if "\n" in str(exc) or not str(exc).strip():
                    raise AssertionError(f"{override} is refused, but not in one line: {str(exc)!r}")
                continue
            except Exception as exc:  # noqa: BLE001 - any other error is a traceback for the user
                raise AssertionError(
                    f"{override} fails with {type(exc).__name__}: {_first_line(exc)} "
                    "(refuse it with pacer_core.InputError, or check it in the config's "
                    "__attrs_post_init__)"
                ) from None
            if isinstance(value, str):
                raise AssertionError(f"{override} (a string for a {field.type} option) is accepted")

    return run


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


BUILDERS = {
    "greedy": greedy_cases,
    "distribution": distribution_cases,
    "sample_match": sample_match_cases,
    "repeatability": repeatability_cases,
    "isolation": isolation_cases,
    "options": option_cases,
}


# -- running ---------------------------------------------------------------------------------------
def run_checks(s: Stack, *, quick: bool, only: Optional[str] = None, progress=None) -> list[Outcome]:
    outcomes = []
    greedy_only = [
        part.component.name
        for top in s.stack
        if top is not s.stack.verifier
        for part in top.walk()
        if "greedy" in part.component.needs
    ]
    for name in CHECKS:
        outcome = Outcome(name)
        if greedy_only and name in SAMPLED:
            outcome.note = f"not applicable: {greedy_only[0]} decodes greedily only"
            if only is None:
                outcomes.append(outcome)
            continue
        if name == "distribution" and s.sampling_verifier:
            outcome.note = f"verifier {s.sampling_verifier} (the stack's verifies greedy only)"
        start = time.perf_counter()
        for case in BUILDERS[name](s, quick):
            if only is not None and case.id != only:
                continue
            outcome.cases += 1
            if progress:
                progress(case.id)
            outcome.failed, outcome.reason = run_case(case)
            if outcome.failed:
                break
        outcome.seconds = round(time.perf_counter() - start, 1)
        if only is None or outcome.cases:
            outcomes.append(outcome)
    return outcomes


def run_case(case: Case) -> tuple[Optional[str], str]:
    """Run one case: (None, "") when it passes, else (its id, one line saying why). Whatever a plugin
    raises, ``SystemExit`` included, fails the case; only an interrupt (Ctrl-C) stops the check."""
    try:
        case.run()
    except (AssertionError, Contract, PacerError) as exc:
        return case.id, _first_line(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a component that crashes (or exits) fails the case, named
        where = hookcheck.origin(exc)
        return case.id, hookcheck.describe(exc) + (f" at {where}" if where else "")
    return None, ""


class PluginFailure(Exception):
    """A ``--plugin`` module that was found but is broken: it fails the load row (not a usage error)."""


def load_plugin(spec: str) -> Any:
    """A ``--plugin`` module: an importable name or a .py file; it must offer components. A module
    that cannot be found is a usage error (``InputError``); one that raises (``SystemExit`` included)
    on import or in ``pacer_components``, or offers a wrong list, is a ``PluginFailure``."""
    if spec.endswith(".py") and not Path(spec).is_file():
        raise InputError(f"--plugin '{spec}' is not a file: give a module name or a .py file")
    try:
        if spec.endswith(".py"):
            path = Path(spec)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
    except KeyboardInterrupt:
        raise
    except ModuleNotFoundError as exc:
        if exc.name != spec.split(".")[0] and exc.name != spec:
            raise PluginFailure(f"--plugin '{spec}' does not import ({hookcheck.describe(exc)})") from None
        raise InputError(
            f"--plugin '{spec}' does not import ({type(exc).__name__}: {_first_line(exc)}): "
            "fix the module or install it"
        ) from None
    except BaseException as exc:  # noqa: BLE001 - whatever the module raises (or exits with) on import
        where = hookcheck.origin(exc)
        raise PluginFailure(
            f"--plugin '{spec}' raised {hookcheck.describe(exc)} on import" + (f" at {where}" if where else "")
        ) from None
    offer = getattr(module, "pacer_components", None)
    if not callable(offer):
        raise InputError(
            f"--plugin '{spec}' offers no components: define a pacer_components() hook "
            "returning its Component list (docs/writing-plugins.md)"
        )
    try:
        offered = offer()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise PluginFailure(f"--plugin '{spec}': pacer_components raised {hookcheck.describe(exc)}") from None
    problem = None if offered is None else hookcheck.result_problem("pacer_components", offered)
    if problem is not None:
        raise PluginFailure(f"--plugin '{spec}': pacer_components {problem}")
    if not offered:
        raise InputError(
            f"--plugin '{spec}' offers no components: define a pacer_components() hook "
            "returning its Component list (docs/writing-plugins.md)"
        )
    return module


def repro_command(args: argparse.Namespace, case_id: str) -> str:
    parts = ["pacer", "check"]
    if args.config:
        parts += ["-c", args.config]
    for plugin in args.plugin:
        parts += ["--plugin", plugin]
    if args.quick:
        parts.append("--quick")
    return shlex.join(parts + list(args.overrides) + ["--case", case_id])


def table(outcomes: Sequence[Outcome], args: argparse.Namespace) -> str:
    rows = [("check", "cases", "verdict", "seconds", "first failing case")]
    for o in outcomes:
        verdict = "FAIL" if o.failed else ("pass" if o.cases else "n/a")
        failing = f"{o.failed}: {o.reason}  rerun: {repro_command(args, o.failed)}" if o.failed else o.note
        rows.append((o.check, str(o.cases), verdict, f"{o.seconds:.0f}", failing))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + " | " + r[4] for r in rows)


@command("check", "prove a strategy stack lossless on tiny models: greedy, exact distribution, options, seeds")
def _setup_check(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "--config", "-c", metavar="YAML", help="run config naming the stack (defaults apply to keys it omits)"
    )
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module (name or .py file) offering components; repeat for several",
    )
    p.add_argument("--quick", action="store_true", help="fewer cases and samples (what CI runs)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--case", metavar="ID", help="run one case (its id as the table names it)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. strategy.stop.0.gamma=3")

    def run(args: argparse.Namespace) -> int:
        start = time.perf_counter()
        try:
            outcomes = check_all(args)
        except PacerError as exc:  # a usage error: one line on stderr (exit 2); --json still prints its result
            if args.json:
                print(
                    json.dumps(
                        {
                            "passed": False,
                            "seconds": round(time.perf_counter() - start, 1),
                            "error": str(exc),
                            "checks": [],
                        }
                    )
                )
            raise
        passed = bool(outcomes) and all(o.passed for o in outcomes)
        if args.json:
            print(
                json.dumps(
                    {
                        "passed": passed,
                        "seconds": round(time.perf_counter() - start, 1),
                        "checks": [
                            dict(
                                attrs.asdict(o),
                                passed=o.passed,
                                rerun=repro_command(args, o.failed) if o.failed else None,
                            )
                            for o in outcomes
                        ],
                    }
                )
            )
        else:
            print(table(outcomes, args))
            print(f"\n{'all checks pass' if passed else 'FAILED'} ({time.perf_counter() - start:.0f} s)")
        return 0 if passed else 1

    return run


def check_all(args: argparse.Namespace) -> list[Outcome]:
    """The load row (the --plugin modules, then the stack built on the tiny pair), then the checks.
    A broken plugin fails the load row and no check runs; a usage error raises ``PacerError``."""
    import torch

    if args.case is not None and args.case.split("/")[0] not in (LOAD, *CHECKS):
        raise InputError(f"--case '{args.case}' names no check: ids start with one of {', '.join((LOAD, *CHECKS))}")
    load, plugins, begun = Outcome(LOAD), [], time.perf_counter()
    for spec in args.plugin:
        load.cases += 1
        try:
            plugins.append(load_plugin(spec))
        except PluginFailure as exc:
            load.failed, load.reason = f"{LOAD}/plugin={spec}", str(exc)
            load.seconds = round(time.perf_counter() - begun, 1)
            return [load]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models lose time to thread synchronisation
    try:
        with tempfile.TemporaryDirectory(prefix="pacer-check-") as folder:
            load.cases += 1
            built: list[Stack] = []
            refused: list[PacerError] = []

            def build():
                try:
                    built.append(_can_build(Stack(args.config, args.overrides, plugins, Pairs(Path(folder)))))
                except (ConfigError, InputError) as exc:  # the user's stack or config: one line, exit 2
                    refused.append(exc)

            load.failed, load.reason = run_case(Case(f"{LOAD}/stack", build))
            if refused:
                raise refused[0]
            load.seconds = round(time.perf_counter() - begun, 1)
            if load.failed or (args.case or "").startswith(f"{LOAD}/"):
                return [load]
            say = None if args.json else (lambda case: print(f"  {case}", file=sys.stderr, flush=True))
            outcomes = run_checks(built[0], quick=args.quick, only=args.case, progress=say)
    finally:
        torch.set_num_threads(threads)
    if args.case is not None and not outcomes:
        raise InputError(f"--case '{args.case}' is no case of this stack: run without --case to see the ids")
    return [load, *outcomes]


def _can_build(s: Stack) -> Stack:
    """``s``, once built and run on the tiny pair; refused in one line when the check cannot build it
    there (say which and why). A plugin failing otherwise is left to the cases, which name it."""
    try:
        target, draft = s.pairs.pair()
        engine = s.engine(target, draft, ["generation.ignore_eos=true"], watch=False)
        engine.generate(PROMPTS["plain"], max_new_tokens=2)
    except UnknownHookError as exc:  # the plugin's own mistake, named in full: no word about the tiny pair
        raise InputError(_first_line(exc)) from None
    except (ConfigError, InputError) as exc:
        raise InputError(
            f"pacer check cannot build a tiny pair for drafter '{s.stack.drafter.component.name}': {_first_line(exc)}"
        ) from None
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - a plugin's own failure: the checks' cases report it, named
        pass
    return s

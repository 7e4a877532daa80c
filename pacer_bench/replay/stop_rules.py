"""``pacer replay-stop``: noise-free replay of stop rules on held-out simulated steps (docs/pacer.md).

A bench tool beside the bench's own replay (``pacer replay``): it compares the stops of two plugin
packages (``pacer_stop``'s and ``entropy_stop``'s rules) on the chain replays of ``chains.py``, which
only the bench may do, since no plugin imports another or the bench.

A ``pacer train-preverify`` run folder holds, for every simulated step, what M_B reads (the draft's
hidden states of a ``data.window``-token draft), the draft's confidence features (log q(x), H(q))
and the verifier's labels (1 for the accepted prefix, then 0). On the held-out items (never
trained on), each rule is replayed step by step: the ``pacer`` stop's own hook (``PacerStop``) is
driven with the stored predictions (M_B's, computed once, or the draft's cumulative confidence) as
a drafter offering the window's tokens; it returns how many tokens were drafted and how many sent.
A step then accepts min(sent, accepted in the window) tokens, emits one more, and costs
``cost.step(drafted, sent=sent)`` seconds of the measured cost model. No clock runs: the same
inputs give the same table.

Compared: every fixed window γ, the oracle (drafts exactly the accepted tokens) and the
cost-optimal oracle (``chains.py``), the ``confidence`` stop's rule (stop after the first
token with q(x) < t), the ``entropy`` stop's rule (stop after the first token whose bound
1 − sqrt(γ · H(q)) is below λ; with its online calibration of λ, and without it, which is ``svip``
with h = 1 − λ) and grids of the ``pacer`` stop's rules over both predictors. Like the
bench's oracle replay it treats the logged steps as independent situations (a shorter draft would
have started the next step elsewhere).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import attrs
import torch

from pacer_core import Draft, DraftBlock, InputError, Stop
from pacer_core.commands import command
from pacer_core.cost_profiles import CostModel, cost_model
from pacer_core.jsonfile import read_json
from pacer_plugins.entropy_stop import rules as entropy_rules
from pacer_plugins.pacer_stop.metrics import position_report
from pacer_plugins.pacer_stop.policy import DEFAULT_CHECKPOINT, PacerStop, PacerStopConfig, checkpoint_folder
from pacer_plugins.pacer_stop.rules import cumulative_confidence

from .chains import Replay, captured_share, replay_best, replay_fixed, replay_oracle
from .steplog import LoggedStep

RECALIBRATE = attrs.fields(PacerStopConfig).recalibrate.default  # the stop's own prior (None: none)


@attrs.frozen
class HeldOutStep:
    """One simulated step: its predictions ([window] each) and how many window tokens were accepted."""

    mb: torch.Tensor  # M_B's p_i, float64
    confidence: torch.Tensor  # Π_{j≤i} q_j(x_j), float64
    accepted: int
    item: int
    entropy: Optional[torch.Tensor] = None  # H(q_i) in nats, float64 (None: not replayed)

    @property
    def window(self) -> int:
        return len(self.confidence)


class StoredPredictor:
    """Plays back a step's stored predictions to a ``PacerStop`` (``predictor(hidden, start)``)."""

    def __init__(self):
        self.values = torch.zeros(0, dtype=torch.float64)

    def reset(self) -> None:
        pass

    def __call__(self, hidden, start: int, confidence=None) -> torch.Tensor:
        return self.values[start : start + len(hidden)]


def drive(policy: PacerStop, available: int) -> tuple[int, int]:
    """The engine's drafting loop with ``policy`` alone and a drafter offering ``available`` tokens
    (what is asked, one block per call): (tokens drafted, tokens sent to the target)."""
    draft = Draft()
    while True:
        answer = policy.pacer_draft_more(state=None, draft=draft)
        if isinstance(answer, Stop):
            return len(draft), len(draft) if answer.keep is None else min(answer.keep, len(draft))
        n = len(draft)
        k = min(int(answer), available - n)
        if k <= 0:
            return n, n  # the window is spent
        draft = draft.extend(DraftBlock(tokens=torch.zeros(k, dtype=torch.long), hidden_states=torch.zeros(k, 1)))


def replay_policy(steps: Sequence[HeldOutStep], config: PacerStopConfig, cost: Optional[CostModel]) -> Replay:
    """The ``pacer`` stop with ``config`` replayed on ``steps`` (in order; a new generation at each
    new item, λ kept across them as under greedy decoding)."""
    predictor = StoredPredictor()
    policy = PacerStop(config, predictor, cost=cost if config.rule == "throughput" else None)
    charge = cost if cost is not None else CostModel((1.0,))
    emitted, seconds, item = 0, 0.0, None
    for step in steps:
        if step.item != item:
            policy.start_generation(greedy=True)
            item = step.item
        predictor.values = step.mb if config.predictor == "mb" else step.confidence
        drafted, sent = drive(policy, min(step.window, config.max_draft))
        accepted = min(sent, step.accepted)
        policy.observe_outcome(sent, accepted, accepted + 1)
        emitted += accepted + 1
        seconds += charge.step(drafted, sent=sent)
    return Replay(emitted, seconds, len(steps))


def replay_confidence_stop(
    steps: Sequence[HeldOutStep], threshold: float, cost: CostModel, max_tokens: int = 20
) -> Replay:
    """The ``confidence`` stop (entropy_stop): draft until the first token with q(x) < threshold,
    which is still sent (the stop's pure rule, as ``replay_entropy_stop``)."""
    emitted, seconds = 0, 0.0
    for step in steps:
        q = torch.cat([step.confidence[:1], step.confidence[1:] / step.confidence[:-1].clamp_min(1e-300)])
        flagged = entropy_rules.first_below(q, threshold)
        sent = min(step.window if flagged is None else flagged + 1, max_tokens, step.window)
        emitted += min(sent, step.accepted) + 1
        seconds += cost.step(sent)
    return Replay(emitted, seconds, len(steps))


def replay_entropy_stop(
    steps: Sequence[HeldOutStep],
    gamma: float,
    threshold: float,
    adapt: bool,
    cost: CostModel,
    max_tokens: int = 20,
    adapt_rate: float = 0.05,
) -> Replay:
    """The ``entropy`` stop (entropy_stop, its pure rules): draft until the first token whose bound
    1 − sqrt(γ · H(q)) is below λ, which is still sent. With ``adapt``, λ = clip(λ₀ − δ, 0, 1) where
    δ is updated after every step from the judged tokens' outcomes, kept across items (greedy)."""
    emitted, seconds, offset = 0, 0.0, 0.0
    for step in steps:
        if step.entropy is None:
            raise InputError(
                "these held-out steps hold no draft entropies: simulate them again with `pacer train-preverify`"
            )
        bounds = entropy_rules.acceptance_bound(step.entropy, gamma)  # [window]
        lam = min(1.0, max(0.0, threshold - offset)) if adapt else threshold
        flagged = entropy_rules.first_below(bounds, lam)
        sent = min(step.window if flagged is None else flagged + 1, max_tokens, step.window)
        accepted = min(sent, step.accepted)
        emitted += accepted + 1
        seconds += cost.step(sent)
        if adapt:
            outcomes = entropy_rules.verified_outcomes(sent, accepted)
            offset = entropy_rules.calibrated_offset(offset, bounds[: len(outcomes)].tolist(), outcomes, adapt_rate)
    return Replay(emitted, seconds, len(steps))


# -- data ----------------------------------------------------------------------------------------
def load_heldout(run: Path, heldout_every: int) -> tuple[Any, list[int]]:
    """The held-out steps of a train-preverify run folder: (StepData, their indices). ``heldout_every``
    0 = every item (a folder simulated for evaluation only)."""
    from pacer_plugins.pacer_stop.train import SAMPLE_KEYS, StepData
    from pacer_train import load_run_file

    files = sorted((Path(run) / "samples").glob("item_*.pt"))
    if not files:
        raise InputError(
            f"'{run}' holds no simulated items (samples/item_*.pt): give a `pacer train-preverify` "
            "run folder (its simulate stage writes them)"
        )
    samples = []
    for path in files:
        sample = load_run_file(path, "simulated item")
        if not isinstance(sample, dict) or any(key not in sample for key in SAMPLE_KEYS):
            raise InputError(
                f"'{path}' is not a simulated item train-preverify wrote: delete it and rerun the simulation"
            )
        if heldout_every == 0 or int(sample["item"]) % heldout_every == 0:
            samples.append(sample)
    if not samples:
        raise InputError(
            f"'{run}' holds no held-out item (item number divisible by {heldout_every}): "
            "simulate them, or pass --heldout-every 0 for a folder simulated for evaluation only"
        )
    data = StepData.from_samples(samples)
    return data, list(range(len(data.lengths)))


def heldout_steps(data, mb_probs: torch.Tensor) -> list[HeldOutStep]:
    """Per step: M_B's predictions (``mb_probs``, all rows in step order), the draft's cumulative
    confidence and the accepted count."""
    steps = []
    offsets = data.offsets.tolist()
    for s in range(len(offsets) - 1):
        a, b = offsets[s], offsets[s + 1]
        labels = data.labels[a:b]
        steps.append(
            HeldOutStep(
                mb=mb_probs[a:b].double(),
                confidence=cumulative_confidence(data.confidence[a:b, 0].float()),
                accepted=int(labels.long().cumprod(0).sum()),
                item=int(data.step_item[s]),
                entropy=data.confidence[a:b, 1].double(),
            )
        )
    return steps


def mb_predictions(checkpoint: Path, data, steps: list[int]) -> torch.Tensor:
    from pacer_plugins.pacer_stop.model import PreVerifier
    from pacer_plugins.pacer_stop.train import predict_steps

    net = PreVerifier.load(checkpoint)
    if net.arch.input_size != data.hidden.shape[-1]:
        raise InputError(
            f"M_B '{checkpoint}' reads hidden states of size {net.arch.input_size}, the simulated "
            f"steps hold size {data.hidden.shape[-1]}: give the M_B trained for that run's pair"
        )
    longest = int(data.lengths.max())
    probs, _ = predict_steps(net, data, steps, max(longest, 16))
    return probs.double()


def read_cost_file(path: Path, draft_token_s: Optional[float], step_s: Optional[float]) -> CostModel:
    """A `pacer costs` file or a bench's cost_model.json (seconds); the options override its draft and
    step costs (a bench file has none; the draft tokens per forward stay the file's own)."""
    data = read_json(Path(path), "cost file", "give a `pacer costs` file or a bench's cost_model.json", expect=None)
    if not isinstance(data, dict) or not isinstance(data.get("verify_s"), list):
        raise InputError(f"'{path}' has no 'verify_s' list: give a `pacer costs` file or a bench's cost_model.json")
    if step_s is not None:
        data["step_s"] = step_s
    try:
        return cost_model(data, draft_token_s)
    except (ValueError, TypeError) as exc:
        raise InputError(f"cost file '{path}' holds no valid cost model ({exc})") from None


# -- the comparison ------------------------------------------------------------------------------
def compare(
    steps: Sequence[HeldOutStep],
    cost: CostModel,
    gammas: Iterable[int],
    blocks: Iterable[int],
    margins: Iterable[float],
    t0s: Iterable[float],
    confidences: Iterable[float],
    max_draft: int,
    entropy_gammas: Iterable[float] = (),
    entropy_thresholds: Iterable[float] = (),
    recalibrations: Sequence[Optional[float]] = (RECALIBRATE,),
) -> dict[str, Any]:
    """Simulated speedups of each rule and parameter on ``steps`` (sorted best first within each
    family), with the share of the oracle's gain over the best fixed γ each captures."""
    log = [LoggedStep(min(s.window, max_draft), min(s.accepted, max_draft)) for s in steps]
    fixed = {g: replay_fixed(log, g, cost).speedup(cost) for g in gammas if g <= max_draft}
    best_gamma = max(fixed, key=lambda g: (fixed[g], -g))
    oracle = replay_oracle(log, cost).speedup(cost)
    rows: list[dict[str, Any]] = []

    def add(family: str, params: dict[str, Any], replay: Replay) -> None:
        speedup = replay.speedup(cost)
        rows.append(
            {
                "family": family,
                **params,
                "speedup": speedup,
                "captured": captured_share(speedup, fixed[best_gamma], oracle),
            }
        )

    for threshold in confidences:
        add("confidence stop", {"t": threshold}, replay_confidence_stop(steps, threshold, cost, max_draft))
    entropy_thresholds = list(entropy_thresholds)
    for gamma in entropy_gammas:
        for threshold in entropy_thresholds:
            for adapt in (True, False):
                family = "entropy stop" if adapt else "entropy stop, no calibration (svip)"
                add(
                    family,
                    {"gamma": gamma, "λ0": threshold},
                    replay_entropy_stop(steps, gamma, threshold, adapt, cost, max_draft),
                )
    for predictor in ("mb", "draft_confidence"):
        for b in blocks:
            for margin, prior in itertools.product(margins, recalibrations):
                config = PacerStopConfig(
                    b=b, rule="throughput", predictor=predictor, margin=margin, max_draft=max_draft, recalibrate=prior
                )
                params = {"b": b, "margin": margin, "recalibrate": prior}
                add(f"throughput / {predictor}", params, replay_policy(steps, config, cost))
    for b in blocks:
        for t0 in t0s:
            config = PacerStopConfig(b=b, t0=t0, t_max=max(t0, 0.9), rule="paper", max_draft=max_draft)
            add("paper / mb", {"b": b, "t0": t0}, replay_policy(steps, config, cost))
    best_of: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["family"] not in best_of or row["speedup"] > best_of[row["family"]]["speedup"]:
            best_of[row["family"]] = row
    return {
        "steps": len(steps),
        "fixed": fixed,
        "best_fixed_gamma": best_gamma,
        "best_fixed_speedup": fixed[best_gamma],
        "oracle_speedup": oracle,
        "optimal_oracle_speedup": replay_best(log, cost).speedup(cost),
        "rows": rows,
        "best": best_of,
    }


def calibration(steps: Sequence[HeldOutStep]) -> dict[str, list[dict[str, Any]]]:
    """Per-position AUC and calibration of M_B and of the draft's cumulative confidence, as
    predictors of 'tokens 1 … i all accepted'."""
    labels = torch.cat([(torch.arange(s.window) < s.accepted).double() for s in steps])
    positions = torch.cat([torch.arange(s.window) for s in steps])
    return {
        "mb": position_report(torch.cat([s.mb for s in steps]), labels, positions),
        "draft_confidence": position_report(torch.cat([s.confidence for s in steps]), labels, positions),
    }


def markdown(result: dict[str, Any], positions: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"{result['steps']} held-out steps. Best fixed γ = {result['best_fixed_gamma']}: "
        f"{result['best_fixed_speedup']:.3f}×; oracle {result['oracle_speedup']:.3f}×; cost-optimal oracle "
        f"{result['optimal_oracle_speedup']:.3f}×.",
        "",
        "| fixed γ | " + " | ".join(str(g) for g in result["fixed"]) + " |",
        "|---|" + "---|" * len(result["fixed"]),
        "| speedup | " + " | ".join(f"{v:.3f}×" for v in result["fixed"].values()) + " |",
        "",
        "| rule | parameters | speedup | captured |",
        "|---|---|---|---|",
    ]
    for row in sorted(result["rows"], key=lambda r: (r["family"], -r["speedup"])):
        params = ", ".join(
            f"{k} {'null' if v is None else v}" for k, v in row.items() if k not in ("family", "speedup", "captured")
        )
        captured = "—" if row["captured"] is None else f"{row['captured']:.0%}"
        lines.append(f"| {row['family']} | {params} | {row['speedup']:.3f}× | {captured} |")
    lines += [
        "",
        "| draft position | tokens | accepted | M_B AUC | M_B mean p | conf AUC | conf mean p |",
        "|---|---|---|---|---|---|---|",
    ]

    def auc(r: dict) -> str:
        return "—" if r["auc"] != r["auc"] else f"{r['auc']:.3f}"  # NaN: a position with one class

    for mb, conf in zip(positions["mb"], positions["draft_confidence"]):
        lines.append(
            f"| {mb['position'] + 1} | {mb['tokens']} | {mb['accepted_rate']:.3f} | {auc(mb)} | "
            f"{mb['mean_prediction']:.3f} | {auc(conf)} | {conf['mean_prediction']:.3f} |"
        )
    return "\n".join(lines)


def _numbers(
    text: str,
    kind=float,
    option: str = "",
    low: Optional[float] = None,
    high: Optional[float] = None,
    open_low: bool = False,
) -> list:
    """A comma-separated option as numbers, each finite and within [low, high] (``open_low``: above
    low), else ``InputError`` naming the option."""
    where = f"{option} " if option else ""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{where}'{text}' is not a comma-separated list of numbers") from None
    if not values:
        raise InputError(f"{where}is empty: give at least one number")
    for v in values:
        bad = (
            not math.isfinite(v)
            or (low is not None and (v <= low if open_low else v < low))
            or (high is not None and v > high)
        )
        if bad:
            bounds = " and ".join(
                b
                for b in (
                    None if low is None else f"{'>' if open_low else '>='} {low:g}",
                    None if high is None else f"<= {high:g}",
                )
                if b
            )
            raise InputError(f"{where}takes finite numbers {bounds}, got {v}")
    return values


def _replay_cost(args) -> CostModel:
    """The cost model ``replay-stop`` prices with: ``--costs`` or ``--profile`` (exactly one), with
    ``--draft-token-s`` / ``--step-s`` in place of theirs when given."""
    if (args.costs is None) == (args.profile is None):
        raise InputError("give the costs to replay with: --costs FILE or --profile NAME|FILE (one of them)")
    if args.costs is not None:
        return read_cost_file(Path(args.costs), args.draft_token_s, args.step_s)
    from pacer_core.cost_profiles import load_profile

    cost = load_profile(args.profile).cost_model("feature")
    overrides = {k: v for k, v in (("draft_token_s", args.draft_token_s), ("step_s", args.step_s)) if v is not None}
    if overrides:
        try:
            cost = attrs.evolve(cost, **overrides)
        except ValueError as exc:
            raise InputError(f"--draft-token-s / --step-s: {exc}") from None
    return cost


@command("replay-stop", "replay stop rules on held-out simulated steps with a cost model (noise-free speedups)")
def _setup(p):
    p.add_argument("folder", metavar="DIR", help="a `pacer train-preverify` run folder (its samples/)")
    p.add_argument("--costs", metavar="FILE", help="a `pacer costs` file or a bench's cost_model.json (seconds)")
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="or a cost profile (docs/costs.md): a shipped name or a file; its eagle (feature) drafter's costs",
    )
    p.add_argument("--checkpoint", metavar="DIR", help="the M_B to replay (default: the shipped one)")
    p.add_argument(
        "--heldout-every",
        type=int,
        default=10,
        help="held-out items: item numbers divisible by this (the run's data.heldout_every, 10); 0 = every item",
    )
    p.add_argument("--draft-token-s", type=float, help="override the cost file's seconds per draft token")
    p.add_argument("--step-s", type=float, help="override the cost file's fixed seconds per step")
    p.add_argument("--max-draft", type=int, default=16, help="longest draft (<= the run's window; 16)")
    p.add_argument("--gammas", default="1,2,3,4,5,6,8,10,12,16", help="fixed windows")
    p.add_argument("--b", default="1,2,4", help="block sizes of the pacer rules")
    p.add_argument("--margins", default="0.8,0.9,1,1.1,1.25,1.5", help="λ multipliers of the throughput rule")
    p.add_argument(
        "--recalibrate",
        default=str(RECALIBRATE),
        help=f"priors of the throughput rule's recalibration, 'null' = M_B as it is ({RECALIBRATE:g}: the stop's)",
    )
    p.add_argument("--t0", default="0.3,0.5,0.6,0.7,0.8,0.9", help="t0 of the paper rule")
    p.add_argument("--confidence", default="0.2,0.3,0.4,0.5,0.6,0.7", help="thresholds of the confidence stop")
    p.add_argument(
        "--entropy-gamma", default="0.2", help="γ of the entropy stop's bound 1 − sqrt(γ · H) ('' = no entropy rows)"
    )
    p.add_argument(
        "--entropy",
        default="0.3,0.4,0.5,0.6,0.7,0.8",
        help="λ₀ of the entropy stop, each with and without its calibration (svip: h = 1 − λ₀)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")

    def run(args) -> int:
        cost = _replay_cost(args)  # before the data loads
        gammas, blocks = _numbers(args.gammas, int, "--gammas", 1), _numbers(args.b, int, "--b", 1)
        margins = _numbers(args.margins, float, "--margins", 0, open_low=True)
        recalibrations = [
            None if x.strip() == "null" else _numbers(x, float, "--recalibrate", 0, open_low=True)[0]
            for x in args.recalibrate.split(",")
        ]
        t0 = _numbers(args.t0, float, "--t0", 0, 1)
        confidence = _numbers(args.confidence, float, "--confidence", 0, 1)
        entropy_gamma = _numbers(args.entropy_gamma, float, "--entropy-gamma", 0, open_low=True)
        entropy = _numbers(args.entropy, float, "--entropy", 0, 1)
        folder = checkpoint_folder(args.checkpoint if args.checkpoint else str(DEFAULT_CHECKPOINT))
        if args.heldout_every < 0 or args.max_draft < 1:
            raise InputError("--heldout-every must be >= 0 and --max-draft >= 1")
        data, indices = load_heldout(Path(args.folder), args.heldout_every)
        steps = heldout_steps(data, mb_predictions(folder, data, indices))
        longest = max(s.window for s in steps)
        if args.max_draft > longest:
            raise InputError(f"--max-draft {args.max_draft} exceeds the simulated window ({longest} tokens)")
        result = compare(
            steps, cost, gammas, blocks, margins, t0, confidence, args.max_draft, entropy_gamma, entropy, recalibrations
        )
        positions = calibration(steps)
        print(markdown(result, positions))
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {**result, "by_position": positions, "fixed": {str(k): v for k, v in result["fixed"].items()}},
                    indent=2,
                    default=str,
                )
                + "\n"
            )
            print(f"\nresults: {args.json}", file=sys.stderr)
        return 0

    return run

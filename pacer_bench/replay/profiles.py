"""Cost profiles a replay prices under, beyond the shipped and given files: the run's own measured
profile (``profile_from_run``: ``pacer replay RUN --profile run``) and a profile with another
machine's host time per step (``with_host``: ``--host FILE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import attrs

from pacer_core.cost_profiles import (
    DRAFTER_KINDS,
    Curve,
    Profile,
    monotone,
    profile_from_dict,
    profile_to_dict,
    read_host_s,
)
from pacer_core.errors import InputError

from ..config import BASELINE
from .recorded import RecordedRun, drafter_kind, is_fixed_chain
from .steplog import Generation

SOURCES = {
    "verify_s": "the bench's verification-cost probe (cost_model.json)",
    "draft_s": "the run's fixed-chain stacks: forward seconds less the probe's target forwards",
    "host_s": "the run's wall less forward seconds per step (forward_s)",
}


def profile_from_run(run: RecordedRun, name: str = "run") -> Profile:
    """The measured profile of the machine a bench ran on, from the run itself: the verification
    curves of its cost probe (``verify_cost: true``; beyond the chain's largest k the tree-masked
    curve, a dense forward's cost hardly depending on the mask there), scaled so that a one-token
    forward costs what plain decoding's forwards cost in the run, one draft forward per drafter
    kind from its fixed-chain stacks (their forward seconds less the probe's target forwards, per
    draft forward), M_B's seconds per consultation, and the host time per step outside the forwards
    (``forward_s``: plain decoding's, the fixed chains', a tree's by nodes sent). ``InputError``
    without a probe or forward timings."""
    cost_file = run.cost_file
    if not cost_file or not cost_file.get("verify_s"):
        raise InputError("the run has no verification-cost probe (cost_model.json): bench it with verify_cost: true")
    timed = [g for g in run.generations if g.metrics.get("forward_s") is not None and g.has_steps]
    if not timed:
        raise InputError("the run's records hold no forward timings (forward_s): rerun the bench with this version")
    plain = [g for g in timed if g.stack == BASELINE]
    chains = [g for g in timed if run.units.get(g.stack) and is_fixed_chain(run.units[g.stack])]
    verify, tree = _scaled_to_plain(*_probe_curves(cost_file), plain)
    draft = _draft_forwards(run, chains, verify, tree)
    host_plain, host_chain = _host_per_step(plain, chains)
    checks = sum(int(g.metrics.get("pacer_checks", 0) or 0) for g in timed)
    mb = sum(float(g.metrics.get("pacer_mb_s", 0.0) or 0.0) for g in timed)
    device = f"the machine that ran this bench ({run.meta.get('device', '?')})"
    return _checked(
        Profile(
            name=name,
            kind="measured",
            device=device,
            verify=verify,
            tree_verify=tree,
            draft=draft,
            host_plain=host_plain,
            host_chain=host_chain,
            host_tree=_tree_host(timed),
            preverify_s=mb / checks if checks else 0.0,
            dtype=run.meta.get("dtype"),
            context=cost_file.get("context_tokens"),
            sources=dict(SOURCES),
        )
    )


def _probe_curves(cost_file: dict) -> tuple[Curve, Optional[Curve]]:
    """The probe's chain verification curve (beyond its largest k: the tree-masked one, never
    falling) and its tree-masked curve (None when the probe measured none)."""
    chain = list(monotone(cost_file["verify_s"]))
    tree_k, tree_s = list(cost_file.get("tree_k") or ()), list(monotone(cost_file.get("tree_verify_s") or ()))
    points = {k: t for k, t in zip(range(1, len(chain) + 1), chain)}
    top = len(chain)
    for k, t in zip(tree_k, tree_s):
        if k > top:
            points[k] = max(t, points[max(points)])
    return Curve.of(points), Curve.of(dict(zip(tree_k, tree_s))) if tree_k else None


def _scaled_to_plain(
    verify: Curve, tree: Optional[Curve], plain: Sequence[Generation]
) -> tuple[Curve, Optional[Curve]]:
    """The probe's level rests on a few forwards at one context; plain decoding's own forwards (one a
    token, at every context the run reached) set it: the curves are scaled so that verify(1) is
    their mean, the probe keeping the shape (the prompts' forwards priced on the probe's curve)."""
    tokens = sum(len(g.steps) - 1 for g in plain)
    if tokens <= 0:
        return verify, tree
    prefill = sum(verify(g.prompt_tokens) for g in plain)
    scale = (sum(g.metrics["forward_s"] for g in plain) - prefill) / (tokens * verify(1))
    if scale <= 0:
        return verify, tree
    return (
        Curve(verify.ks, [t * scale for t in verify.seconds]),
        None if tree is None else Curve(tree.ks, [t * scale for t in tree.seconds]),
    )


def _target_seconds(g: Generation, verify: Curve, tree: Optional[Curve]) -> float:
    """What the target's forwards of one generation cost on the (scaled) probe curves."""
    out = 0.0
    for i, step in enumerate(g.steps):
        sent = step.sent
        curve = (tree or verify) if step.is_tree else verify
        out += curve((g.prompt_tokens if i == 0 else 1) + sent)
    return out


def _draft_forwards(
    run: RecordedRun, chains: Sequence[Generation], verify: Curve, tree: Optional[Curve]
) -> dict[str, Curve]:
    """One draft forward per drafter kind, from the fixed chains of that kind: their forward
    seconds less the target's, per draft forward (a block drafter's chains give its one forward a
    block)."""
    draft: dict[str, Curve] = {}
    for kind in DRAFTER_KINDS:
        mine = [g for g in chains if drafter_kind(run.units[g.stack]) == kind]
        forwards = sum(int(g.metrics.get("draft_forwards", 0)) for g in mine)
        if forwards:
            seconds = sum(g.metrics["forward_s"] - _target_seconds(g, verify, tree) for g in mine)
            draft[kind] = Curve([1], [max(seconds / forwards, 1e-6)])
    return draft


def _host_seconds(generations: Sequence[Generation]) -> float:
    """Wall less forward seconds of ``generations`` (the host's time outside the forwards)."""
    return sum(g.metrics["wall_s"] - g.metrics["forward_s"] for g in generations)


def _host_per_step(plain: Sequence[Generation], chains: Sequence[Generation]) -> tuple[float, float]:
    """The host time per step of plain decoding and of the fixed chains (plain decoding's without
    fixed chains); ``InputError`` without timed plain decoding."""
    host: dict[str, float] = {}
    for label, chosen in (("plain", plain), ("chain", chains)):
        steps = sum(len(g.steps) for g in chosen)
        if steps:
            host[label] = max(_host_seconds(chosen) / steps, 1e-6)
    if "plain" not in host:
        raise InputError(f"the run has no timed '{BASELINE}' records: bench plain decoding too")
    return host["plain"], host.get("chain", host["plain"])


def _tree_host(timed: Sequence[Generation]) -> Optional[Curve]:
    """Tree stacks' host time per step against their mean nodes sent, never falling with more
    nodes (the noise smoothed); None without trees."""
    by_nodes: dict[int, list[float]] = {}
    for g in timed:
        if g.is_tree:
            nodes = round(sum(s.nodes or 0 for s in g.steps) / len(g.steps))
            by_nodes.setdefault(max(1, nodes), []).append(_host_seconds([g]) / len(g.steps))
    if not by_nodes:
        return None
    curve = Curve.of({n: sum(v) / len(v) for n, v in by_nodes.items()})
    return Curve(curve.ks, [max(t, 1e-6) for t in monotone(curve.seconds)])


def _checked(profile: Profile) -> Profile:
    """``profile`` (made from a run's records) validated as a profile file is, so that its times are
    in the range every replay can price (``pacer_core.cost_profiles``); ``InputError`` in one line."""
    profile_from_dict(profile_to_dict(profile), f"measured from the run ({profile.name})")
    return profile


def with_host(profile: Profile, path: str) -> Profile:
    """``profile`` with the host time per step of ``path`` (a ``pacer bench-host --json`` file or a
    cost profile: its ``host_s``), named so that every table says so."""
    from pacer_core.schema import load_yaml_file

    file = Path(path).expanduser()
    data = load_yaml_file(
        file, "--host", "give a `pacer bench-host --json` file or a cost profile", InputError
    )  # JSON is YAML
    host = data.get("host_s") if isinstance(data, dict) else None
    if not isinstance(host, dict):
        raise InputError(f"--host '{path}' has no host_s: give a `pacer bench-host --json` file or a cost profile")
    tree = host.get("tree")
    if isinstance(tree, dict):  # JSON keys are strings
        host = {**host, "tree": {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in tree.items()}}
    plain, chain, host_tree = read_host_s(host, f"{profile.name} with --host {path}")
    return attrs.evolve(
        profile,
        name=f"{profile.name} + host time of {file.name}",
        host_plain=plain,
        host_chain=chain,
        host_tree=host_tree,
        sources={**profile.sources, "host_s": f"this engine's host time per step from {path}"},
    )

"""95% intervals for the bench's ratios: a paired bootstrap over prompts, then repeats.

Every speedup and τ the report gives is a ratio of sums over records (a stack's tokens/s over
autoregressive decoding's on the same keys; emitted tokens / steps), or a ratio of sums over
questions (Spec-Bench's mean of per-question speeds). An interval resamples what varies between
prompts and between runs while keeping together what belongs together:

- a *cluster* is a prompt (prompt set, question id), drawn with replacement, n of n;
- within each draw of a prompt its *units* (its repeats) are drawn with replacement, R of R;
- a unit carries every column of the statistic summed over its turns, so a stack's record and the
  baseline's record of the same (prompt, repeat, turn) are always drawn together (paired).

The interval is the percentile interval of the statistic over the resamples. With one repeat the
second level draws each unit as often as its prompt, i.e. a plain paired bootstrap over prompts.

Pure functions of arrays and records: the random generator (numpy's ``Generator``) is passed in;
nothing reads or sets a global seed. The report makes one generator per figure from ``SEED``, so a
report rebuilt from the same answer log gives the same intervals. Meaning and use:
docs/benchmarks.md#confidence-intervals.
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, Sequence

import numpy as np

SEED = 0  # the report's generators: np.random.default_rng(SEED), one per figure
RESAMPLES = 2000
LEVEL = 0.95


def bootstrap_weights(clusters: Sequence[Hashable], rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """How often each unit is drawn in each resample, ``[resamples, units]`` (integers as floats).

    ``clusters[i]`` names unit i's cluster (its prompt). Level 1 draws n clusters of n with
    replacement; level 2 draws, for each draw of a cluster with R units, R of its units with
    replacement (c draws of a cluster: a multinomial of c × R trials over its R units)."""
    index: dict[Hashable, list[int]] = {}
    for unit, cluster in enumerate(clusters):
        index.setdefault(cluster, []).append(unit)
    members = list(index.values())
    n = len(members)
    weights = np.zeros((resamples, len(clusters)))
    if n == 0:
        return weights
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # [resamples, clusters]
    by_size: dict[int, list[int]] = {}
    for c, units in enumerate(members):
        by_size.setdefault(len(units), []).append(c)
    for size, chosen in by_size.items():  # clusters of one size are drawn together
        units = np.array([members[c] for c in chosen])  # [clusters of this size, size]
        if size == 1:
            weights[:, units[:, 0]] = counts[:, chosen]
        else:
            draws = rng.multinomial(counts[:, chosen] * size, np.full(size, 1.0 / size))  # [resamples, C, size]
            weights[:, units.reshape(-1)] = draws.reshape(resamples, -1)
    return weights


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> Optional[tuple[float, float]]:
    """The central ``level`` interval of the finite ``values`` (None when under half are finite:
    most resamples left the statistic undefined)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0 or finite.size < values.size / 2:
        return None
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    return float(low), float(high)


def interval(
    statistic: Callable[[np.ndarray], np.ndarray],
    columns: np.ndarray,
    clusters: Sequence[Hashable],
    rng: np.random.Generator,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Optional[tuple[float, float]]:
    """The bootstrap interval of ``statistic``: ``columns`` ``[units, k]`` holds each unit's sums,
    ``statistic`` maps weighted column sums ``[resamples, k]`` to ``[resamples]`` values (a zero
    denominator may give nan or inf: that resample is dropped). None with fewer than two clusters:
    one prompt says nothing of how the figure varies between prompts."""
    columns = np.asarray(columns, dtype=float)
    if columns.ndim != 2 or columns.shape[0] != len(clusters):
        raise ValueError(f"columns of shape {columns.shape} for {len(clusters)} units")
    if len(set(clusters)) < 2:
        return None
    sums = bootstrap_weights(clusters, rng, resamples) @ columns  # [resamples, k]
    with np.errstate(divide="ignore", invalid="ignore"):
        values = statistic(sums)
    return percentile_interval(values, level)


def ratio(sums: np.ndarray) -> np.ndarray:
    """Σ column 0 / Σ column 1: τ (emitted / steps), a mean of speeds over the same questions."""
    return sums[:, 0] / sums[:, 1]


def ratio_of_rates(sums: np.ndarray) -> np.ndarray:
    """(Σ c0 / Σ c1) / (Σ c2 / Σ c3): a speedup of totals (tokens / seconds over the baseline's)."""
    return (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])


# -- records → units ----------------------------------------------------------------------------
def _prompt(record: dict) -> tuple[str, str]:
    return str(record["prompt_set"]), str(record["question_id"])


def _unit(record: dict) -> tuple[str, str, int]:
    return (*_prompt(record), int(record.get("repeat", 0)))


def _key(record: dict) -> tuple[str, str, int, int]:
    return (*_unit(record), int(record.get("turn", 0)))


def _rate_sums(records: Sequence[dict]) -> tuple[float, float]:
    return (
        float(sum(len(r["tokens"]) for r in records)),
        float(sum(r["metrics"].get("wall_s", 0) or 0 for r in records)),
    )


def rate_columns(records: Sequence[dict], other: dict[tuple, dict]) -> tuple[np.ndarray, list]:
    """Units for a paired ratio of rates: per (prompt, repeat), over the turns ``other`` also has
    (``other`` maps (prompt set, question id, repeat, turn) to its record), the tokens and seconds of
    ``records`` then of their partners: columns ``[units, 4]`` and each unit's prompt."""
    units: dict[tuple, tuple[list, list]] = {}
    for r in records:
        partner = other.get(_key(r))
        if partner is not None:
            mine, theirs = units.setdefault(_unit(r), ([], []))
            mine.append(r)
            theirs.append(partner)
    columns = [(*_rate_sums(mine), *_rate_sums(theirs)) for mine, theirs in units.values()]
    return np.array(columns, dtype=float).reshape(-1, 4), [unit[:2] for unit in units]


def tau_columns(records: Sequence[dict]) -> tuple[np.ndarray, list]:
    """Units for τ: per (prompt, repeat), emitted tokens (Σ accept_lengths) and steps."""
    units: dict[tuple, list[float]] = {}
    for r in records:
        sums = units.setdefault(_unit(r), [0.0, 0.0])
        sums[0] += float(sum(r["metrics"].get("accept_lengths", [])))
        sums[1] += float(r["metrics"].get("steps", 0) or 0)
    return np.array(list(units.values()), dtype=float).reshape(-1, 2), [unit[:2] for unit in units]


def prompt_speedups(records: Sequence[dict], reference: dict[tuple, dict]) -> dict[str, float]:
    """Per prompt, the speedup over its repeats: a ratio of totals (the stack's tokens and seconds
    summed over the repeats ``reference`` also ran, over the baseline's), named ``set/question``."""
    columns, prompts = rate_columns(records, reference)
    sums: dict[str, np.ndarray] = {}
    for row, (set_name, question) in zip(columns, prompts):
        name = question if question.startswith(set_name + "/") else f"{set_name}/{question}"
        sums[name] = sums.get(name, np.zeros(4)) + row
    return {name: float(ratio_of_rates(total[None, :])[0]) for name, total in sums.items() if total.all()}


def _seeded(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def speedup_interval(
    records: Sequence[dict], reference: dict[tuple, dict], seed: int = SEED, resamples: int = RESAMPLES
) -> Optional[tuple[float, float]]:
    """The report's speedup (a ratio of totals over the keys autoregressive decoding also ran)."""
    columns, clusters = rate_columns(records, reference)
    return interval(ratio_of_rates, columns, clusters, _seeded(seed), resamples)


def tau_interval(
    records: Sequence[dict], seed: int = SEED, resamples: int = RESAMPLES
) -> Optional[tuple[float, float]]:
    columns, clusters = tau_columns(records)
    return interval(ratio, columns, clusters, _seeded(seed), resamples)


def cell_intervals(
    records: Sequence[dict], reference: dict[tuple, dict], seed: int = SEED, resamples: int = RESAMPLES
) -> dict[str, Optional[list[float]]]:
    """``speedup_ci`` and ``tau_ci`` of one report cell (lists [low, high], or None)."""
    speedup = speedup_interval(records, reference, seed, resamples)
    tau = tau_interval(records, seed, resamples)
    return {"speedup_ci": list(speedup) if speedup else None, "tau_ci": list(tau) if tau else None}


def format_interval(value: Optional[float], ci: Optional[Sequence[float]], spec: str = ".2f", unit: str = "") -> str:
    """``1.23× [1.10, 1.37]``; the value alone without an interval; — without a value."""
    if value is None:
        return "—"
    text = format(value, spec) + unit
    return text if not ci else f"{text} [{format(ci[0], spec)}, {format(ci[1], spec)}]"

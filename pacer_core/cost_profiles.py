"""What a decoding step costs on one device: cost models and device cost profiles, as pure data.

A **cost model** (``CostModel``) prices one step in seconds: the drafter's work, one target forward
over the pending token and the draft (a causal chain, or a tree-masked forward over its nodes) and
a step's fixed host time. Replays (``pacer replay``, ``pacer_bench.replay.chains``), the ``pacer`` stop's
throughput rule and cost-sized trees (``tree: {nodes: auto}``) all read one.

A **cost profile** (``Profile``) is the data a cost model is made from, for one device and target
size: the chain and tree verification curves (seconds of one target forward over k tokens), one
draft forward per drafter kind (``feature``: a one-layer feature head such as EAGLE's; ``token``: a
token-level draft model; ``block``: a block draft such as ``dflash``, whose one forward drafts a
whole block), one consultation of PACER's pre-verification layer, the host time per
step, and where each number comes from. Profiles are YAML files (docs/costs.md): *measured* ones
(``pacer costs --profile``, ``scripts/gpu_check.sh``) and *published* ones shipped in
``pacer_core/profiles/`` and named by their file name (``load_profile("a100-7b-bf16")``). Loading
validates a profile (known fields, times from ``MIN_SECONDS`` to ``MAX_SECONDS``, token counts up to
``MAX_TOKENS``, curves that never fall as k grows) and refuses a bad one in one line. The bounds keep
every sum a replay makes finite and every speedup it divides out non-zero (a time of 1e308 s would
overflow to infinity and print as a silent "0.00×").

Pure: no models, no clocks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import attrs

from .errors import InputError

__all__ = [
    "CostModel",
    "Curve",
    "MAX_SECONDS",
    "MAX_TOKENS",
    "MIN_SECONDS",
    "Profile",
    "PROFILE_FIELDS",
    "cost_model",
    "is_seconds",
    "load_profile",
    "monotone",
    "profile_from_dict",
    "profile_names",
    "profile_to_dict",
    "read_host_s",
]

PROFILES = Path(__file__).with_name("profiles")
# a one-layer feature head (eagle), a token-level draft model, a block draft (dflash: one forward a block)
DRAFTER_KINDS = ("feature", "token", "block")
# the range of one forward's, draft's or step's seconds (an hour is far beyond any real one, a
# femtosecond far below), and of the token counts a curve names
MIN_SECONDS, MAX_SECONDS = 1e-15, 3600.0
MAX_TOKENS = 1 << 20


def is_seconds(value: Any, zero: bool = False) -> bool:
    """Whether ``value`` is a time a cost can be: a number (not a bool) from ``MIN_SECONDS`` (or 0
    with ``zero``) to ``MAX_SECONDS``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (zero and value == 0) or MIN_SECONDS <= value <= MAX_SECONDS


def monotone(values: Sequence[float]) -> tuple[float, ...]:
    """The closest non-decreasing sequence (least squares, pool-adjacent-violators): measured
    verification times are noisy, but verifying more tokens never costs less."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return tuple(m for m, w in blocks for _ in range(int(w)))


def _extrapolate(known: Sequence[float], at: int) -> float:
    """``known[at - 1]`` (k = 1..K), or beyond K linearly from the last two (never decreasing)."""
    if at <= len(known):
        return known[at - 1]
    slope = known[-1] - known[-2] if len(known) >= 2 else 0.0
    return known[-1] + max(slope, 0.0) * (at - len(known))


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    """A field's converter: ``tuple``, typed (mypy's attrs plugin cannot type the generic ``tuple``)."""
    return tuple(values)


def _floats(values: Iterable[float]) -> tuple[float, ...]:
    """A field's converter: ``tuple``, typed (as ``_ints``)."""
    return tuple(values)


@attrs.frozen
class Curve:
    """Seconds at a few token counts ``ks`` (ascending): linear between them, the first value below
    the first count, extrapolated from the last two above the last (never decreasing)."""

    ks: tuple[int, ...] = attrs.field(converter=_ints)
    seconds: tuple[float, ...] = attrs.field(converter=_floats)

    def __attrs_post_init__(self) -> None:
        if not self.ks or len(self.ks) != len(self.seconds):
            raise ValueError(f"a curve needs as many times as token counts, got {len(self.ks)} and {len(self.seconds)}")
        if list(self.ks) != sorted(set(self.ks)) or self.ks[0] < 1:
            raise ValueError(f"token counts must be ascending and >= 1, got {list(self.ks)}")

    @classmethod
    def of(cls, points: Mapping[int, float]) -> "Curve":
        ks = sorted(points)
        return cls(ks, [points[k] for k in ks])

    def __call__(self, k: float) -> float:
        ks, ts = self.ks, self.seconds
        if k <= ks[0]:
            return ts[0]
        for (k0, t0), (k1, t1) in zip(zip(ks, ts), zip(ks[1:], ts[1:])):
            if k <= k1:
                return t0 + (t1 - t0) * (k - k0) / (k1 - k0)
        slope = (ts[-1] - ts[-2]) / (ks[-1] - ks[-2]) if len(ks) >= 2 else 0.0
        return ts[-1] + max(slope, 0.0) * (k - ks[-1])

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.ks, self.seconds))


@attrs.frozen
class CostModel:
    """Measured costs in seconds: ``verify_s[k - 1]`` is one causal target forward over k tokens
    (k = 1..K, a chain's verification); ``tree_verify_s[i]`` one tree-masked forward over
    ``tree_k[i]`` tokens (ascending; empty = trees cost what chains do); ``draft_token_s`` is the
    drafter's cost per draft token and ``tokens_per_forward`` the draft tokens one draft forward
    yields (1: a chain's forward or a tree's level; a block drafter's block, whose one forward drafts
    the whole block), so one draft forward costs ``draft_forward_s``; ``step_s`` a step's fixed
    cost besides drafting and verifying (committing, cropping caches, the hooks; 0 = not measured);
    ``tree_step_s`` the same for a tree step by the nodes it sends (None: ``step_s``);
    ``preverify_s`` one consultation of PACER's pre-verification layer; ``plain_host_s`` the host
    time of a plain decoding step (None: ``step_s``)."""

    verify_s: tuple[float, ...] = attrs.field(converter=_floats)
    draft_token_s: float = 0.0
    tree_k: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    tree_verify_s: tuple[float, ...] = attrs.field(default=(), converter=_floats)
    step_s: float = 0.0
    tree_step_s: Optional[Curve] = None
    preverify_s: float = 0.0
    plain_host_s: Optional[float] = None
    tokens_per_forward: float = 1.0

    def __attrs_post_init__(self) -> None:
        if not self.verify_s or not all(is_seconds(v) for v in self.verify_s):
            raise ValueError(f"verify_s needs times from {MIN_SECONDS:g} to {MAX_SECONDS:g} s, from k = 1 on")
        if len(self.tree_k) != len(self.tree_verify_s):
            raise ValueError(
                f"tree_k ({len(self.tree_k)}) and tree_verify_s ({len(self.tree_verify_s)}) differ in length"
            )
        if list(self.tree_k) != sorted(set(self.tree_k)) or any(k < 2 for k in self.tree_k):
            raise ValueError(f"tree_k must be ascending token counts >= 2, got {list(self.tree_k)}")
        if not all(is_seconds(v) for v in self.tree_verify_s):
            raise ValueError(f"tree_verify_s must be times from {MIN_SECONDS:g} to {MAX_SECONDS:g} s")
        for name in ("draft_token_s", "step_s", "preverify_s"):
            value = getattr(self, name)
            if not is_seconds(value, zero=True):
                raise ValueError(f"{name} must be 0 or a time from {MIN_SECONDS:g} to {MAX_SECONDS:g} s, got {value}")
        if self.plain_host_s is not None and not is_seconds(self.plain_host_s, zero=True):
            raise ValueError(
                f"plain_host_s must be None, 0 or a time from {MIN_SECONDS:g} to {MAX_SECONDS:g} s, "
                f"got {self.plain_host_s}"
            )
        if not (isinstance(self.tokens_per_forward, (int, float)) and 1 <= self.tokens_per_forward <= MAX_TOKENS):
            raise ValueError(f"tokens_per_forward must be from 1 to {MAX_TOKENS}, got {self.tokens_per_forward}")

    @property
    def draft_forward_s(self) -> float:
        """Seconds of one draft forward: ``tokens_per_forward`` draft tokens' worth."""
        return self.draft_token_s * self.tokens_per_forward

    def verify(self, k: int) -> float:
        """Cost of verifying k tokens; beyond the measured K, extrapolated linearly from the last two."""
        if k < 1:
            raise ValueError(f"a target forward covers at least one token, got k={k}")
        return _extrapolate(self.verify_s, k)

    def verify_tree(self, k: int) -> float:
        """Cost of a tree-masked forward over k tokens: interpolated linearly between the measured
        token counts, the first one's below them, extrapolated from the last two above; without
        tree measurements, a chain's ``verify(k)``."""
        if k < 1:
            raise ValueError(f"a target forward covers at least one token, got k={k}")
        if not self.tree_k:
            return self.verify(k)
        return Curve(self.tree_k, self.tree_verify_s)(k)

    def draft(self, n: int) -> float:
        """Seconds of drafting ``n`` tokens along a chain (a block drafter's forward spread over its
        block: a whole block costs one forward)."""
        return n * self.draft_token_s

    def host(self, nodes: Optional[int] = None) -> float:
        """A step's fixed host time: a chain's (``nodes`` None), or a tree's sending ``nodes`` nodes."""
        if nodes is None or self.tree_step_s is None:
            return self.step_s
        return self.tree_step_s(nodes)

    def plain_step(self) -> float:
        """A plain decoding step: one one-token forward and a plain step's host time."""
        return self.verify(1) + (self.step_s if self.plain_host_s is None else self.plain_host_s)

    def step(self, drafted: int, nodes: Optional[int] = None, sent: Optional[int] = None) -> float:
        """A step drafting ``drafted`` tokens (a tree: levels) whose target forward verifies the
        pending token and ``nodes`` draft nodes (None or ``drafted``: a chain, a causal forward);
        ``sent``: a chain trimmed to its first ``sent`` tokens before verification (the trimmed
        ones were drafted, so they cost drafting but not verifying)."""
        if sent is not None:
            return self.step_s + self.draft(drafted) + self.verify(sent + 1)
        if nodes is None or nodes == drafted:
            return self.step_s + self.draft(drafted) + self.verify(drafted + 1)
        return self.host(nodes) + self.draft(drafted) + self.verify_tree(nodes + 1)


def cost_model(cost_file: dict, draft_token_s: Optional[float] = None) -> CostModel:
    """The cost model of a bench's ``cost_model.json`` (or a ``pacer costs`` file): each measured
    curve made non-decreasing. ``draft_token_s`` defaults to the file's (0 when it has none); the
    draft tokens per forward are the file's ``draft_forward_s`` over its ``draft_token_s`` (1 when it
    lacks either, or they say less than one)."""
    tree_k = list(cost_file.get("tree_k") or ())
    tree_s = monotone(cost_file.get("tree_verify_s") or ()) if tree_k else ()
    if draft_token_s is None:
        draft_token_s = float(cost_file.get("draft_token_s") or 0.0)
    per_token, per_forward = (float(cost_file.get(k) or 0.0) for k in ("draft_token_s", "draft_forward_s"))
    return CostModel(
        monotone(cost_file["verify_s"]),
        draft_token_s,
        tree_k,
        tree_s,
        float(cost_file.get("step_s") or 0.0),
        tokens_per_forward=max(1.0, per_forward / per_token) if per_token > 0 else 1.0,
    )


# -- profiles -------------------------------------------------------------------------------------
PROFILE_FORMAT = 1
PROFILE_FIELDS = (
    "format",
    "name",
    "kind",
    "device",
    "dtype",
    "target",
    "context",
    "verify_s",
    "tree_verify_s",
    "draft_s",
    "preverify_s",
    "host_s",
    "sources",
)
REQUIRED = ("format", "name", "kind", "device", "verify_s", "draft_s", "host_s", "sources")
KINDS = ("measured", "published")
TARGET_FIELDS = ("name", "params_b", "layers", "hidden", "vocab", "heads", "kv_heads", "intermediate", "digest")


@attrs.frozen
class Profile:
    """One device's costs for one target size (see the module docstring and docs/costs.md)."""

    name: str
    kind: str
    device: str
    verify: Curve
    draft: dict[str, Curve]  # drafter kind -> one draft forward over w tokens
    host_plain: float
    host_chain: float
    host_tree: Optional[Curve] = None  # by nodes sent
    tree_verify: Optional[Curve] = None
    preverify_s: float = 0.0
    dtype: Optional[str] = None
    target: dict[str, Any] = attrs.field(factory=dict)
    context: Optional[int] = None
    sources: dict[str, str] = attrs.field(factory=dict)

    def label(self) -> str:
        return f"{self.kind} profile '{self.name}' ({self.device})"

    def draft_forward(self, kind: Optional[str], width: int = 1) -> float:
        """One draft forward over ``width`` tokens for a drafter of ``kind`` (None: no draft model)."""
        if kind is None:
            return 0.0
        if kind not in self.draft:
            raise InputError(f"{self.label()} has no draft cost for '{kind}' drafters: add draft_s.{kind} to it")
        return self.draft[kind](max(1, width))

    def cost_model(
        self, drafter_kind: Optional[str] = "feature", up_to: Optional[int] = None, tokens_per_forward: int = 1
    ) -> CostModel:
        """The cost model of a chain or tree step with a drafter of ``drafter_kind`` (its verification
        curve sampled at k = 1..``up_to``, by default the profile's largest measured k) whose one draft
        forward yields ``tokens_per_forward`` draft tokens (a block drafter: its block); the profile
        prices a forward, so a draft token costs that forward over ``tokens_per_forward``."""
        top = max(self.verify.ks[-1], 2) if up_to is None else up_to
        verify = tuple(self.verify(k) for k in range(1, top + 1))
        tree_k, tree_s = (
            ((), ())
            if self.tree_verify is None
            else (
                tuple(k for k in self.tree_verify.ks if k >= 2),
                tuple(s for k, s in self.tree_verify.as_dict().items() if k >= 2),
            )
        )
        return CostModel(
            verify,
            self.draft_forward(drafter_kind) / tokens_per_forward,
            tree_k,
            tree_s,
            self.host_chain,
            self.host_tree,
            self.preverify_s,
            self.host_plain,
            tokens_per_forward,
        )

    def plain_step(self) -> float:
        """Seconds per token of plain decoding: one one-token forward and the host's step."""
        return self.verify(1) + self.host_plain


def _where(path: str, key: str) -> str:
    return f"cost profile '{path}': {key}"


def _seconds(value: Any, where: str) -> float:
    if not is_seconds(value):
        raise InputError(
            f"{where} must be a positive number of seconds ({MIN_SECONDS:g} to {MAX_SECONDS:g}), got "
            f"{value!r}: fix the profile"
        )
    return float(value)


def _curve(value: Any, where: str, rising: bool = True) -> Curve:
    """A ``{k: seconds}`` mapping as a ``Curve``, refused unless every k is a positive int, every
    time positive, and (``rising``) the times never fall as k grows."""
    if not isinstance(value, Mapping) or not value:
        raise InputError(f"{where} must map token counts to seconds, e.g. {{1: 0.02, 8: 0.021}}: fix the profile")
    points: dict[int, float] = {}
    for k, t in value.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOKENS:
            raise InputError(f"{where} has token count {k!r}: token counts are integers from 1 to {MAX_TOKENS}")
        points[k] = _seconds(t, f"{where}.{k}")
    curve = Curve.of(points)
    if rising:
        for (k0, t0), (k1, t1) in zip(zip(curve.ks, curve.seconds), zip(curve.ks[1:], curve.seconds[1:])):
            if t1 < t0:
                raise InputError(
                    f"{where} falls from {t0:g} s at k={k0} to {t1:g} s at k={k1}: a forward over more "
                    "tokens never costs less; smooth the measurement (e.g. monotone()) or fix the profile"
                )
    return curve


def read_host_s(host: Any, path: str = "<dict>") -> tuple[float, float, Optional[Curve]]:
    """A profile's ``host_s`` section (also what ``pacer replay --host`` reads): the host seconds per
    step of plain decoding and of a chain, and the tree's curve by nodes sent (None without it);
    ``InputError`` in one line."""
    if not isinstance(host, Mapping) or not {"plain", "chain"} <= set(host) or set(host) - {"plain", "chain", "tree"}:
        raise InputError(
            f"{_where(path, 'host_s')} must give plain and chain (seconds) and optionally tree ({{nodes: seconds}})"
        )
    tree = None if host.get("tree") is None else _curve(host["tree"], _where(path, "host_s.tree"))
    plain, chain = (_seconds(host[k], _where(path, f"host_s.{k}")) for k in ("plain", "chain"))
    return plain, chain, tree


def profile_from_dict(data: Any, path: str = "<dict>") -> Profile:
    """A validated ``Profile`` from a profile file's parsed content; ``InputError`` in one line."""
    if not isinstance(data, Mapping):
        raise InputError(f"cost profile '{path}' is not a mapping of profile fields: see docs/costs.md")
    unknown = sorted(set(map(str, data)) - set(PROFILE_FIELDS))
    if unknown:
        raise InputError(
            f"cost profile '{path}' has unknown field(s) {unknown}: the fields are {', '.join(PROFILE_FIELDS)}"
        )
    missing = [f for f in REQUIRED if f not in data]
    if missing:
        raise InputError(f"cost profile '{path}' lacks {missing}: see docs/costs.md for the format")
    if data["format"] != PROFILE_FORMAT:
        raise InputError(
            f"cost profile '{path}' has format {data['format']!r}; this version reads format "
            f"{PROFILE_FORMAT}: convert or re-measure it"
        )
    if data["kind"] not in KINDS:
        raise InputError(f"{_where(path, 'kind')} is {data['kind']!r}: use one of {', '.join(KINDS)}")
    for field in ("name", "device"):
        if not isinstance(data[field], str) or not data[field].strip():
            raise InputError(f"{_where(path, field)} must be a non-empty string")
    verify = _curve(data["verify_s"], _where(path, "verify_s"))
    if verify.ks[0] != 1:
        raise InputError(f"{_where(path, 'verify_s')} must include k = 1 (plain decoding's forward)")
    tree = None if data.get("tree_verify_s") is None else _curve(data["tree_verify_s"], _where(path, "tree_verify_s"))
    drafts = data["draft_s"]
    if not isinstance(drafts, Mapping):
        raise InputError(
            f"{_where(path, 'draft_s')} must map drafter kinds ({', '.join(DRAFTER_KINDS)}) to curves "
            "({} for a profile of drafters without a draft model)"
        )
    bad = sorted(set(map(str, drafts)) - set(DRAFTER_KINDS))
    if bad:
        raise InputError(f"{_where(path, 'draft_s')} has unknown drafter kind(s) {bad}: use {', '.join(DRAFTER_KINDS)}")
    draft = {kind: _curve(curve, _where(path, f"draft_s.{kind}")) for kind, curve in drafts.items()}
    host_plain, host_chain, host_tree = read_host_s(data["host_s"], path)
    preverify = 0.0 if data.get("preverify_s") is None else _seconds(data["preverify_s"], _where(path, "preverify_s"))
    target = data.get("target") or {}
    if not isinstance(target, Mapping) or set(map(str, target)) - set(TARGET_FIELDS):
        raise InputError(f"{_where(path, 'target')} must be a mapping of {', '.join(TARGET_FIELDS)}")
    context = data.get("context")
    if context is not None and (
        isinstance(context, bool) or not isinstance(context, int) or not 0 <= context <= MAX_TOKENS
    ):
        raise InputError(
            f"{_where(path, 'context')} must be a whole number of cached tokens (0 to {MAX_TOKENS}), got {context!r}"
        )
    sources = data["sources"]
    if not isinstance(sources, Mapping) or not all(isinstance(v, str) and v.strip() for v in sources.values()):
        raise InputError(f"{_where(path, 'sources')} must map fields to where their numbers come from (text)")
    uncited = [f for f in ("verify_s", "draft_s", "host_s") if f not in sources]
    if uncited:
        raise InputError(
            f"{_where(path, 'sources')} does not say where {uncited} come from: cite a source or the "
            "command that measured them"
        )
    return Profile(
        name=data["name"],
        kind=data["kind"],
        device=data["device"],
        verify=verify,
        draft=draft,
        host_plain=host_plain,
        host_chain=host_chain,
        host_tree=host_tree,
        tree_verify=tree,
        preverify_s=preverify,
        dtype=data.get("dtype"),
        target=dict(target),
        context=context,
        sources=dict(sources),
    )


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The file form of a profile (``profile_from_dict`` reads it back to an equal profile)."""
    out: dict[str, Any] = {
        "format": PROFILE_FORMAT,
        "name": profile.name,
        "kind": profile.kind,
        "device": profile.device,
    }
    if profile.dtype is not None:
        out["dtype"] = profile.dtype
    if profile.target:
        out["target"] = dict(profile.target)
    if profile.context is not None:
        out["context"] = profile.context
    out["verify_s"] = profile.verify.as_dict()
    if profile.tree_verify is not None:
        out["tree_verify_s"] = profile.tree_verify.as_dict()
    out["draft_s"] = {kind: curve.as_dict() for kind, curve in profile.draft.items()}
    if profile.preverify_s:
        out["preverify_s"] = profile.preverify_s
    out["host_s"] = {"plain": profile.host_plain, "chain": profile.host_chain}
    if profile.host_tree is not None:
        out["host_s"]["tree"] = profile.host_tree.as_dict()
    out["sources"] = dict(profile.sources)
    return out


def measured_profile_path(device: str, target_digest: Optional[str]) -> Path:
    """Where ``pacer costs`` caches the measured profile of a device type and target, which
    ``tree: {}`` on that device reads (``$PACER_CACHE/profiles/``)."""
    from .paths import cache_root

    kind = str(device).split(":")[0]
    return cache_root() / "profiles" / f"measured-{kind}-{target_digest or 'unknown'}.yaml"


def device_profile(device: str, target_digest: Optional[str], default: str, kind: Optional[str] = None) -> Profile:
    """The profile cost-sized trees use on ``device`` when none is named: the one ``pacer costs``
    measured and cached for this device type and target (when it prices a ``kind`` drafter), else
    the shipped ``default``."""
    cached = measured_profile_path(device, target_digest)
    if cached.is_file():
        profile = load_profile(cached)
        if kind is None or kind in profile.draft:
            return profile
    return load_profile(default)


def profile_names() -> list[str]:
    """The shipped profiles' names."""
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def load_profile(name_or_path: Union[str, Path]) -> Profile:
    """A shipped profile by name (``pacer_core/profiles/<name>.yaml``) or a profile file by path,
    validated; ``InputError`` in one line naming the problem and the fix. A file is read as every
    user-named file is (a regular file, bounded, nested at most ``MAX_DEPTH`` deep)."""
    from .schema import load_yaml_file

    text = str(name_or_path)
    path = Path(text).expanduser()
    if not path.is_file():
        shipped = PROFILES / f"{text}.yaml"
        if "/" in text or text.endswith((".yaml", ".yml", ".json")) or not shipped.is_file():
            names = ", ".join(profile_names()) or "none"
            raise InputError(f"no cost profile '{text}': give a profile file or a shipped name ({names})")
        path = shipped
    data = load_yaml_file(path, "cost profile", "give a profile file or a shipped name", InputError)
    return profile_from_dict(data, str(path))


def write_profile(path: Union[str, Path], profile: Profile, header: str = "") -> Path:
    """Write ``profile`` as YAML, published whole (``pacer_core.atomic``), readable by all."""
    import yaml

    from .atomic import atomic_write

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(
        profile_to_dict(profile), sort_keys=False, default_flow_style=None, width=110
    )
    return atomic_write(path, lambda f: f.write(text.encode()), shared=True)

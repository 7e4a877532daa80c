"""``pacer draft-eval``: how often feature-level drafts agree with the target on the benchmark
prompts, teacher-forced, in a minute instead of a bench run's hour
(docs/draft.md#measuring-a-draft-in-a-minute-pacer-draft-eval).

    pacer draft-eval drafts=[shipped,runs/distill-v4/draft] limit=10

The target writes its greedy answers to the first ``limit`` prompts of each set once (continuous
batching, cached in ``out/answers.json`` for this target and these settings). Each draft is then run
over every answer as its drafter would run a chain from every position at once (the training-time
test's unrolled pass, ``distill.unrolled_features``): draft position 1 reads the target's features,
positions 2..``depth`` its own predicted features with the answer's tokens. Reported per draft and
prompt set, like the bench's ``draft_quality`` observer: at each draft position the share of rows
whose target token is among the draft's top 1 / 2 / 4 / 8, given the positions before it hit (top-1);
and τ at γ = ``depth``, the mean of 1 + the leading run of top-1 hits over every answer position.
Position 1 is also split by the kind of the target's token (``token_kind``: word start, word piece,
punctuation, digits, newline, space, special), to show where a draft misses.

It measures agreement, not speed: no engine runs, so it is exact whatever else shares the machine.
The bench's figures differ a little: its chains start only where the previous step ended, these
start at every answer position.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

import attrs
import torch

from pacer_core.commands import Runner, check_out_dir, command
from pacer_core.config import ModelConfig
from pacer_core.draft_folders import MANIFEST
from pacer_core.errors import ConfigError, InputError
from pacer_core.jsonfile import read_json
from pacer_core.priors import CorpusSuccessors, SuccessorIndex, path_bonus
from pacer_core.schema import load_schema
from pacer_train import atomic_write_json

from .features import target_greedy
from .model import Eagle3Draft, draft_logits, load_draft

ANSWERS = "answers.json"
ANSWERS_FORMAT = 1
SHIPPED = "shipped"  # the name of the draft shipped for the embedded target


def draft_folder(name: str) -> Path:
    return Path(__file__).resolve().parent / "default" if name == SHIPPED else Path(name).expanduser()


@attrs.define
class DraftEvalConfig:
    # draft folders `pacer distill` wrote; shipped = the default
    drafts: List[str] = attrs.field(factory=lambda: [SHIPPED])
    target: ModelConfig = attrs.field(factory=ModelConfig)
    prompt_sets: List[str] = attrs.field(factory=lambda: ["humaneval", "gsm8k", "mtbench", "summarization"])
    limit: int = 10  # the first prompts of each set (MT-Bench: first turns)
    max_new_tokens: int = 128
    depth: int = 4  # draft positions (the chain's γ for τ)
    ks: List[int] = attrs.field(factory=lambda: [1, 2, 4, 8])
    batch_size: int = 16  # rows of the target's answer generation
    context_vocab: bool = True  # as the eagle drafter does by default: a subset head also says the context's tokens
    context_bias: float = 0.0  # added to the logits of the tokens read (the eagle drafter's default: 0)
    lookup_bias: Optional[List[float]] = None  # n-gram successor priors; None = the eagle drafter's default
    corpus_bias: Optional[float] = None  # the corpus prior; None = the eagle drafter's default for the draft
    corpus: str = "shipped"  # what corpus_bias reads, as the eagle drafter's `corpus`
    threads: int = 0  # torch threads; 0 = torch's default
    out: str = "runs/draft-eval"  # answers.json (the cache), results.json, report.md


def load_config(path: Optional[str], overrides: list[str]) -> DraftEvalConfig:
    cfg = load_schema(DraftEvalConfig, path, overrides, "draft-eval")
    if not cfg.drafts:
        raise ConfigError("drafts is empty: give at least one draft folder, e.g. drafts=[shipped,runs/distill/draft]")
    if cfg.limit < 1 or cfg.max_new_tokens < 2 or cfg.depth < 1 or not cfg.ks or min(cfg.ks) < 1:
        raise ConfigError(
            f"limit >= 1, max_new_tokens >= 2, depth >= 1 and ks of positive sizes are needed "
            f"(got limit={cfg.limit}, max_new_tokens={cfg.max_new_tokens}, depth={cfg.depth}, "
            f"ks={cfg.ks})"
        )
    for folder in cfg.drafts:
        if not (draft_folder(folder) / MANIFEST).is_file():
            raise InputError(
                f"draft '{folder}' is not a draft folder `pacer distill` wrote (no {MANIFEST}): "
                "give a feature-level draft folder (student.kind feature or eagle3)"
            )
    return cfg


# -- the target's answers ---------------------------------------------------------------------------
def target_answers(cfg: DraftEvalConfig, target, tokenizer, digest: str, out: Path) -> list[dict[str, Any]]:
    """[{set, question_id, prompt, answer}] (token ids): the cached answers when ``out/answers.json``
    was written for this target, dtype and these prompts, else generated now and cached."""
    from pacer_bench.prompts import load_prompts
    from pacer_core.hf import greedy_batch

    key = {
        "format": ANSWERS_FORMAT,
        "target_digest": digest,
        "dtype": cfg.target.dtype,
        "prompt_sets": list(cfg.prompt_sets),
        "limit": cfg.limit,
        "max_new_tokens": cfg.max_new_tokens,
    }
    cache = out / ANSWERS
    if cache.is_file():
        try:
            saved = json.loads(cache.read_text())
        except ValueError:
            raise InputError(f"'{cache}' is not valid JSON: delete it to generate the answers again") from None
        if isinstance(saved, dict) and saved.get("key") == key:
            return saved["records"]
    records = [
        {"set": name, "question_id": p.question_id, "prompt": tokenizer.encode(p.text)}
        for name in cfg.prompt_sets
        for p in load_prompts(name, cfg.limit)
    ]
    done = [0]

    def progress(index: int, answer: list[int]) -> None:
        done[0] += 1
        print(f"\rtarget answers: {done[0]}/{len(records)}", end="", file=sys.stderr, flush=True)

    answers = greedy_batch(
        target, [r["prompt"] for r in records], cfg.max_new_tokens, rows=cfg.batch_size, on_answer=progress
    )
    print(file=sys.stderr)
    for record, answer in zip(records, answers):
        record["answer"] = answer
    atomic_write_json(cache, {"key": key, "records": records}, indent=None)
    return records


# -- agreement ------------------------------------------------------------------------------------
def chain_hits(
    draft_logits_per_step: Sequence[torch.Tensor],
    subset: torch.Tensor,
    target_next: torch.Tensor,
    first: int,
    ks: Sequence[int],
) -> torch.Tensor:
    """Per row and draft position, the smallest k of ``ks`` whose top-k holds the target's token (0:
    none). draft_logits_per_step[j-1] [T, subset]: row t's logits for position j (the token after
    t + j); target_next [T + 1]: the target's greedy token after every position 0..T of the sequence.
    Rows before ``first`` (the prompt) and rows whose position j drafts past the sequence's last token
    (t + j + 1 > T) are -1. → [T, depth] long."""
    rows = draft_logits_per_step[0].shape[0]
    out = torch.full((rows, len(draft_logits_per_step)), -1, dtype=torch.long)
    biggest = max(ks)
    for j, logits in enumerate(draft_logits_per_step, start=1):
        valid = torch.arange(rows)
        valid = valid[(valid >= first) & (valid + j < rows)]
        if not len(valid):
            continue
        top = subset[logits[valid].topk(min(biggest, logits.shape[-1]), -1).indices]  # [n, biggest] target ids
        wanted = target_next[valid + j]  # the target's token after position t + j
        rank = torch.where(top == wanted[:, None], torch.arange(top.shape[1]), top.shape[1]).min(-1).values
        smallest = torch.zeros(len(valid), dtype=torch.long)
        for k in sorted(ks, reverse=True):
            smallest[rank < k] = k
        out[valid, j - 1] = smallest
    return out


TOKEN_KINDS = ("word start", "word piece", "punctuation", "digits", "newline", "space", "special")


def token_kind(text: str) -> str:
    """The kind of a token from its decoded text: ``special`` (decodes to nothing), ``newline`` or
    ``space`` (whitespace only), ``digits`` (holds a digit), ``punctuation`` (no letter or digit:
    markdown, symbols, a partial character), else a word: ``word start`` after leading whitespace,
    ``word piece`` without."""
    if not text:
        return "special"
    if not text.strip():
        return "newline" if "\n" in text else "space"
    if any(c.isdigit() for c in text):
        return "digits"
    if not any(c.isalnum() for c in text):
        return "punctuation"
    return "word start" if text[0].isspace() else "word piece"


def summarize_kinds(first_hits: torch.Tensor, kinds: torch.Tensor) -> dict[str, dict[str, float]]:
    """Position 1 by the kind of the target's token: first_hits [N] (``chain_hits``' column 0, ≥ 0),
    kinds [N] (indices into ``TOKEN_KINDS``) → {kind: {rows, share of the rows, top1}} for the kinds
    present; Σ share · top1 is position 1's top-1 share."""
    out = {}
    for index, name in enumerate(TOKEN_KINDS):
        rows = kinds == index
        n = int(rows.sum())
        if n:
            out[name] = {"rows": n, "share": n / len(kinds), "top1": float((first_hits[rows] == 1).float().mean())}
    return out


def summarize(hits: torch.Tensor, ks: Sequence[int]) -> dict[str, Any]:
    """hits [N, depth] from ``chain_hits`` (rows with position 1 valid) → per position j: {rows, top-k
    shares given positions 1..j-1 hit (top-1)}, and τ at γ = depth: mean of 1 + the leading top-1 run."""
    depth = hits.shape[1]
    positions, given = [], torch.ones(hits.shape[0], dtype=torch.bool)
    for j in range(depth):
        rows = given & (hits[:, j] >= 0)
        n = int(rows.sum())
        shares = {
            f"top{k}": (float(((hits[rows, j] > 0) & (hits[rows, j] <= k)).float().mean()) if n else None) for k in ks
        }
        positions.append({"rows": n, **shares})
        given = given & (hits[:, j] == 1)
    first_hit = (hits == 1).to(torch.long)
    leading = first_hit.cumprod(-1).sum(-1)
    return {
        "positions": positions,
        "tau": float((1 + leading).float().mean()) if len(hits) else None,
        "rows": int(hits.shape[0]),
    }


def context_columns(
    subset: torch.Tensor, tokens: torch.Tensor, extend: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the ``eagle`` drafter's head holds at each row of one sequence (row t drafts after x_{t+1},
    so it has read x_0..x_{t+1}): (ids [C], known [L-1, C], seen [L-1, C]) with ids the subset and,
    when ``extend`` (``context_vocab``), the sequence's tokens outside it in order of first use; known:
    the head can say the id at the row; seen: the row has read it (where ``context_bias`` applies)."""
    inside = torch.zeros(int(max(subset.max(), tokens.max())) + 1, dtype=torch.bool)
    inside[subset] = True
    extra = [t for t in dict.fromkeys(tokens.tolist()) if not inside[t]] if extend else []
    ids = torch.cat([subset, torch.tensor(extra, dtype=torch.long)])
    first_use = torch.full((len(inside),), len(tokens), dtype=torch.long)  # never: past every row
    first_use.scatter_reduce_(0, tokens, torch.arange(len(tokens)), "amin")
    rows = torch.arange(len(tokens) - 1)
    seen = first_use[ids][None, :] <= rows[:, None] + 1
    known = seen.clone()
    known[:, : len(subset)] = True
    return ids, known, seen


@torch.no_grad()
def draft_hits(
    net,
    embed: torch.Tensor,
    head_full: torch.Tensor,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    fused: Optional[torch.Tensor],
    target_next: torch.Tensor,
    first: int,
    depth: int,
    ks: Sequence[int],
    context_vocab: bool = False,
    context_bias: float = 0.0,
    lookup_bias: Sequence[float] = (),
    corpus: Optional[CorpusSuccessors] = None,
    corpus_bias: float = 0.0,
) -> torch.Tensor:
    """``chain_hits`` of one draft over one sequence: tokens [L], feats [L, d] (the target's last-layer
    states), fused [L, n·d] or None, target_next [L] (``distill.target_greedy`` of feats, computed once per
    sequence for every draft); ``first``: the row of the prompt's last token. As the ``eagle`` drafter
    with those options (``context_columns``): ``context_vocab``, a subset head also says the tokens
    read so far (not for ``Eagle3Draft``, whose head is its own); ``context_bias``, added to the logits of
    the tokens read; ``lookup_bias``, the n-gram successor priors (``priors.lookup_bonus``: row t has read
    x_0..x_{t+1}, its position j drafts after x_{t+j}); ``corpus_bias``, the corpus prior over ``corpus``
    (``priors.corpus_bonus``). → [L-1, depth]."""
    from .students import unrolled_features

    inputs = feats[None, :-1] if fused is None else net.fuse(fused[None, :-1])
    steps = unrolled_features(net, embed, tokens[None], inputs, depth)
    ids, known, seen = context_columns(net.subset.cpu(), tokens, context_vocab and not isinstance(net, Eagle3Draft))
    head_sub = head_full[ids.to(head_full.device)]
    # row t reads f_t and x_{t+1}; its position j drafts the token after t + j
    logits = [draft_logits(net, step[0], head_sub).cpu() for step in steps]  # the tallies run on the CPU
    logits = [row_logits + context_bias * seen for row_logits in logits]
    if lookup_bias or (corpus is not None and corpus_bias):
        add_lookup_bonus(logits, ids, tokens.tolist(), first, lookup_bias, corpus, corpus_bias)
    logits = [row_logits.masked_fill(~known, float("-inf")) for row_logits in logits]
    return chain_hits(logits, ids, target_next.cpu(), first, ks)


def add_lookup_bonus(
    logits: list[torch.Tensor],
    ids: torch.Tensor,
    tokens: list[int],
    first: int,
    lookup_bias: Sequence[float],
    corpus: Optional[CorpusSuccessors] = None,
    corpus_bias: float = 0.0,
) -> None:
    """Add ``priors.lookup_bonus`` in place to logits[j-1] [L-1, C] (columns: ``ids``) at every row t ≥
    ``first``: the successors, in x_0..x_{t+1}, of the last tokens of x_0..x_{t+j}; and, with a
    ``corpus``, ``priors.corpus_bonus`` of the same path."""
    column = {token: c for c, token in enumerate(ids.tolist())}
    index = SuccessorIndex(len(lookup_bias))
    index.extend(tokens[: first + 1])
    longest = max(len(lookup_bias), corpus.longest if corpus is not None else 0)
    for t in range(first, len(tokens) - 1):
        index.extend(tokens[t + 1 : t + 2])
        for j, row_logits in enumerate(logits, start=1):
            if t + j >= len(tokens):
                break
            suffix = tokens[max(0, t + j + 1 - longest) : t + j + 1]
            for token, bonus in path_bonus(index, lookup_bias, corpus, corpus_bias, suffix).items():
                if token in column:
                    row_logits[t, column[token]] += bonus


def run_draft_eval(cfg: DraftEvalConfig, command_line: str) -> dict[str, Any]:
    from pacer_core.hf import load_section
    from pacer_core.priors import lookup_bias_for
    from pacer_train.corpus.prior import corpus_bias_for, corpus_successors
    from pacer_train.students import target_states

    out = check_out_dir(cfg.out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target, tokenizer, digest = load_section(cfg.target, "target")
    records = target_answers(cfg, target, tokenizer, digest, out)
    embed_w, head_w = target.embedding_weights()
    embed, head_full = embed_w.float(), head_w.float()
    nets = []
    for folder in cfg.drafts:
        manifest = read_json(
            draft_folder(folder) / MANIFEST, "draft manifest", "distill the draft again (`pacer distill`)"
        )
        if manifest.get("target_digest") not in (None, digest):
            raise InputError(
                f"draft '{folder}' was distilled from target {manifest.get('target_digest')}, this "
                f"target is {digest}: evaluate it with its own target (target.path=...)"
            )
        nets.append(load_draft(draft_folder(folder)).to(embed.device))
    layers = sorted({tuple(n.arch.target_layers) for n in nets if getattr(n.arch, "target_layers", None)})
    # the priors the eagle drafter gives each draft where not set (every kind but eagle3 has its own head subset)
    own_subsets = [not isinstance(net, Eagle3Draft) for net in nets]
    lookup_biases = [lookup_bias_for(own, cfg.lookup_bias) for own in own_subsets]
    corpus_biases = [corpus_bias_for(own, cfg.corpus_bias, cfg.corpus, digest) for own in own_subsets]
    corpus = corpus_successors(cfg.corpus, tokenizer, target.vocab_size, digest) if any(corpus_biases) else None
    hits: dict[tuple[int, str], list[torch.Tensor]] = {}
    kinds: dict[str, list[torch.Tensor]] = {}  # per set, the kind of the target's token at each row's position 1
    kind_of: dict[int, int] = {}
    for number, r in enumerate(records, start=1):
        tokens = torch.tensor(r["prompt"] + r["answer"], dtype=torch.long)
        states = [s[0].float() for s in target_states(target, tokens[None], [None, *layers])]
        feats, fused = states[0], dict(zip(layers, states[1:]))
        target_next = target_greedy(feats[None], head_full)[0]  # [L]: the target's token after position t
        for i, net in enumerate(nets):
            group = getattr(net.arch, "target_layers", None)
            rows = draft_hits(
                net,
                embed,
                head_full,
                tokens,
                feats,
                fused[tuple(group)] if group else None,
                target_next,
                len(r["prompt"]) - 1,
                cfg.depth,
                cfg.ks,
                cfg.context_vocab,
                cfg.context_bias,
                lookup_biases[i],
                corpus,
                corpus_biases[i],
            )
            kept = rows[:, 0] >= 0
            hits.setdefault((i, r["set"]), []).append(rows[kept])
        wanted = target_next[kept.nonzero()[:, 0] + 1].tolist()  # row t's position 1 drafts the token after t + 1
        for token in set(wanted) - set(kind_of):
            kind_of[token] = TOKEN_KINDS.index(token_kind(tokenizer.decode([token])))
        kinds.setdefault(r["set"], []).append(torch.tensor([kind_of[t] for t in wanted], dtype=torch.long))
        print(f"\rdrafts over the answers: {number}/{len(records)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    results = {
        "command": command_line,
        "target_digest": digest,
        "dtype": cfg.target.dtype,
        "answers": {name: sum(len(r["answer"]) for r in records if r["set"] == name) for name in cfg.prompt_sets},
        "drafts": [],
    }
    set_kinds = {name: torch.cat(kinds[name]) for name in cfg.prompt_sets}
    set_kinds["all"] = torch.cat(list(set_kinds.values()))
    for i, folder in enumerate(cfg.drafts):
        set_hits = {name: torch.cat(hits[(i, name)]) for name in cfg.prompt_sets}
        set_hits["all"] = torch.cat(list(set_hits.values()))
        per_set = {
            name: {**summarize(h, cfg.ks), "by_kind": summarize_kinds(h[:, 0], set_kinds[name])}
            for name, h in set_hits.items()
        }
        results["drafts"].append({"draft": folder, "sets": per_set})
    (out / "results.json").write_text(json.dumps(results, indent=2))
    report = markdown(results, cfg.ks)
    (out / "report.md").write_text(report)
    print(report)
    return results


def markdown(results: dict[str, Any], ks: Sequence[int]) -> str:
    """Two tables: per draft and prompt set, position 1's top-k shares, positions 2.. top-1 given the
    earlier hit, and τ at γ = depth; then position 1's top-1 share by the kind of the target's token."""
    first = results["drafts"][0]["sets"]["all"]["positions"]
    depth = len(first)
    head = (
        ["draft", "set"]
        + [f"pos 1 top-{k}" for k in ks]
        + [f"pos {j} top-1" for j in range(2, depth + 1)]
        + [f"τ@γ{depth}", "rows"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(value):
        return "—" if value is None else f"{value:.3f}"

    for d in results["drafts"]:
        for name, s in d["sets"].items():
            p = s["positions"]
            lines.append(
                "| "
                + " | ".join(
                    [_shown(d["draft"]), name]
                    + [cell(p[0][f"top{k}"]) for k in ks]
                    + [cell(p[j]["top1"]) for j in range(1, depth)]
                    + [cell(s["tau"]).rstrip("0"), str(s["rows"])]
                )
                + " |"
            )
    present = [
        k for k in TOKEN_KINDS if any(k in s.get("by_kind", {}) for d in results["drafts"] for s in d["sets"].values())
    ]
    if present:
        lines += [
            "",
            "Position 1, top-1 agreement by the kind of the target's token (the kind's share of the rows):",
            "",
            "| " + " | ".join(["draft", "set"] + present) + " |",
            "|" + "---|" * (len(present) + 2),
        ]
        for d in results["drafts"]:
            for name, s in d["sets"].items():
                by_kind = s.get("by_kind", {})
                lines.append(
                    "| " + " | ".join([_shown(d["draft"]), name] + [_kind_cell(by_kind.get(k)) for k in present]) + " |"
                )
    return "\n".join(lines) + "\n"


def _kind_cell(kind: Optional[dict[str, float]]) -> str:
    if kind is None:
        return "—"
    share = f"{kind['share']:.0%}" if kind["share"] >= 0.01 else f"{kind['rows']} row{'s' if kind['rows'] != 1 else ''}"
    return f"{kind['top1']:.3f} ({share})"


def _shown(folder: str) -> str:
    shown = Path(folder)
    return str(shown.relative_to(Path.cwd()) if shown.is_absolute() and shown.is_relative_to(Path.cwd()) else shown)


@command(
    "draft-eval",
    "how often feature-level drafts agree with the target on the benchmark prompts "
    "(teacher-forced, per draft position and prompt set)",
)
def _setup(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", help="draft-eval YAML (default: built-in settings)")
    p.add_argument("overrides", nargs="*", metavar="key=value")

    def runner(args: argparse.Namespace) -> int:
        cfg = load_config(args.config, args.overrides)
        run_draft_eval(cfg, "pacer draft-eval " + " ".join(sys.argv[2:]))
        return 0

    return runner

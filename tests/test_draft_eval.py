"""`pacer draft-eval`: teacher-forced agreement of feature-level drafts with the target on the
benchmark prompts — the per-row hits against a step-by-step recount with the drafter's own cache,
the per-position shares and τ on a hand-made table, and the command end to end on a tiny target
(answers cached, bad input refused in one line)."""

from __future__ import annotations

import json

import pytest
import torch

from pacer_core import InputError
from pacer_core.errors import ConfigError
from pacer_core.priors import CorpusSuccessors, corpus_bonus
from pacer_plugins.eagle.agreement import (
    chain_hits,
    draft_hits,
    load_config,
    run_draft_eval,
    summarize,
    summarize_kinds,
    token_kind,
)
from pacer_plugins.eagle.features import target_greedy
from pacer_plugins.eagle.model import KVCache, draft_logits

from helpers import STUDENT_LAYERS as LAYERS
from helpers import STUDENT_SUBSET as SUBSET
from helpers import adapter, brute_successors, reference_greedy, student
from helpers import student_target as tiny_target


@pytest.mark.parametrize(
    "kind,context_vocab,bias,lookup,corpus_bias",
    [
        ("feature", False, 0.0, (), 0.0),
        ("feature", True, 0.0, (), 0.0),
        ("feature", True, 1.5, (), 0.0),
        ("feature", False, 1.5, (), 0.0),
        ("feature", True, 1.0, (2.0, 3.0, 4.0), 0.0),
        ("feature", False, 0.0, (5.0,), 0.0),
        ("feature", True, 0.0, (), 6.0),
        ("feature", True, 0.0, (2.0, 4.0), 3.0),
        ("feature-deep", False, 0.0, (), 0.0),
        ("eagle3", False, 0.0, (), 0.0),
        ("eagle3", True, 1.5, (2.0, 3.0), 0.0),
    ],
)
def test_hits_equal_a_step_by_step_recount_with_the_drafters_cache(kind, context_vocab, bias, lookup, corpus_bias):
    """Row t, position j: the rank class of the target's greedy token after t + j (from the target's
    own logits) among the draft's top-k, the draft fed its own features through its KV cache. With
    ``context_vocab`` a subset head also ranks the tokens x_0..x_{t+1} outside its subset (ids 51..63
    here), as the eagle drafter does (EAGLE-3's own head is left as it is); ``bias`` is added to the
    logits of the tokens x_0..x_{t+1} the head holds, and ``lookup`` (the n-gram successor priors)
    to the tokens that follow the last n tokens of x_0..x_{t+j} in x_0..x_{t+1}; ``corpus_bias`` (the
    corpus prior) times the share of each successor of x_0..x_{t+j}'s longest frequent n-gram in a corpus
    of token lists."""
    from pacer_train.students import last_hidden_states, layer_inputs

    model = tiny_target()
    target = adapter(model)
    net = student(kind, target)
    embed, head = (w.float() for w in target.embedding_weights())
    tokens = torch.randint(3, 64, (14,), generator=torch.Generator().manual_seed(1))
    if lookup or corpus_bias:  # the target's own greedy answer, which falls into a loop: its n-grams recur
        tokens = torch.tensor(tokens[:5].tolist() + reference_greedy(model, tokens[:5].tolist(), 11, eos=False))
    feats = last_hidden_states(target, tokens[None])[0].float()
    fused = layer_inputs(target, tokens[None], LAYERS)[0].float() if kind == "eagle3" else None
    depth, ks, first = 3, (1, 2, 4, 8), 4
    rng = torch.Generator().manual_seed(2)
    corpus = (
        CorpusSuccessors(
            [torch.randint(3, 64, (40,), generator=rng).tolist() for _ in range(30)] + [tokens.tolist()] * 5,
            64,
            3,
            min_count=2,
        )
        if corpus_bias
        else None
    )
    hits = draft_hits(
        net,
        embed,
        head,
        tokens,
        feats,
        fused,
        target_greedy(feats[None], head)[0],
        first,
        depth,
        ks,
        context_vocab,
        bias,
        lookup,
        corpus,
        corpus_bias,
    )
    if context_vocab and kind == "feature":
        assert set(tokens.tolist()) - set(SUBSET.tolist())  # the sequence has tokens outside the subset
    with torch.no_grad():
        greedy = model(tokens[None]).logits[0].argmax(-1)  # after every position
        inputs = feats[:-1] if fused is None else net.fuse(fused[:-1])
        for t in range(len(tokens) - 1):
            ids = net.subset.tolist()
            if context_vocab and kind != "eagle3":
                ids += [x for x in dict.fromkeys(tokens[: t + 2].tolist()) if x not in ids]
            ids = torch.tensor(ids)
            head_sub = head[ids]
            read = torch.tensor([x in tokens[: t + 2].tolist() for x in ids.tolist()])
            cache = KVCache()
            out = net(embed[tokens[1 : t + 2]], inputs[: t + 1], torch.arange(t + 1), cache)[-1]
            for j in range(1, depth + 1):
                if t < first or t + j + 1 > len(tokens) - 1:  # a prompt row, or drafts past the last token
                    assert hits[t, j - 1] == -1, (t, j)
                    continue
                if j > 1:
                    out = net(embed[tokens[t + j]][None], out[None], torch.tensor([t + j - 1]), cache)[-1]
                logits = draft_logits(net, out, head_sub) + bias * read
                bonuses = [brute_successors(tokens[: t + 2].tolist(), tokens[: t + j + 1].tolist(), lookup)]
                if corpus is not None:
                    bonuses.append(corpus_bonus(corpus, tokens[: t + j + 1].tolist(), corpus_bias))
                for bonus_of in bonuses:
                    for token, bonus in bonus_of.items():
                        if token in ids.tolist():
                            logits[ids.tolist().index(token)] += bonus
                ranked = ids[logits.argsort(descending=True)].tolist()
                rank = ranked.index(int(greedy[t + j])) if int(greedy[t + j]) in ranked else 99
                expected = next((k for k in ks if rank < k), 0)
                assert hits[t, j - 1] == expected, (t, j, rank)


def test_chain_hits_tells_the_rank_class_and_leaves_out_prompt_and_end_rows():
    subset = torch.tensor([10, 11, 12, 13])
    # a sequence of 5 tokens: rows 0..3 (row t reads position t), target_next after positions 0..4
    target_next = torch.tensor([0, 12, 10, 13, 11])
    logits1 = torch.tensor(
        [
            [4.0, 3.0, 2.0, 1.0],  # row 0 (a prompt row): left out
            [4.0, 3.0, 2.0, 1.0],  # row 1: wants 10 (after position 2): rank 0 → top-1
            [4.0, 1.0, 2.0, 3.0],  # row 2: wants 13 (after 3): rank 1 → the top-2 class
            [0.0, 0.0, 0.0, 0.0],
        ]
    )  # row 3: drafts after position 4, the last: left out
    logits2 = torch.tensor(
        [
            [1.0, 2.0, 3.0, 4.0],  # row 0: a prompt row
            [1.0, 4.0, 3.0, 2.0],  # row 1: wants 13 (after 3), rank 2 → the top-4 class
            [0.0, 0.0, 0.0, 0.0],  # row 2: drafts after position 4: left out
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    hits = chain_hits([logits1, logits2], subset, target_next, first=1, ks=(1, 2, 4))
    assert hits.tolist() == [[-1, -1], [1, 4], [2, -1], [-1, -1]]
    # a token outside the top-k (here outside the draft's vocabulary) is 0
    assert chain_hits([logits1], subset, torch.tensor([0, 12, 99, 13, 11]), first=1, ks=(1, 2))[1, 0] == 0


def test_summarize_counts_each_position_given_the_earlier_hits_and_tau():
    hits = torch.tensor([[1, 1, 2], [1, 2, 1], [2, 1, 1], [0, 1, -1], [1, 1, -1]])
    s = summarize(hits, (1, 2))
    p1, p2, p3 = s["positions"]
    assert p1 == {"rows": 5, "top1": pytest.approx(3 / 5), "top2": pytest.approx(4 / 5)}
    assert p2 == {"rows": 3, "top1": pytest.approx(2 / 3), "top2": 1.0}  # rows 0, 1, 4 hit position 1
    assert p3 == {"rows": 1, "top1": 0.0, "top2": 1.0}  # row 0 (row 4's position 3 passes the end)
    # leading top-1 runs: 2, 1, 0, 0, 2 → τ = mean(1 + run)
    assert s["tau"] == pytest.approx((3 + 2 + 1 + 1 + 3) / 5) and s["rows"] == 5


def test_token_kinds_from_the_decoded_text():
    assert [token_kind(t) for t in ("", "\n\n", "  ", " 42", "**", "\ufffd", " Hello", "ing", " (x")] == [
        "special",
        "newline",
        "space",
        "digits",
        "punctuation",
        "punctuation",
        "word start",
        "word piece",
        "word start",
    ]


def test_summarize_kinds_splits_position_one_by_kind():
    first = torch.tensor([1, 0, 2, 1, 1])
    kinds = torch.tensor([0, 0, 2, 2, 4])  # word start, word start, punctuation, punctuation, newline
    assert summarize_kinds(first, kinds) == {
        "word start": {"rows": 2, "share": 0.4, "top1": 0.5},
        "punctuation": {"rows": 2, "share": 0.4, "top1": 0.5},
        "newline": {"rows": 1, "share": 0.2, "top1": 1.0},
    }


@pytest.fixture
def tiny_eval(tmp_path, monkeypatch):
    """``run_draft_eval`` on the tiny target (a character tokenizer) with a saved eagle3 draft."""
    import pacer_core.hf as hf

    model = tiny_target()
    target = adapter(model)

    class Tokenizer:
        def encode(self, text, chat_template=True):
            return [3 + ord(c) % 61 for c in text[:40]]

        def decode(self, ids):
            return "".join(
                " "
                if i % 7 == 0
                else "\n"
                if i % 7 == 1
                else "."
                if i % 7 == 2
                else "5"
                if i % 7 == 3
                else chr(97 + i % 26)
                for i in ids
            )

    monkeypatch.setattr(hf, "load_section", lambda section, name: (target, Tokenizer(), "tinydigest"))
    folder = tmp_path / "draft"
    student("eagle3", target).save(folder, {"family": "eagle3", "target_digest": "tinydigest"})

    def run(*overrides: str):
        cfg = load_config(
            None,
            [
                f"drafts=[{folder}]",
                f"out={tmp_path / 'eval'}",
                "limit=2",
                "prompt_sets=[humaneval,gsm8k]",
                "max_new_tokens=12",
                "depth=3",
                *overrides,
            ],
        )
        return run_draft_eval(cfg, "pacer draft-eval (test)")

    return run, folder, tmp_path


def test_the_command_reports_per_set_caches_the_answers_and_refuses_bad_input(tiny_eval, monkeypatch):
    run, folder, tmp_path = tiny_eval
    results = run()
    sets = results["drafts"][0]["sets"]
    assert set(sets) == {"humaneval", "gsm8k", "all"}
    rows = sum(sets[name]["rows"] for name in ("humaneval", "gsm8k"))
    answers = json.loads((tmp_path / "eval" / "answers.json").read_text())["records"]
    assert len(answers) == 4 and all(1 <= len(r["answer"]) <= 12 for r in answers)
    # position 1 is drafted after every answer token but the last (its next token is not in the answer)
    assert rows == sets["all"]["rows"] == sum(len(r["answer"]) - 1 for r in answers)
    assert (tmp_path / "eval" / "report.md").read_text().count("|") > 10
    # position 1 by the kind of the target's token: the kinds partition the rows and recompose top-1
    for s in sets.values():
        by_kind = s["by_kind"]
        assert sum(k["rows"] for k in by_kind.values()) == s["rows"]
        assert sum(k["share"] * k["top1"] for k in by_kind.values()) == pytest.approx(s["positions"][0]["top1"])
    assert "by the kind of the target's token" in (tmp_path / "eval" / "report.md").read_text()
    # the answers are reused: generating again would fail
    import pacer_core.hf.batched as batched

    monkeypatch.setattr(batched, "greedy_batch", lambda *a, **k: pytest.fail("answers generated again"))
    assert run()["drafts"] == results["drafts"]
    with pytest.raises(ConfigError, match="drafts is empty"):
        load_config(None, ["drafts=[]"])
    with pytest.raises(InputError, match="no manifest.json"):
        load_config(None, [f"drafts=[{tmp_path}]"])
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"family": "eagle3", "target_digest": "other"}))
    with pytest.raises(InputError, match="distilled from target other"):
        run()
    for damaged in ('{"family": "eagle3", "target_', '["eagle3"]'):
        manifest.write_text(damaged)
        with pytest.raises(InputError, match=f"draft manifest '{manifest}' .*damaged; distill the draft again"):
            run()

"""scripts/head_vocab_probe.py: its subset and context heads count exactly what `pacer draft-eval`
counts with ``context_vocab`` off and on, and its sampling acceptance is Σ min(p, q)."""

import torch

from pacer_plugins.eagle.agreement import context_columns, draft_hits
from pacer_plugins.eagle.features import target_greedy

from helpers import STUDENT_SUBSET as SUBSET
from helpers import adapter, load_script, student
from helpers import student_target as tiny_target


def probe():
    return load_script("head_vocab_probe")


def test_seen_is_causal():
    seen = context_columns(torch.arange(5), torch.tensor([2, 0, 3, 0]), False)[2]
    assert seen.tolist() == [
        [True, False, True, False, False],  # row 0 drafts after x_1: knows x_0, x_1
        [True, False, True, True, False],
        [True, False, True, True, False],
    ]


def test_heads_match_draft_eval_and_acceptance_is_the_overlap():
    from pacer_train.students import last_hidden_states

    model = tiny_target()
    target = adapter(model)
    net = student("feature", target)
    embed, head = (w.float() for w in target.embedding_weights())
    tokens = torch.randint(3, 64, (20,), generator=torch.Generator().manual_seed(2))
    assert set(tokens.tolist()) - set(SUBSET.tolist())  # some tokens lie outside the subset
    feats = last_hidden_states(target, tokens[None])[0].float()
    first, vocab = 5, head.shape[0]
    subset = torch.zeros(vocab, dtype=torch.bool)
    subset[SUBSET] = True
    out = probe().score_sequence(
        net,
        embed,
        head,
        tokens,
        feats,
        first,
        {"subset": subset, "context": None, "full": torch.ones(vocab, dtype=torch.bool)},
        [0.0, 1.0],
        [(), (2.0, 3.0)],
    )
    target_next = target_greedy(feats[None], head)[0]
    for name, context_vocab in (("subset", False), ("context", True)):
        expected = draft_hits(net, embed, head, tokens, feats, None, target_next, first, 4, (1,), context_vocab)
        assert torch.equal(out[(name, 0.0, ())][0], expected[expected[:, 0] >= 0]), name
    expected = draft_hits(net, embed, head, tokens, feats, None, target_next, first, 4, (1,), True, 1.0, (2.0, 3.0))
    assert torch.equal(out[("context", 1.0, (2.0, 3.0))][0], expected[expected[:, 0] >= 0])
    # the priors are the context head's
    assert ("subset", 1.0, ()) not in out and ("subset", 0.0, (2.0, 3.0)) not in out
    # Σ min(p, q) at position 1 under the full head, row `first`: p the target's, q the draft's
    with torch.no_grad():
        from pacer_plugins.eagle.students import unrolled_features

        q = torch.softmax(unrolled_features(net, embed, tokens[None], feats[None, :-1], 1)[0][0, first] @ head.T, -1)
    p = torch.softmax(feats[first + 1] @ head.T, -1)
    accept = out[("full", 0.0, ())][1]
    assert accept.shape[0] == len(tokens) - 2 - first
    assert torch.allclose(accept[0], torch.minimum(p, q).sum(), atol=1e-5)
    assert ((accept >= 0) & (accept <= 1 + 1e-6)).all()

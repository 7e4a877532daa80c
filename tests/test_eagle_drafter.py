"""The feature-level draft: the ``eagle`` drafter stays lossless, checks its target, and the
distillation pieces (loss, training with resume, vocabulary subset) behave."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pacer_core import Engine, InputError, hookimpl, load_config
from pacer_core.kernels import PackedLinear, packing_supported
from pacer_core.testing import chisquare_pvalue
from pacer_plugins.eagle.distill import DistillConfig, frequent_tokens
from pacer_plugins.eagle.model import ArchConfig, FeatureDraft, KVCache
from pacer_plugins.eagle.students import _attention_shape, draft_loss, train

from helpers import (
    EOS,
    LENGTH,
    PASS_P,
    adapter,
    bigram,
    brute_successors,
    engine_for,
    make_draft,
    one_line_error,
    reference_greedy,
    sample_outputs,
    single_thread,
    tiny_llama,
)


def eagle_engine(target_model, folder, stop="{name: fixed, gamma: 3}", extra=(), plugins=(), digest=None):
    target = adapter(target_model)
    target.digest = digest
    cfg = load_config(
        overrides=[f"strategy.drafter={{name: eagle, path: '{folder}'}}", f"strategy.stop=[{stop}]", *extra],
        require_models=False,
        extra_plugins=plugins,
    )
    return Engine.build(target, cfg=cfg, extra_plugins=plugins)


@pytest.mark.parametrize("stop", ["{name: fixed, gamma: 1}", "{name: fixed, gamma: 4}", "{name: heuristic}"])
@pytest.mark.parametrize(
    "prompt",
    [[1, 7, 9, 7, 9, 7], [5], list(range(3, 40)), [50, 7, 61, 9, 50, 61, 7]],
    ids=["repeat", "one-token", "long", "outside-subset"],
)
def test_eagle_greedy_equals_target(tmp_path, stop, prompt):
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    engine = eagle_engine(target_model, folder, stop)
    result = engine.generate(prompt, max_new_tokens=30)
    assert result.tokens == reference_greedy(target_model, prompt, 30)
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    # the features the drafter holds are the target's own, for every token whose forward ran
    committed = prompt + result.tokens
    assert drafter.features.shape[0] == len(engine.target.cached_tokens) <= len(committed)
    assert drafter.row_tokens[: drafter.true_rows] == committed[1 : drafter.true_rows + 1]
    if len(prompt) > 1:
        assert result.metrics["drafted"] > 0 and result.metrics["draft_forwards"] > 0


@pytest.mark.parametrize(
    "tree",
    [None, "{topk: 3, depth: 4, nodes: 10}", "{topk: 3, depth: 4, nodes: 4}"],
    ids=["chain", "tree", "tree-best-4"],
)
def test_a_deeper_draft_keeps_greedy_output_and_every_layers_cache_in_step(tmp_path, tree):
    """``extra_layers``: each later layer keeps its own cache rows, cropped with the first layer's, and
    sees the tree's mask and positions; output stays the target's."""
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft", extra_layers=2)
    assert json.loads((folder / "config.json").read_text())["extra_layers"] == 2
    extra = [f"strategy.drafter.tree={tree}"] if tree else []
    engine = eagle_engine(target_model, folder, "{name: fixed, gamma: 3}", extra=extra)
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    for prompt in ([1, 7, 9, 7, 9, 7], list(range(3, 40)), [50, 7, 61, 9, 50, 61, 7]):  # 50, 61: outside the subset
        result = engine.generate(prompt, max_new_tokens=30)
        assert result.tokens == reference_greedy(target_model, prompt, 30)
        assert result.metrics["drafted"] > 0
        assert [len(c) for c in drafter.cache.deeper] == [len(drafter.cache)] * 2
    # the cached rows are what a fresh causal pass over the same rows computes, in every layer
    rows = drafter.true_rows
    embed = drafter.embed[drafter.row_tokens[:rows]].to(drafter.dtype)
    fresh = KVCache()
    with torch.no_grad():
        drafter.net(embed, drafter.features[:rows], torch.arange(rows), fresh)
    for mine, theirs in zip([drafter.cache, *drafter.cache.deeper], [fresh, *fresh.deeper]):
        assert torch.allclose(mine.keys[:, :rows], theirs.keys, atol=1e-5)


@pytest.mark.parametrize("context_vocab", [None, False])
def test_eagle_sampling_q_covers_the_subset_and_the_context(tmp_path, context_vocab):
    """q is a distribution over the draft's subset (tokens 0..47) and, with ``context_vocab`` (on by
    default for a subset head), the committed tokens outside it; every other token has q = 0."""
    target_model = tiny_llama(0, scale=2.0)
    folder = make_draft(target_model, tmp_path / "draft")
    extra = ["sampling.temperature=0.9"] + (
        [f"strategy.drafter.context_vocab={str(context_vocab).lower()}"] if context_vocab is not None else []
    )
    engine = eagle_engine(target_model, folder, extra=extra)
    seen = []

    class Probe:
        @hookimpl
        def pacer_observe_step(self, state, step):
            if len(step.draft):
                seen.append((list(state.tokens), step.draft.draft_probs))

    engine.pm.register(Probe())
    prompt = [1, 7, 50, 9, 7, 61]  # 50 and 61 lie outside the draft's subset
    a = engine.generate(prompt, max_new_tokens=20, seed=3)
    assert engine.generate(prompt, max_new_tokens=20, seed=3).tokens == a.tokens
    assert seen
    for context, probs in seen:
        assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[0]), atol=1e-5)
        # the step observed sees the tokens committed after it; q was built from those before it
        allowed = torch.zeros(64, dtype=torch.bool)
        allowed[:48] = True
        if context_vocab is None:
            allowed[context] = True
        assert probs[:, ~allowed].abs().max() == 0
        outside = probs[:, [50, 61]]
        assert (outside > 0).all() if context_vocab is None else (outside == 0).all()


def test_context_bias_raises_the_logits_of_the_tokens_read_and_nothing_else(tmp_path):
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    prompt = [50, 7, 61, 9, 50, 61, 7]
    drafters = []
    for bias in ("0.0", "1.5"):
        engine = eagle_engine(target_model, folder, extra=[f"strategy.drafter.context_bias={bias}"])
        result = engine.generate(prompt, max_new_tokens=12)
        assert result.tokens == reference_greedy(target_model, prompt, 12)
        drafters.append(next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter"))
    plain, biased = drafters
    assert torch.equal(plain.columns.ids, biased.columns.ids) and plain.columns.scanned == biased.columns.scanned
    context = set((prompt + result.tokens)[: biased.columns.scanned])
    feature = torch.randn(2, plain.hidden_size)
    difference = biased._logits(feature) - plain._logits(feature)
    read = torch.tensor([int(t) in context for t in biased.columns.ids])
    assert torch.allclose(difference[:, read], torch.full((2, int(read.sum())), 1.5), atol=1e-5)
    assert difference[:, ~read].abs().max() == 0
    ids = biased.columns.ids
    assert {50, 61} <= set(ids.tolist()) and len(ids) == 48 + len(context - set(range(48)))


def test_eagle_refuses_a_draft_for_another_target(tmp_path):
    target_model = tiny_llama(0)
    folder = make_draft(target_model, tmp_path / "draft", digest="aaaa")
    with pytest.raises(InputError, match="distilled from target aaaa.*allow_other_target"):
        eagle_engine(target_model, folder, digest="bbbb")
    eagle_engine(target_model, folder, digest="bbbb", extra=["strategy.drafter.allow_other_target=true"])
    with pytest.raises(InputError, match="not a feature draft folder"):
        eagle_engine(target_model, tmp_path / "nowhere")


def eagle3_folder(folder):
    """A small EAGLE-3 draft folder as `pacer distill student.kind=eagle3` writes one."""
    from pacer_plugins.eagle.model import Eagle3Arch, Eagle3Draft

    arch = Eagle3Arch(
        hidden_size=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        rope_theta=10000.0,
        rms_eps=1e-6,
        draft_vocab_size=40,
        fused_size=96,
        vocab_size=64,
    )
    Eagle3Draft(arch).save(folder, {})
    return folder


@pytest.mark.parametrize(
    "family,config,needle",
    [
        ("feature_draft", {"extra_layers": 1_000_000}, "extra_layers is 1000000, but"),
        (
            "feature_draft",
            {"intermediate_size": 10**12},
            "intermediate_size is 1000000000000, but tensor 'gate_proj.weight' has shape (64, 32)",
        ),
        ("feature_draft", {"num_heads": 10**9}, "num_heads × head_dim is 8000000000"),
        ("feature_draft", {"head_dim": 2**30}, "num_heads × head_dim is 4294967296"),
        ("feature_draft", {"subset_size": 10**12}, "subset_size is 1000000000000, but tensor 'subset'"),
        ("feature_draft", {"hidden_size": 10**6}, "hidden_size is 1000000, but tensor 'fc.weight'"),
        ("feature_draft", {"intermediate_size": "big"}, "intermediate_size is 'big', not a whole number"),
        ("eagle3", {"fused_size": 10**12}, "fused_size is 1000000000000, but tensor 'fc.weight' has shape (32, 96)"),
        ("eagle3", {"draft_vocab_size": 10**12}, "draft_vocab_size is 1000000000000, but tensor 'lm_head.weight'"),
        ("eagle3", {"num_kv_heads": 10**9}, "num_kv_heads × head_dim is 8000000000"),
    ],
)
def test_a_draft_config_size_its_weights_do_not_hold_is_refused_before_anything_is_built(
    tmp_path, monkeypatch, family, config, needle
):
    """A `pacer distill` folder's config.json is checked against its weights' header before the
    network is built: a size they do not hold is one line naming the key (building anything here
    fails the test)."""
    from pacer_plugins.eagle import model

    def never_built(arch):
        raise AssertionError("a draft network was built from a config its weights were not checked against")

    folder = eagle3_folder(tmp_path / "d") if family == "eagle3" else make_draft(tiny_llama(0), tmp_path / "d")
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()), **config}))
    monkeypatch.setitem(model.FAMILIES, family, (never_built, model.FAMILIES[family][1]))
    with pytest.raises(InputError) as info:
        model.load_draft(folder)
    message = str(info.value)
    assert needle in message and "config.json" in message and "\n" not in message


def test_frequent_tokens_keep_always_tokens():
    tokens = torch.tensor([[5, 5, 5, 6, 6, 7]])
    subset = frequent_tokens(tokens, 2, {EOS})
    assert subset.tolist() == [EOS, 5]


def _tiny_training_setup(tmp_path, epochs):
    target = adapter(tiny_llama(0, hidden=32))
    cfg = DistillConfig(out=str(tmp_path))
    cfg.corpus.heldout_sequences = 2
    cfg.student.intermediate_size = 64
    cfg.train.epochs, cfg.train.batch_size, cfg.train.checkpoint_every, cfg.train.warmup = epochs, 4, 3, 2
    cfg.train.lr = 3e-3
    torch.manual_seed(0)
    tokens = torch.randint(3, 64, (18, 16))
    from pacer_train.students import last_hidden_states

    features = np.asarray(last_hidden_states(target, tokens).float().numpy(), dtype=np.float16)
    return cfg, target, tokens, features, torch.arange(64)


def test_training_lowers_the_loss_and_resumes(tmp_path):
    cfg, target, tokens, features, subset = _tiny_training_setup(tmp_path, epochs=2)
    net, metrics, info = train(cfg, tmp_path, tokens, features, target, subset)
    assert info["steps"] == 8 and 0.0 <= metrics["heldout_top1_first"] <= 1.0
    losses = [h["loss"] for h in info["history"]]
    cfg.train.epochs = 6  # resume the same run for longer
    net2, _, info2 = train(cfg, tmp_path, tokens, features, target, subset)
    assert info2["steps"] == 24 and info2["history"][: len(losses)] == info["history"]
    assert info2["history"][-1]["loss"] < losses[0]


def test_draft_loss_and_gradients_are_finite():
    target = adapter(tiny_llama(0, hidden=32))
    arch = ArchConfig(hidden_size=32, vocab_size=64, subset_size=64, intermediate_size=64, **_attention_shape(target))
    net = FeatureDraft(arch)
    embed, head = target.embedding_weights()
    tokens = torch.randint(0, 64, (2, 8))
    feats = torch.randn(2, 8, 32)
    loss, parts = draft_loss(net, embed, head, tokens, feats, 0.1, 1.0, 0.1, torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and all(np.isfinite(list(parts.values())))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_saved_draft_round_trips(tmp_path):
    target_model = tiny_llama(0)
    folder = make_draft(target_model, tmp_path / "d", seed=4)
    loaded = FeatureDraft.load(folder)
    assert json.loads((folder / "manifest.json").read_text())["target_digest"] is None
    assert loaded.subset.tolist() == list(range(48))


def test_distill_refuses_a_missing_corpus_file(capsys, tmp_path):
    from pacer_core import cli

    code = cli.main(["distill", f"out={tmp_path}", f"corpus.extra_files=[{tmp_path / 'nope.txt'}]"])
    err = capsys.readouterr().err
    assert code == 2 and "nope.txt' does not exist" in err and len(err.splitlines()) == 1


def test_recipe_guard_takes_options_added_later_at_their_default(tmp_path):
    from pacer_plugins.eagle.distill import DATA_KEYS
    from pacer_train import guard_recipe

    cfg = DistillConfig(out=str(tmp_path))
    recipe = guard_recipe(tmp_path, cfg, DATA_KEYS, "train options")
    del recipe["corpus"]["extra_files"]  # a folder made before the option existed
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    cfg.train.lr = 5e-4  # training options may change between runs
    guard_recipe(tmp_path, cfg, DATA_KEYS, "train options")
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    cfg.corpus.extra_files = ["notes.txt"]  # the old run read no extra file
    with pytest.raises(InputError, match=r"corpus.extra_files=\[\] \(not recorded.*choose a new out= folder"):
        guard_recipe(tmp_path, cfg, DATA_KEYS, "train options")
    cfg.corpus.extra_files, cfg.seed = [], 1
    with pytest.raises(InputError, match="made with seed=0, and this run has seed=1"):
        guard_recipe(tmp_path, cfg, DATA_KEYS, "train options")


# -- the token-level student (`pacer distill student.kind=token`) ---------------------------------
def test_token_student_learns_and_resumes_from_its_own_checkpoint(tmp_path):
    from pacer_train.token_student import train_token

    cfg, target, tokens, features, subset = _tiny_training_setup(tmp_path, epochs=2)
    cfg.student.kind, cfg.student.layers = "token", [0, -1]
    student, metrics, info = train_token(cfg, tmp_path, tokens, features, target, subset)
    assert student.config.num_hidden_layers == 2 and info["steps"] == 8
    assert (tmp_path / "checkpoint-token.pt").exists() and not (tmp_path / "checkpoint.pt").exists()
    assert not student.get_input_embeddings().weight.requires_grad  # shared with the target, frozen
    assert torch.equal(student.get_input_embeddings().weight, target.model.get_input_embeddings().weight)
    first = info["history"]
    cfg.train.epochs = 6
    _, metrics2, info2 = train_token(cfg, tmp_path, tokens, features, target, subset)
    assert info2["steps"] == 24 and info2["history"][: len(first)] == first
    assert info2["history"][-1]["loss"] < first[0]["loss"]
    assert 0.0 <= metrics2["heldout_top1_first_two"] <= metrics2["heldout_top1_first"] <= 1.0


def test_token_loss_is_the_soft_cross_entropy_to_the_target():
    from pacer_train.students import student_from_target
    from pacer_train.token_student import token_loss

    target = adapter(tiny_llama(0, hidden=32))
    student = student_from_target(target, [0, 1])  # the target itself: every layer copied
    tokens = torch.randint(3, 64, (2, 8))
    from pacer_train.students import last_hidden_states

    feats = last_hidden_states(target, tokens).float()
    head = target.embedding_weights()[1].float()
    loss, parts = token_loss(student, head, tokens, feats)
    teacher = torch.softmax(feats @ head.T, -1)
    entropy = -(teacher * torch.log(teacher)).sum(-1).mean()
    assert parts["top1"] == 1.0 and torch.allclose(loss, entropy, atol=1e-4)  # KL = 0: CE = H(teacher)
    # a sharpened target: the same student is no longer its minimiser, and the loss is the
    # cross-entropy to softmax(logits / T), which a near-zero T turns into the greedy token's
    sharp, _ = token_loss(student, head, tokens, feats, temperature=0.5)
    log_student = torch.log_softmax(feats @ head.T, -1)
    assert torch.allclose(sharp, -(torch.softmax(feats @ head.T / 0.5, -1) * log_student).sum(-1).mean(), atol=1e-4)
    hard, _ = token_loss(student, head, tokens, feats, temperature=1e-4)
    greedy = (feats @ head.T).argmax(-1, keepdim=True)
    assert torch.allclose(hard, -log_student.gather(-1, greedy).mean(), atol=1e-4)


def test_distill_refuses_a_teacher_temperature_that_is_not_positive(capsys, tmp_path):
    from pacer_core import cli

    code = cli.main(["distill", f"out={tmp_path}", "train.teacher_temperature=0"])
    err = capsys.readouterr().err
    assert code == 2 and "train.teacher_temperature must be > 0 (got 0.0)" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(not packing_supported(torch.float32), reason="this torch build cannot pack weights")
def test_eagle_packs_its_network_when_the_target_is_packed(tmp_path):
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    prompt = [1, 7, 9, 7, 9, 7, 3, 4]
    reference = reference_greedy(target_model, prompt, 30)
    target = adapter(target_model)
    target.pack_weights()
    cfg = load_config(
        overrides=[f"strategy.drafter={{name: eagle, path: '{folder}'}}", "strategy.stop=[{name: fixed, gamma: 3}]"],
        require_models=False,
    )
    engine = Engine.build(target, cfg=cfg)
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    assert isinstance(drafter.net.fc, PackedLinear) and drafter.head._packed is not None
    result = engine.generate(prompt, max_new_tokens=30)
    assert result.tokens == reference and result.metrics["drafted"] > 0


# -- context vocabulary: sampling stays exact -----------------------------------------------------------
CONTEXT_PROMPT = [3, 7, 11, 13, 5]  # 11 and 13 lie outside the draft's eight-token subset


def context_vocab_samples(tmp_path, samples, wrong=False, monkeypatch=None, bias=None):
    """Sampled chains of an own-subset draft (tokens 0..7) on a peaked bigram target of 16 tokens, whose
    prompt holds tokens outside the subset (``context_bias``: ``bias``, None = the default); ``wrong``:
    the drafter samples from subset + context but reports q = 0 for the context tokens (the verifier
    then accepts them whenever drafted)."""
    from pacer_core.testing import exact_continuation_probs
    from pacer_plugins.eagle.drafter import EagleDrafter

    if wrong:
        choose = EagleDrafter._choose

        def claims_subset_only(self, *args):
            token, probs = choose(self, *args)  # over self.columns.ids: the subset, then the context's tokens
            probs = probs.clone()
            probs[len(self.subset) :] = 0.0
            return token, probs / probs.sum()

        monkeypatch.setattr(EagleDrafter, "_choose", claims_subset_only)
    target_model = bigram(tiny_llama(0, vocab=16, scale=25.0))
    folder = make_draft(target_model, tmp_path / "draft", subset_size=8)
    engine = engine_for(
        target_model,
        folder,
        stop="{name: fixed, gamma: 2}",
        eos=False,
        extra=[
            "sampling.temperature=1.0",
            "strategy.verifier={name: speculative_sampling}",
            "generation.ignore_eos=true",
        ]
        + ([] if bias is None else [f"strategy.drafter.context_bias={bias}"]),
    )
    drafted = []

    class Probe:
        @hookimpl
        def pacer_observe_step(self, state, step):
            drafted.extend(step.draft.tokens.tolist())

    engine.pm.register(Probe())
    outputs, _ = sample_outputs(engine, CONTEXT_PROMPT, samples)
    expected = exact_continuation_probs(adapter(target_model, eos=False), CONTEXT_PROMPT, LENGTH, engine.sampling)
    return chisquare_pvalue(outputs, expected), drafted


@pytest.mark.parametrize("bias", [None, 0.0, 2.0], ids=["default-bias", "no-bias", "bias2"])
def test_context_vocab_sampling_matches_the_target_distribution(tmp_path, bias):
    with single_thread():
        p_value, drafted = context_vocab_samples(tmp_path, 400, bias=bias)
    assert p_value > PASS_P
    assert {11, 13} & set(drafted)  # context tokens outside the subset were drafted


def test_context_tokens_drafted_but_claimed_impossible_fail_the_distribution_test(tmp_path, monkeypatch):
    with single_thread():
        p_value, _ = context_vocab_samples(tmp_path, 400, wrong=True, monkeypatch=monkeypatch)
    assert p_value < 1e-6


# -- lookup bias: the priors reach the drafted distribution, and sampling stays exact -----------------
LOOKUP_PROMPT = [3, 7, 3, 7, 3]  # 7 followed 3, (7, 3) and (3, 7, 3): every prior points at 7


CORPUS_DOCS = [[a, (5 * a + 3) % 8] for a in range(16)] * 5  # the corpus prior: a → 5a + 3 mod 8, in the subset


def lookup_samples(tmp_path, samples, monkeypatch=None, corpus=False):
    """Sampled chains on the peaked bigram target of 16 tokens with the default priors (``corpus``: the
    corpus prior alone over CORPUS_DOCS, with a bias of 30 that outweighs the draft's own logits);
    with ``monkeypatch``, the drafter samples with the prior but reports q without it."""
    from pacer_core.testing import exact_continuation_probs
    from pacer_plugins.eagle.drafter import EagleDrafter

    prior = "corpus_bias" if corpus else "lookup_bias"
    if monkeypatch is not None:
        choose = EagleDrafter._choose

        def reports_q_without_the_prior(self, feature, generator, suffix):
            token, _ = choose(self, feature, generator, suffix)
            saved = getattr(self, prior)
            setattr(self, prior, 0.0 if corpus else ())
            _, unbiased = choose(self, feature, torch.Generator().manual_seed(0), suffix)
            setattr(self, prior, saved)
            return token, unbiased

        monkeypatch.setattr(EagleDrafter, "_choose", reports_q_without_the_prior)
    target_model = bigram(tiny_llama(0, vocab=16, scale=25.0))
    folder = make_draft(target_model, tmp_path / "draft", subset_size=8)
    extra = []
    if corpus:
        (tmp_path / "corpus.json").write_text(json.dumps(CORPUS_DOCS))
        extra = [
            "strategy.drafter.lookup_bias=[]",
            "strategy.drafter.corpus_bias=30.0",
            f"strategy.drafter.corpus={tmp_path / 'corpus.json'}",
        ]
    engine = engine_for(
        target_model,
        folder,
        stop="{name: fixed, gamma: 2}",
        eos=False,
        extra=[
            "sampling.temperature=1.0",
            "strategy.verifier={name: speculative_sampling}",
            "generation.ignore_eos=true",
        ]
        + extra,
    )
    outputs, _ = sample_outputs(engine, LOOKUP_PROMPT, samples)
    expected = exact_continuation_probs(adapter(target_model, eos=False), LOOKUP_PROMPT, LENGTH, engine.sampling)
    return chisquare_pvalue(outputs, expected)


def test_lookup_bias_sampling_matches_the_target_distribution(tmp_path):
    with single_thread():
        assert lookup_samples(tmp_path, 400) > PASS_P


def test_a_lookup_bias_left_out_of_the_reported_q_fails_the_distribution_test(tmp_path, monkeypatch):
    with single_thread():
        assert lookup_samples(tmp_path, 1000, monkeypatch) < 1e-6


def test_corpus_bias_sampling_matches_the_target_distribution(tmp_path):
    with single_thread():
        assert lookup_samples(tmp_path, 400, corpus=True) > PASS_P


def test_a_corpus_bias_left_out_of_the_reported_q_fails_the_distribution_test(tmp_path, monkeypatch):
    with single_thread():
        assert lookup_samples(tmp_path, 300, monkeypatch, corpus=True) < 1e-6


@pytest.mark.parametrize(
    "tree",
    [None, "{topk: 3, depth: 4, nodes: 10}", "{topk: 3, depth: 4, nodes: 4}"],
    ids=["chain", "tree", "tree-best-4"],
)
def test_corpus_bias_adds_the_share_of_the_paths_corpus_successors(tmp_path, tree):
    """Greedy output stays the target's; the bonus is corpus_bias × the share of each successor of the
    longest frequent n-gram ending the path, in the corpus (read from a .json of token ids)."""
    from pacer_core.priors import corpus_bonus
    from pacer_train.corpus.prior import CORPUS_NGRAM

    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    docs = [[1, 7, 9, 7, 9, 7, 3] * 3, [7, 9, 4, 7, 9, 4, 9, 4, 5, 9, 4]]
    (tmp_path / "corpus.json").write_text(json.dumps(docs))
    extra = ["strategy.drafter.corpus_bias=3.0", f"strategy.drafter.corpus={tmp_path / 'corpus.json'}"]
    if tree:
        extra.append(f"strategy.drafter.tree={tree}")
    engine = eagle_engine(target_model, folder, "{name: fixed, gamma: 4}", extra=extra)
    prompt = [1, 7, 9, 7, 9, 7, 9, 7]
    result = engine.generate(prompt, max_new_tokens=24)
    assert result.tokens == reference_greedy(target_model, prompt, 24) and result.metrics["drafted"] > 0
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    assert drafter.corpus.longest == CORPUS_NGRAM and drafter.suffix_length == CORPUS_NGRAM
    feature = torch.randn(1, drafter.hidden_size)
    saved, drafter.lookup_bias = drafter.lookup_bias, ()
    for suffix in ([9, 7, 9], [3, 5, 9], [7, 9, 4, 9]):
        bonus = corpus_bonus(drafter.corpus, suffix, 3.0)
        assert bonus
        difference = drafter._logits(feature, [suffix])[0] - drafter._logits(feature, None)[0]
        expected = torch.zeros_like(difference)
        held = {token: value for token, value in bonus.items() if drafter.columns.column[token] >= 0}
        assert held  # successors the draft's head can say
        for token, value in held.items():
            expected[int(drafter.columns.column[token])] = value
        assert torch.allclose(difference, expected)
    drafter.lookup_bias = saved


def test_a_missing_corpus_is_refused_in_one_line(tmp_path):
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    with pytest.raises(InputError, match="does not exist"):
        eagle_engine(
            target_model,
            folder,
            "{name: fixed, gamma: 2}",
            extra=["strategy.drafter.corpus_bias=1.0", f"strategy.drafter.corpus={tmp_path / 'none.json'}"],
        )


def test_lookup_bias_follows_the_draft_path_over_the_committed_text(tmp_path, monkeypatch):
    """Each draft token's lookup reads the last tokens of the committed text and the tokens drafted
    before it in the step, and adds Σ b_n to the successors of their n-gram in the committed text."""
    from pacer_plugins.eagle.drafter import EagleDrafter

    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    calls = []
    logits = EagleDrafter._logits

    def spy(self, features, suffixes=None):
        calls.append((list(self._index.text), suffixes))
        return logits(self, features, suffixes)

    monkeypatch.setattr(EagleDrafter, "_logits", spy)
    propose = EagleDrafter.pacer_propose
    steps = []

    def record(self, state, draft, num_tokens):
        start = len(calls)
        block = propose(self, state, draft, num_tokens)
        steps.append((state.tokens + draft.tokens.tolist(), block, calls[start:]))
        return block

    monkeypatch.setattr(EagleDrafter, "pacer_propose", hookimpl(record))
    engine = eagle_engine(
        target_model,
        folder,
        "{name: fixed, gamma: 4}",
        extra=["strategy.drafter.context_bias=0", "strategy.drafter.lookup_bias=[2.0, 3.0]"],
    )
    prompt = [1, 7, 9, 7, 9, 7, 9, 7]
    assert engine.generate(prompt, max_new_tokens=24).tokens == reference_greedy(target_model, prompt, 24)
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    assert drafter.lookup_bias == (2.0, 3.0)
    checked = 0
    for context, block, made in steps:
        if block is None:
            continue
        for i, (committed, suffixes) in enumerate(made):
            assert suffixes == [(context + block.tokens[:i].tolist())[-2:]]
            assert committed == context[: len(committed)] and len(committed) >= len(context) - len(block.tokens)
            checked += 1
    assert checked > 5
    # the bonus itself: the logits of a feature with and without the priors
    feature = torch.randn(1, drafter.hidden_size)
    suffix = [9, 7]
    bonus = brute_successors(drafter._index.text, suffix, [2.0, 3.0])
    assert bonus  # 7 and (9, 7) were followed by 9 in the committed text
    with_priors = logits(drafter, feature, [suffix])[0]
    without = logits(drafter, feature, None)[0]
    expected = torch.zeros_like(without)
    for token, value in bonus.items():
        expected[int(drafter.columns.column[token])] = value
    assert torch.allclose(with_priors - without, expected)


def test_the_corpus_prior_is_on_by_default_only_over_the_targets_own_writing(tmp_path):
    """corpus_bias unset: CORPUS_BIAS over a corpus file or a corpus this target wrote; off over the
    shipped corpus for another target (here a tiny one), and for published checkpoints (their tests)."""
    from pathlib import Path

    import pacer_plugins.eagle
    from pacer_train.corpus.prior import CORPUS_BIAS, own_corpus

    shipped = json.loads((Path(pacer_plugins.eagle.__file__).parent / "corpus" / "manifest.json").read_text())
    assert own_corpus("shipped", shipped["target"]["digest"]) and not own_corpus("shipped", "another")
    assert not own_corpus("shipped", None) and own_corpus(str(tmp_path / "ids.json"), None)
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    (tmp_path / "ids.json").write_text(json.dumps([[1, 7, 9, 7, 9, 7, 3] * 3]))
    for extra, bias in (([], 0.0), ([f"strategy.drafter.corpus={tmp_path / 'ids.json'}"], CORPUS_BIAS)):
        engine = eagle_engine(target_model, folder, "{name: fixed, gamma: 2}", extra=extra)
        drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
        assert drafter.corpus_bias == bias and (drafter.corpus is None) == (bias == 0.0)


# -- the thresholds a draft recommends to the stop policies -----------------------------------------
def _stops(engine) -> dict:
    return {type(p).__name__ + (f":{p.name}" if hasattr(p, "name") else ""): p for p in engine.pm.get_plugins()}


def test_a_drafts_recommended_stop_thresholds_reach_stops_whose_threshold_is_unset(tmp_path):
    """The manifest's stop_thresholds become Resources.stop_thresholds: a stop with its threshold
    unset takes its entry, a set one keeps its own; with a prior option set, or through a hybrid's
    primary member, the same rule; another stop name keeps the stop's default."""
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["stop_thresholds"] = {"confidence": 0.9, "entropy": 0.7}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    stops = "{name: confidence}, {name: entropy}, {name: svip}"
    engine = engine_for(target_model, folder, stops)
    found = _stops(engine)
    assert found["Confidence:confidence"].threshold == 0.9
    assert found["EntropyBound:entropy"].threshold == 0.7  # λ₀ (adapt on: no step observed yet)
    assert found["EntropyBound:svip"].threshold == pytest.approx(1 - 0.45)  # no entry: h's default
    metrics = engine.generate([1, 2, 3, 4], max_new_tokens=6).metrics  # each reports what it used
    assert metrics["confidence_threshold"] == 0.9 and metrics["svip_threshold"] == pytest.approx(0.45)
    assert 0.0 <= metrics["entropy_threshold"] <= 1.0  # λ₀ 0.7, then calibrated
    explicit = _stops(engine_for(target_model, folder, "{name: confidence, threshold: 0.3}"))
    assert explicit["Confidence:confidence"].threshold == 0.3
    no_lookup = _stops(
        engine_for(target_model, folder, "{name: confidence}", extra=["strategy.drafter.lookup_bias=[]"])
    )
    assert no_lookup["Confidence:confidence"].threshold == 0.4  # measured with the priors: not offered
    target = adapter(target_model)
    cfg = load_config(
        overrides=[
            f"strategy.drafter={{name: hybrid, members: [{{name: eagle, path: '{folder}'}}, {{name: prompt_lookup}}]}}",
            "strategy.stop=[{name: confidence}]",
        ],
        require_models=False,
    )
    assert _stops(Engine.build(target, cfg=cfg))["Confidence:confidence"].threshold == 0.9


@pytest.mark.parametrize("entry", [{"confidence": 1.5}, {"confidence": "high"}, [0.9], {"confidence": True}])
def test_a_bad_stop_thresholds_entry_is_refused_in_one_line(tmp_path, entry):
    target_model = tiny_llama(0, scale=6.0)
    folder = make_draft(target_model, tmp_path / "draft")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["stop_thresholds"] = entry
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="stop_thresholds must map stop names to numbers in \\[0, 1\\]"):
        engine_for(target_model, folder, "{name: confidence}")


def test_the_shipped_draft_recommends_the_thresholds_its_docs_report():
    from pacer_plugins.eagle.drafter import (
        DEFAULT_DRAFT,
        EagleConfig,
        read_manifest,
        recommended_stop_thresholds,
    )

    manifest = read_manifest(DEFAULT_DRAFT)
    thresholds = recommended_stop_thresholds(DEFAULT_DRAFT, manifest, EagleConfig())
    assert thresholds == {"confidence": 0.95, "entropy": 0.8, "svip": 0.25}
    assert recommended_stop_thresholds(DEFAULT_DRAFT, manifest, EagleConfig(corpus_bias=0.0)) == {}


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.batch_size=0", "'batch_size' must lie in [1, 4096]"),
        ("train.epochs=0", "'epochs' must lie in (0,"),
        ("train.lr=-1", "'lr' must lie in (0, 10]"),
        ("train.warmup=-5", "'warmup' must lie in [0,"),
        ("train.checkpoint_every=0", "'checkpoint_every' must lie in [1,"),
        ("train.threads=-1", "'threads'"),
        ("train.noise=-1", "'noise' must lie in [0,"),
        ("train.weight_decay=-1", "'weight_decay'"),
        ("corpus.chat_answers=-1", "'chat_answers' must be >= 0"),
        ("student.subset_size=-3", "'subset_size'"),
        ("student.intermediate_size=0", "'intermediate_size' must be >= 1"),
        ("student.fused_layers=[-5]", "'fused_layers' must name target decoder layers"),
    ],
)
def test_distill_refuses_an_option_out_of_range_before_any_model_loads(
    capsys, tmp_path, monkeypatch, override, message
):
    """Every numeric distill option has a range: a value outside it is one line, before the target
    loads (these built a corpus, or trained with a negative learning rate)."""
    import pacer_core.hf

    monkeypatch.setattr(pacer_core.hf, "load_section", lambda *a, **k: pytest.fail("the target was loaded"))
    assert message in one_line_error(capsys, ["distill", f"out={tmp_path / 'run'}", override])

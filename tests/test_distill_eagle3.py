"""`pacer distill` beyond EAGLE-1: the EAGLE-3 family, the training-time test over k steps,
continuing from a draft (``init=``), the scaling curve, the time budget and the vocabulary
coverage — on tiny seeded Llama targets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pacer_core import Engine, InputError, load_config
from pacer_plugins.eagle.distill import DistillConfig, load_distill_config, run_distill, vocab_coverage
from pacer_plugins.eagle.features import extract_feature_sets, extract_features
from pacer_plugins.eagle.model import Eagle3Draft, FeatureDraft, KVCache, load_draft
from pacer_plugins.eagle.students import build_student, draft_loss, train, unrolled_features
from pacer_train.distillation import batch_ids

from helpers import EOS, adapter, block_engine, reference_greedy, tiny_llama

LAYERS = [0, 1, 2]  # the tiny target has 3 decoder layers: the inputs of each


def tiny_target(seed: int = 0):
    return tiny_llama(seed, layers=3, scale=4.0)


def student(kind: str, target, seed: int = 0) -> torch.nn.Module:
    """kind: feature, eagle3, or feature-deep (a feature student with two decoder layers)."""
    cfg = DistillConfig()
    cfg.seed, cfg.student.kind, cfg.student.intermediate_size = seed, kind.removesuffix("-deep"), 64
    cfg.student.extra_layers = int(kind.endswith("-deep"))
    if kind == "eagle3":
        cfg.student.fused_layers = LAYERS
    return build_student(cfg, target, torch.arange(48), target.embedding_weights()[1].float())


def batch(target, kind: str, rows: int = 2, length: int = 10, seed: int = 0):
    """tokens [B, L], the target's last-layer states and (eagle3) its layers' inputs."""
    from pacer_train.students import last_hidden_states, layer_inputs

    tokens = torch.randint(3, 64, (rows, length), generator=torch.Generator().manual_seed(seed))
    feats = last_hidden_states(target, tokens).float().clone()
    fused = layer_inputs(target, tokens, LAYERS).float().clone() if kind == "eagle3" else None
    return tokens, feats, fused


# -- the training-time test ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["feature", "feature-deep", "eagle3"])
def test_unrolled_steps_equal_what_the_drafter_computes_step_by_step(kind):
    """Row t of step j is the draft's j-th token after position t, as the drafter's cache computes it:
    true rows 0..t, then its own predictions fed back one row at a time."""
    target = adapter(tiny_target())
    net = student(kind, target).eval()
    embed = target.embedding_weights()[0].float()
    tokens, feats, fused = batch(target, kind, rows=1, length=9)
    inputs = feats[:, :-1] if fused is None else net.fuse(fused[:, :-1])
    with torch.no_grad():
        steps = unrolled_features(net, embed, tokens, inputs, 3)
        for t in range(tokens.shape[1] - 3):
            cache = KVCache()
            out = net(embed[tokens[0, 1 : t + 2]], inputs[0, : t + 1], torch.arange(t + 1), cache)[-1]
            for j in range(3):
                if j:
                    out = net(embed[tokens[0, t + j + 1]][None], out[None], torch.tensor([t + j]), cache)[-1]
                assert torch.allclose(steps[j][0, t], out, atol=1e-5), (t, j)


@pytest.mark.parametrize("kind", ["feature", "feature-deep", "eagle3"])
def test_later_steps_are_trained_through_the_fed_back_features(kind):
    """Step j+1 depends on step j's output at the same row, and only through it (a detached feed
    would give no gradient; a wrong mask would leak other rows)."""
    target = adapter(tiny_target())
    net = student(kind, target)
    embed = target.embedding_weights()[0].float()
    tokens, feats, fused = batch(target, kind, rows=1, length=8)
    inputs = feats[:, :-1] if fused is None else net.fuse(fused[:, :-1])
    steps = unrolled_features(net, embed, tokens, inputs, 3)
    for j in (1, 2):
        for t in (0, 3):
            grad = torch.autograd.grad(steps[j][0, t].sum(), steps[j - 1], retain_graph=True, allow_unused=True)[0]
            assert grad is not None and grad[0, t].abs().sum() > 0
            others = torch.cat([grad[0, :t], grad[0, t + 1 :]])
            assert torch.count_nonzero(others) == 0


@pytest.mark.parametrize("kind", ["feature", "feature-deep", "eagle3"])
def test_the_loss_of_k_steps_differs_from_one_step_and_trains_every_weight(kind):
    target = adapter(tiny_target())
    embed, head = (w.float() for w in target.embedding_weights())
    tokens, feats, fused = batch(target, kind, rows=2, length=10)
    losses, grads = {}, {}
    for k in (1, 3):
        net = student(kind, target)
        loss, parts = draft_loss(net, embed, head[net.subset], tokens, feats, 0.0, 1.0, 0.1, None, k, fused)
        loss.backward()
        losses[k], grads[k] = float(loss.detach()), {n: p.grad.clone() for n, p in net.named_parameters()}
        assert np.isfinite(losses[k]) and 0.0 <= parts["top1"] <= 1.0
        assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads[k].values())
    assert losses[3] > losses[1]  # two more steps' losses are added
    assert not torch.allclose(grads[3]["fc.weight"], grads[1]["fc.weight"])


@pytest.mark.parametrize("temperature", [1.0, 0.5])
@pytest.mark.parametrize("kind", ["feature", "eagle3"])
def test_the_loss_is_each_steps_cross_entropy_to_the_target_at_its_own_position(kind, temperature):
    """A direct recount: step j of row t is trained towards softmax(W_subset f_{t+j} / temperature)
    (and, for `feature`, f_{t+j} itself), rows past the end left out, each step's mean over its
    valid rows."""
    import torch.nn.functional as F

    from pacer_plugins.eagle.model import draft_logits

    target = adapter(tiny_target())
    embed, head = (w.float() for w in target.embedding_weights())
    tokens, feats, fused = batch(target, kind, rows=2, length=9)
    net = student(kind, target)
    head_sub = head[net.subset]
    loss, _ = draft_loss(net, embed, head_sub, tokens, feats, 0.0, 1.0, 0.1, None, 3, fused, temperature=temperature)
    inputs = feats[:, :-1] if fused is None else net.fuse(fused[:, :-1])
    expected = 0.0
    for j, guess in enumerate(unrolled_features(net, embed, tokens, inputs, 3), start=1):
        ce, feature = [], []
        for t in range(tokens.shape[1] - j):  # t + j <= L - 1; every sequence of the batch at once
            teacher = torch.softmax(feats[:, t + j] @ head_sub.T / temperature, -1)
            ce.append(-(teacher * torch.log_softmax(draft_logits(net, guess[:, t], head_sub), -1)).sum(-1))
            feature.append(F.smooth_l1_loss(guess[:, t], feats[:, t + j], reduction="none").mean(-1))
        ce, feature = torch.cat(ce).mean(), torch.cat(feature).mean()
        expected = expected + (ce if kind == "eagle3" else 1.0 * feature + 0.1 * ce)
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)


# -- training and the drafter ------------------------------------------------------------------------
def tiny_run(tmp_path, kind="eagle3", epochs=2.0, unroll=3, init=None):
    target = adapter(tiny_target())
    cfg = DistillConfig(out=str(tmp_path))
    cfg.corpus.heldout_sequences = 2
    cfg.student.kind, cfg.student.intermediate_size = kind, 64
    cfg.student.fused_layers = LAYERS if kind == "eagle3" else None
    cfg.train.epochs, cfg.train.batch_size, cfg.train.checkpoint_every, cfg.train.warmup = epochs, 4, 2, 2
    cfg.train.lr, cfg.train.unroll, cfg.init = 3e-3, unroll, init
    tokens = torch.randint(3, 64, (14, 12), generator=torch.Generator().manual_seed(0))
    features = extract_features(tmp_path, tokens, target)
    fused = extract_features(tmp_path, tokens, target, layers=LAYERS) if kind == "eagle3" else None
    return cfg, target, tokens, features, fused


def test_one_forward_extracts_both_feature_files_as_two_passes_would_and_resumes(tmp_path):
    """An eagle3 run's last-layer states and fused layers' inputs come from one target forward per
    batch: the same files as two separate passes; a run stopped with the files at different counts
    resumes from the smaller and leaves what the other already has."""
    target = adapter(tiny_target())
    tokens = torch.randint(3, 64, (5, 8), generator=torch.Generator().manual_seed(3))
    alone = tmp_path / "alone"
    alone.mkdir()
    separate = [
        np.array(extract_features(alone, tokens, target, batch_size=2)),
        np.array(extract_features(alone, tokens, target, batch_size=2, layers=LAYERS)),
    ]
    together = tmp_path / "together"
    together.mkdir()
    both = extract_feature_sets(together, tokens, target, [None, LAYERS], batch_size=2)
    for got, want in zip(both, separate):
        assert np.array_equal(np.array(got), want)
    # the fused file stopped after 2 sequences, the last-layer one is complete
    (together / "features-layers-0-1-2.done").write_text("2")
    fused_file = np.memmap(together / "features-layers-0-1-2.f16", dtype=np.float16, mode="r+", shape=separate[1].shape)
    fused_file[2:] = 0
    fused_file.flush()
    again = extract_feature_sets(together, tokens, target, [None, LAYERS], batch_size=2)
    assert np.array_equal(np.array(again[1]), separate[1]) and np.array_equal(np.array(again[0]), separate[0])
    assert (together / "features.done").read_text() == "5" == (together / "features-layers-0-1-2.done").read_text()


def test_eagle3_training_lowers_the_loss_measures_agreement_and_resumes(tmp_path):
    cfg, target, tokens, features, fused = tiny_run(tmp_path, epochs=2)
    net, metrics, info = train(cfg, tmp_path, tokens, features, target, torch.arange(64), fused=fused)
    assert isinstance(net, Eagle3Draft) and info["steps"] == 6 and info["finished"]
    assert set(metrics) == {"heldout_top1_first", "heldout_top1_second", "heldout_top1_first_two"}
    assert all("heldout_top1_first" in h and h["tokens"] == h["step"] * 4 * 12 for h in info["history"])
    curve = json.loads((tmp_path / "scaling.json").read_text())
    assert [p["tokens"] for p in curve["points"]] == [h["tokens"] for h in info["history"]]
    cfg.train.epochs = 6
    _, _, longer = train(cfg, tmp_path, tokens, features, target, torch.arange(64), fused=fused)
    assert longer["steps"] == 18 and longer["history"][:3] == info["history"]
    assert longer["history"][-1]["loss"] < info["history"][0]["loss"]


def fake_tokenizer():
    class Tokenizer:
        def encode(self, text, chat_template=True):
            return [3 + ord(c) % 61 for c in text]

    return Tokenizer()


@pytest.fixture
def tiny_distill(tmp_path, monkeypatch):
    """``run_distill`` on the tiny target: its corpus one text file (no stdlib, docs or chat)."""
    import pacer_core.hf as hf

    model = tiny_target()
    monkeypatch.setattr(hf, "load_section", lambda section, name: (adapter(model), fake_tokenizer(), None))
    monkeypatch.setattr(hf, "materialize", lambda path: tmp_path)  # no tokenizer files to copy
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 14)

    def distill(out: str, *overrides: str) -> Path:
        cfg = load_distill_config(
            None,
            [
                f"out={tmp_path / out}",
                "corpus.stdlib_tokens=0",
                "corpus.docs_tokens=0",
                "corpus.chat_answers=0",
                f"corpus.extra_files=[{text}]",
                "corpus.seq_len=12",
                "corpus.heldout_sequences=2",
                "student.kind=eagle3",
                f"student.fused_layers={LAYERS}",
                "student.intermediate_size=64",
                "train.batch_size=4",
                "train.checkpoint_every=2",
                "train.warmup=2",
                "train.lr=0.003",
                "train.unroll=3",
                *overrides,
            ],
        )
        return run_distill(cfg, "pacer distill (test)")

    return model, distill


def eagle_engine(target_model, folder):
    cfg = load_config(
        overrides=[f"strategy.drafter={{name: eagle, path: '{folder}'}}", "strategy.stop=[{name: fixed, gamma: 3}]"],
        require_models=False,
    )
    return Engine.build(adapter(target_model), cfg=cfg)


def test_distill_eagle3_end_to_end_the_eagle_drafter_keeps_greedy_output(tiny_distill, tmp_path):
    model, distill = tiny_distill
    export = distill("run", "train.epochs=2")
    manifest = json.loads((export / "manifest.json").read_text())
    assert json.loads((export / "config.json").read_text())["target_layers"] == LAYERS
    assert manifest["family"].startswith("eagle3") and manifest["training"]["finished"]
    assert set(manifest["vocab_coverage"]) == {"8192", "16384", "32768"}
    assert all(
        0 < c["corpus_tokens"] <= 1 and 0 <= c["heldout_target_greedy"] <= 1
        for c in manifest["vocab_coverage"].values()
    )
    run_curve = json.loads((tmp_path / "run" / "scaling.json").read_text())
    assert json.loads((export / "scaling.json").read_text()) == run_curve and len(run_curve["points"]) >= 2
    engine = eagle_engine(model, export)
    drafter = next(p for p in engine.pm.get_plugins() if type(p).__name__ == "EagleDrafter")
    assert drafter.layout == "eagle3" and drafter.draft_info.target_layers == tuple(LAYERS)
    for prompt in ([1, 7, 9, 7, 9, 7], list(range(3, 30))):
        result = engine.generate(prompt, max_new_tokens=24)
        assert result.tokens == reference_greedy(model, prompt, 24)
        assert result.metrics["drafted"] > 0


def test_continuing_from_a_draft_starts_from_its_weights_and_its_curve(tiny_distill, tmp_path):
    model, distill = tiny_distill
    first = distill("first", "train.epochs=2")
    before = json.loads((first / "manifest.json").read_text())["training"]
    second = distill("second", "train.epochs=1", f"init={first}", "train.noise=0", "train.checkpoint_every=1")
    manifest = json.loads((second / "manifest.json").read_text())
    training = manifest["training"]
    assert training["init"] == str(first)
    assert training["tokens_total"] == before["tokens_total"] + training["tokens_seen"]
    # what the init's weights saw stays recorded (train-preverify keeps it out of M_B's prompts)
    first_sources = json.loads((first / "manifest.json").read_text())["corpus_sources"]
    assert manifest["corpus_sources"]["init"] == first_sources and "init" not in first_sources
    assert "init_corpus_sources" not in training
    # from a run's checkpoint: that run's corpus, and what its own init saw, under init
    third = distill("third", "train.epochs=1", f"init={tmp_path / 'second' / 'checkpoint.pt'}")
    assert json.loads((third / "manifest.json").read_text())["corpus_sources"]["init"] == manifest["corpus_sources"]
    # step 0 of the new run is the loss of the loaded draft on the step's batch
    loaded = load_draft(first)
    cfg = load_distill_config(None, ["corpus.heldout_sequences=2", "train.batch_size=4", "train.epochs=1"])
    run = tmp_path / "second"
    tokens = torch.load(run / "corpus.pt", weights_only=True)["tokens"]
    target = adapter(model)
    features = extract_features(run, tokens, target)
    fused = extract_features(run, tokens, target, layers=LAYERS)
    ids = batch_ids(cfg, 0, np.arange(2, tokens.shape[0]))
    embed, head = (w.float() for w in target.embedding_weights())
    loss, _ = draft_loss(
        loaded,
        embed,
        head[loaded.subset],
        tokens[ids],
        torch.from_numpy(features[ids].astype(np.float32)),
        0.0,
        1.0,
        0.1,
        None,
        3,
        torch.from_numpy(fused[ids].astype(np.float32)),
    )
    assert training["history"][0]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    curve = json.loads((second / "scaling.json").read_text())
    tokens_seen = [p["tokens"] for p in curve["points"]]
    assert (
        curve["points"][: len(json.loads((first / "scaling.json").read_text())["points"])]
        == json.loads((first / "scaling.json").read_text())["points"]
    )
    assert tokens_seen == sorted(tokens_seen) and tokens_seen[-1] == training["tokens_total"]


def test_a_draft_of_another_shape_or_family_is_refused_as_init_in_one_line(tiny_distill):
    _, distill = tiny_distill
    first = distill("first", "train.epochs=1")
    with pytest.raises(InputError) as wrong_shape:
        distill("second", f"init={first}", "student.intermediate_size=32")
    assert "has shape" in str(wrong_shape.value) and "\n" not in str(wrong_shape.value)
    with pytest.raises(InputError) as wrong_family:
        distill("third", f"init={first}", "student.kind=feature", "student.fused_layers=null")
    assert "another draft family" in str(wrong_family.value) and "\n" not in str(wrong_family.value)


def test_a_draft_grows_deeper_from_a_shallower_init_and_starts_where_it_was(tiny_distill, tmp_path):
    """``student.extra_layers`` with ``init=`` a one-layer draft: the new layer starts as the identity,
    so the grown draft predicts exactly what its init did; training then moves it. A deeper init is
    refused for a shallower student, in one line."""
    from pacer_plugins.eagle.students import load_init

    model, distill = tiny_distill
    feature = ("student.kind=feature", "student.fused_layers=null")
    first = distill("first", "train.epochs=1", *feature)
    cfg = load_distill_config(None, ["student.kind=feature", "student.intermediate_size=64", "student.extra_layers=1"])
    target = adapter(model)
    subset = load_draft(first).subset
    grown = build_student(cfg, target, subset, target.embedding_weights()[1].float()).eval()
    start = load_init(str(first), grown)
    assert start["init"] == str(first) and len(grown.extra) == 1
    embed = target.embedding_weights()[0].float()
    tokens, feats, _ = batch(target, "feature", rows=1, length=9)
    with torch.no_grad():
        before = load_draft(first)(embed[tokens[0, 1:]], feats[0, :-1], torch.arange(8), KVCache())
        after = grown(embed[tokens[0, 1:]], feats[0, :-1], torch.arange(8), KVCache())
    assert torch.equal(before, after)
    deep = distill("deep", "train.epochs=1", *feature, f"init={first}", "student.extra_layers=1")
    manifest = json.loads((deep / "manifest.json").read_text())
    assert json.loads((deep / "config.json").read_text())["extra_layers"] == 1
    assert "fc + 2 decoder layers" in manifest["family"] and manifest["training"]["init"] == str(first)
    trained = load_draft(deep)
    assert trained.extra[0].o_proj.weight.abs().sum() > 0  # training moved the new layer off the identity
    engine = eagle_engine(model, deep)
    for prompt in ([1, 7, 9, 7, 9, 7], list(range(3, 30))):
        assert engine.generate(prompt, max_new_tokens=20).tokens == reference_greedy(model, prompt, 20)
    with pytest.raises(InputError) as shallower:
        distill("back", "train.epochs=1", *feature, f"init={deep}")
    assert "has 2 decoder layers" in str(shallower.value) and "student.extra_layers=1" in str(shallower.value)
    assert "\n" not in str(shallower.value)


def test_distill_warns_in_one_line_where_the_targets_dtype_is_slow_for_batches(tiny_distill, monkeypatch, capsys):
    import pacer_plugins.eagle.distill as distill_module

    asked = []
    monkeypatch.setattr(
        distill_module,
        "batched_dtype_hint",
        lambda dtype, device, option: asked.append(option) or "bfloat16 is slow here: set target.dtype=float32",
    )
    _, distill = tiny_distill
    distill("run", "train.epochs=1")
    assert asked == ["target.dtype"]
    assert "distill: warning: bfloat16 is slow here: set target.dtype=float32\n" in capsys.readouterr().err


def test_the_time_budget_stops_training_exports_and_the_same_command_continues(tiny_distill):
    _, distill = tiny_distill
    export = distill("run", "train.epochs=3", "train.max_seconds=0.001")
    training = json.loads((export / "manifest.json").read_text())["training"]
    assert training["steps"] == 1 and not training["finished"] and (export / "draft.safetensors").exists()
    export = distill("run", "train.epochs=3")
    training = json.loads((export / "manifest.json").read_text())["training"]
    assert training["finished"] and training["steps"] == training["total_steps"] > 1


def test_selfdistill_from_reads_the_corpus_from_that_shard_on_and_records_it(tmp_path):
    """``corpus.selfdistill_from`` / ``selfdistill_until``: a continuation trains on the shards its init
    has not seen."""
    from pacer_plugins.eagle.distill import selfdistill_stream
    from pacer_train.corpus.shards import CorpusStore

    store = CorpusStore(tmp_path / "corpus")
    store.set_header({"seed": 0}, {"path": "scripted", "digest": "f00d"}, {})
    for shard, answers in enumerate(([[7, 1, 2], [7, 3, 4]], [[7, 5, 6]])):
        records = [
            {
                "id": f"chat/{shard}-{i}",
                "family": "chat",
                "position": 2 * shard + i,
                "sha": f"{shard}{i}",
                "prompt_tokens": 1,
                "answer_tokens": 2,
                "finished": True,
            }
            for i in range(len(answers))
        ]
        store.append(records, answers, [], 2 * shard + len(answers), 64, {})

    class Target:
        digest = "f00d"

    everything, record = selfdistill_stream(tmp_path / "corpus", Target())
    assert everything == [7, 1, 2, 7, 3, 4, 7, 5, 6] and record["first_shard"] == 0 and len(record["shards"]) == 2
    newest, record = selfdistill_stream(tmp_path / "corpus", Target(), 1)
    assert newest == [7, 5, 6] and record["records"] == 1 and record["first_shard"] == 1
    assert [s["name"] for s in record["shards"]] == ["shard-00001"]
    with pytest.raises(InputError) as info:
        selfdistill_stream(tmp_path / "corpus", Target(), 2)
    assert "selfdistill_from=2" in str(info.value) and "shards 0..1" in str(info.value) and "\n" not in str(info.value)
    oldest, record = selfdistill_stream(tmp_path / "corpus", Target(), 0, 1)  # corpus.selfdistill_until=1
    assert oldest == [7, 1, 2, 7, 3, 4] and record["records"] == 2 and record["end_shard"] == 1
    assert [s["name"] for s in record["shards"]] == ["shard-00000"]
    for first, until in ((1, 1), (0, 3)):
        with pytest.raises(InputError) as info:
            selfdistill_stream(tmp_path / "corpus", Target(), first, until)
        assert f"selfdistill_until={until}" in str(info.value) and "\n" not in str(info.value)


def test_selfdistill_extra_adds_whole_corpus_folders_and_records_each(tmp_path):
    """``corpus.selfdistill_extra``: more corpus folders (e.g. one of open-ended chat only) join the
    training text beside ``corpus.selfdistill``; each is recorded, and M_B's trainer keeps its
    prompts apart from them as from the main corpus."""
    from pacer_plugins.eagle.distill import build_corpus
    from pacer_plugins.pacer_stop import train as trainer
    from pacer_train.corpus.shards import CorpusStore
    from pacer_train.corpus.sources import CorpusConfig

    def corpus(folder, answers, family):
        store = CorpusStore(folder)
        store.set_header({"seed": 0}, {"path": "scripted", "digest": "f00d"}, {})
        records = [
            {
                "id": f"{family}/{i}",
                "family": family,
                "position": i,
                "sha": f"{family}{i}",
                "prompt_tokens": 1,
                "answer_tokens": len(a) - 1,
                "finished": True,
            }
            for i, a in enumerate(answers)
        ]
        store.append(records, answers, [], len(answers), 64, {})
        return folder

    main = corpus(tmp_path / "main", [[7, 1, 2, 3], [7, 4, 5, 6]], "chat")
    extra = corpus(tmp_path / "open", [[8, 9, 10, 11], [8, 12, 13, 14]], "open_chat")

    class Target:
        digest, eos_token_ids = "f00d", frozenset({EOS})

    cfg = DistillConfig(
        corpus=CorpusConfig(
            stdlib_tokens=0,
            docs_tokens=0,
            chat_answers=0,
            seq_len=4,
            selfdistill=str(main),
            selfdistill_extra=[str(extra)],
        )
    )
    built = build_corpus(cfg, Target(), tokenizer=None)
    assert built["sources"]["selfdistill"] == 8 and built["sources"]["selfdistill_extra"] == 8
    assert sorted(map(tuple, built["tokens"].tolist())) == [(7, 1, 2, 3), (7, 4, 5, 6), (8, 9, 10, 11), (8, 12, 13, 14)]
    used = built["sources_used"]
    assert [r["path"] for r in used["selfdistill_extra"]] == [str(extra)]
    assert used["selfdistill_extra"][0]["records"] == 2
    assert [r["path"] for r in trainer.seen_sources(used)["selfdistill"]] == [str(main), str(extra)]
    assert trainer.selfdistill_folders(trainer.seen_sources(used)) == [main, extra]

    class Other:
        digest, eos_token_ids = "beef", frozenset({EOS})

    with pytest.raises(InputError) as info:
        build_corpus(
            DistillConfig(
                corpus=CorpusConfig(
                    stdlib_tokens=0, docs_tokens=0, chat_answers=0, seq_len=4, selfdistill_extra=[str(extra)]
                )
            ),
            Other(),
            tokenizer=None,
        )
    assert str(info.value).startswith("corpus.selfdistill_extra ") and "\n" not in str(info.value)


# -- the vocabulary ----------------------------------------------------------------------------------
def test_vocab_coverage_counts_the_corpus_and_the_targets_greedy_tokens():
    corpus = torch.tensor([[5, 5, 5, 6, 6, 7, 8, 9]])
    greedy = torch.tensor([[5, 6, 9, 10]])
    table = vocab_coverage(corpus, greedy, {EOS}, sizes=(2, 3))
    assert table["2"] == {"corpus_tokens": 3 / 8, "heldout_target_greedy": 1 / 4}  # subset {EOS, 5}
    assert table["3"] == {"corpus_tokens": 5 / 8, "heldout_target_greedy": 2 / 4}  # {EOS, 5, 6}


def test_distill_config_checks_the_new_options():
    from pacer_core import ConfigError

    for overrides, needle in (
        (["train.unroll=0"], "train.unroll must be >= 1"),
        (["student.fused_layers=[1, 2]"], "an eagle3 or dflash student fuses"),
        (["init=/nonexistent/draft"], "init '/nonexistent/draft' does not exist"),
        (["student.kind=token", "init=."], "token student"),
        (["student.kind=eagle3", "student.extra_layers=1"], "deepens a feature student"),
        (["student.extra_layers=-1"], "deepens a feature student"),
        (["corpus.selfdistill_extra=[/nonexistent/corpus]"], "holds no `pacer corpus` corpus"),
        (
            [
                "corpus.selfdistill=plugins/eagle/corpus",
                "corpus.selfdistill_extra=[plugins/eagle/corpus]",
            ],
            "names a corpus folder twice",
        ),
    ):
        with pytest.raises(ConfigError) as info:
            load_distill_config(None, overrides)
        assert needle in str(info.value) and "\n" not in str(info.value)


# -- the GPU script --------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_gpu_script_runs_end_to_end_with_its_smoke_settings(tmp_path):
    """scripts/gpu_distill.sh --smoke on the CPU with the embedded target: corpus shards, an eagle3
    draft with the training-time test, its curve, and the printed agreement."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        ["bash", "scripts/gpu_distill.sh", "--smoke", "--kind", "eagle3", "--minutes", "10", "--out", str(tmp_path)],
        cwd=root,
        env={**os.environ, "PACER_SKIP_BOOTSTRAP": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "held-out top-1 agreement with the target" in run.stdout
    manifest = json.loads((tmp_path / "draft" / "manifest.json").read_text())
    assert manifest["family"].startswith("eagle3") and manifest["recipe"]["train"]["unroll"] == 3
    assert manifest["corpus_sources"]["selfdistill"]["records"] > 0
    assert json.loads((tmp_path / "draft" / "scaling.json").read_text())["points"]
    # no corpus stage, and distill options after -- replace the script's: a deeper feature draft
    deep = tmp_path / "deep"
    run = subprocess.run(
        [
            "bash",
            "scripts/gpu_distill.sh",
            "--smoke",
            "--minutes",
            "5",
            "--corpus-share",
            "0",
            "--out",
            str(deep),
            "--",
            "student.kind=feature",
            "student.fused_layers=null",
            "student.extra_layers=1",
            "train.unroll=2",
        ],
        cwd=root,
        env={**os.environ, "PACER_SKIP_BOOTSTRAP": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((deep / "draft" / "manifest.json").read_text())
    assert "fc + 2 decoder layers" in manifest["family"] and manifest["recipe"]["train"]["unroll"] == 2
    assert not (deep / "corpus").exists() and "selfdistill" not in manifest["corpus_sources"]


@pytest.mark.parametrize("share", ["1", "-0.1", "lots"])
def test_the_gpu_script_refuses_a_bad_corpus_share_in_one_line(share):
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        ["bash", "scripts/gpu_distill.sh", "--smoke", "--corpus-share", share],
        cwd=root,
        env={**os.environ, "PACER_SKIP_BOOTSTRAP": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().startswith("gpu_distill.sh: --corpus-share must be") and len(run.stderr.splitlines()) == 1


def test_the_shipped_draft_can_be_continued():
    """init= the shipped draft: its weights, its subset, the tokens it has seen and its scaling curve
    carry over; a student of another width is refused in one line."""
    from pacer_plugins.eagle.drafter import DEFAULT_DRAFT
    from pacer_plugins.eagle.model import ArchConfig
    from pacer_plugins.eagle.students import load_init

    config = json.loads((DEFAULT_DRAFT / "config.json").read_text())
    config.pop("family")
    net = FeatureDraft(ArchConfig(**config))
    start = load_init(str(DEFAULT_DRAFT), net)
    shipped = load_draft(DEFAULT_DRAFT)
    manifest = json.loads((DEFAULT_DRAFT / "manifest.json").read_text())
    training = manifest["training"]
    assert start["tokens_before"] == training.get("tokens_total", training["tokens_seen"]) > 1_000_000
    curve = DEFAULT_DRAFT / "scaling.json"
    assert start["points"] == (json.loads(curve.read_text())["points"] if curve.is_file() else [])
    assert start["corpus_sources"] == manifest["corpus_sources"]
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), shipped.state_dict().values()))
    # grown one layer deeper, it predicts what the shipped draft does
    deeper = FeatureDraft(ArchConfig(**{**config, "extra_layers": 1})).eval()
    load_init(str(DEFAULT_DRAFT), deeper)
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(6, config["hidden_size"], generator=g)
    feats = torch.randn(6, config["hidden_size"], generator=g)
    with torch.no_grad():
        assert torch.equal(
            deeper(embeds, feats, torch.arange(6), KVCache()), shipped(embeds, feats, torch.arange(6), KVCache())
        )
    config["intermediate_size"] = 1024
    with pytest.raises(InputError) as info:
        load_init(str(DEFAULT_DRAFT), FeatureDraft(ArchConfig(**config)))
    assert "gate_proj.weight" in str(info.value) and "\n" not in str(info.value)


def test_the_draft_fit_script_refuses_a_run_without_features_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "scripts/draft_fit.py", str(tmp_path), "shipped"],
        cwd=root,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "corpus.pt' is missing" in run.stderr and len(run.stderr.splitlines()) == 1


def test_distill_dflash_end_to_end_the_dflash_drafter_keeps_greedy_output(tiny_distill, tmp_path):
    """``student.kind=dflash`` through the same command: the plugin's student (found through the
    pacer_sd.students entry points) trains on the layers distill extracted, and the draft it exports
    is served by the dflash drafter, greedy output the target's own."""
    model, distill = tiny_distill
    export = distill(
        "run", "student.kind=dflash", "student.block=3", "train.anchors=4", "train.epochs=2", "train.unroll=1"
    )
    assert export.name == "dflash-draft"
    manifest = json.loads((export / "manifest.json").read_text())
    assert json.loads((export / "config.json").read_text())["target_layers"] == LAYERS
    assert manifest["family"].startswith("dflash") and manifest["training"]["finished"]
    assert len(manifest["heldout"]["heldout_position_agreement"]) == 3
    assert (tmp_path / "run" / "checkpoint-dflash.pt").is_file()
    engine = block_engine(model, export)
    for prompt in ([1, 7, 9, 7, 9, 7], list(range(3, 30))):
        assert engine.generate(prompt, max_new_tokens=24).tokens == reference_greedy(model, prompt, 24)

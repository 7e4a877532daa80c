"""The ``pard`` parallel token drafter (plugins/block_draft/pard.py): its packed training forward against
the drafter's own forward, greedy equivalence for chains and trees under every stop kind, the exact
output distribution under sampling (with deliberately wrong variants the test rejects), the student of
``pacer distill student.kind=pard``, and its refusals."""

from __future__ import annotations

import attrs
import pytest
import torch

from pacer_core import SamplingParams
from pacer_core.block_trees import BlockTree
from pacer_core.config import load_config
from pacer_core.engine import Engine
from pacer_core.errors import InputError
from pacer_core.testing import chisquare_pvalue, exact_continuation_probs
from pacer_plugins.block_draft.pard import PardDrafter
from pacer_plugins.block_draft.pard_files import save_pard_files
from pacer_plugins.block_draft.pard_student import PardStudent, evaluate_pard, pard_hidden, pard_layout, pard_loss

from helpers import (
    LENGTH,
    PASS_P,
    adapter,
    misreport_block_rows,
    one_line_error,
    reference_greedy,
    sample_outputs,
    single_thread,
    tiny_llama,
)

PROMPTS = [[3, 7, 11, 5], [1, 2, 3], [5], [9, 9, 9, 9, 9, 9]]
BUDGET = 24
BLOCK = 3


def make_pard_draft(
    folder, vocab: int = 16, seed: int = 1, subset=None, block: int = BLOCK, peak: float = 3.0, eos: bool = True
):
    """A random tiny PARD draft (a 2-layer Llama of ``vocab`` tokens, peaky by ``peak``, its head over
    ``subset`` when given) and its pard files in ``folder``: (the transformers model, its adapter)."""
    lm = tiny_llama(seed, vocab=vocab, scale=peak)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    save_pard_files(folder, torch.randn(lm.config.hidden_size), block)
    draft = adapter(lm, eos=eos)
    draft.folder = folder
    if subset is not None:
        draft.use_vocab_subset(subset)
    return lm, draft


def pard_engine(target_model, draft, stop="{name: fixed, gamma: 3}", tree=None, extra=(), eos=True, lookup_bias="null"):
    drafter = f"{{name: pard, lookup_bias: {lookup_bias}" + (f", tree: {tree}" if tree else "") + "}"
    cfg = load_config(
        overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", *extra], require_models=False
    )
    draft.reset()
    return Engine.build(adapter(target_model, eos=eos), draft=draft, cfg=cfg)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A peaky tiny target (vocabulary 16) and a random pard draft of block 3 over tokens 0..7."""
    target = tiny_llama(0, vocab=16, scale=3.0)
    lm, draft = make_pard_draft(tmp_path_factory.mktemp("pard") / "draft", subset=range(8))
    return target, lm, draft


# -- the packed training forward -----------------------------------------------------------------
def test_pard_layout_on_a_worked_example():
    layout = pard_layout([2], 3, 5)
    assert layout.positions.tolist() == [0, 1, 2, 3, 4, 3, 4]
    assert layout.block_rows.tolist() == [[2, 5, 6]] and layout.predicts.tolist() == [[3, 4, 5]]
    seen = layout.mask.int().tolist()
    assert seen[5] == [1, 1, 1, 0, 0, 1, 0] and seen[6] == [1, 1, 1, 0, 0, 1, 1]
    assert seen[3] == [1, 1, 1, 1, 0, 0, 0]  # real rows are causal and never see a mask row


@pytest.mark.parametrize("known", [0, 2])
def test_the_packed_training_forward_computes_what_the_drafter_computes(pair, known):
    """Every anchor's rows of one packed forward (several anchors, one mask) equal the drafter's own
    forward after the same tokens (its KV cache, the mask rows fed the mask embedding): what is
    trained is what is served. ``known``: the drafter's further block, the last tokens as drafted."""
    target, lm, draft = pair
    engine = pard_engine(target, draft)
    drafter = next(p for p in engine.pm.get_plugins() if isinstance(p, PardDrafter))
    student = PardStudent(lm, drafter.mask.float(), torch.arange(8), BLOCK).eval()
    tokens = [3, 7, 11, 5, 2, 9, 4, 1, 6, 8, 12, 3]
    anchors = [2, 5, 8]
    layout = pard_layout(anchors, BLOCK, len(tokens))
    with torch.no_grad():
        packed = pard_hidden(student, torch.tensor([tokens]), layout)[0, layout.block_rows]  # [K, block, d]
    drafter.pacer_start(None)
    for k, a in enumerate(anchors):
        context = tokens[: a + 1]
        logits, hidden = drafter._forward(context[: len(context) - known], context[len(context) - known :])
        torch.testing.assert_close(packed[k], hidden, rtol=1e-4, atol=1e-5)
        assert logits.shape == (BLOCK, 8) and bool(torch.isfinite(logits).all())
        assert list(draft.cached_tokens) == context  # the mask rows are cropped: the context alone stays


def test_the_pard_loss_falls_and_is_measured_per_position():
    target = tiny_llama(0, vocab=16, scale=15.0)  # peaky: the loss's floor (the target's entropy) is low
    student = PardStudent(tiny_llama(1, vocab=16, scale=3.0).train(), torch.zeros(32), torch.arange(16), BLOCK)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 16, (2, 12), generator=generator)
    with torch.no_grad():
        feats = target.model(input_ids=tokens).last_hidden_state
    head = target.lm_head.weight.detach()
    layout = pard_layout([0, 4, 7], BLOCK, 12)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss, parts = pard_loss(student, head, tokens, feats, layout, decay=0.8)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.85 * losses[0] and 0.0 <= parts["top1"] <= 1.0
    assert student.mask_embedding.abs().sum() > 0  # the mask embedding is trained
    metrics = evaluate_pard(student, head, tokens, (feats @ head.T).argmax(-1), stride=2)
    assert len(metrics["heldout_position_agreement"]) == BLOCK and 0 <= metrics["heldout_block_accepted"] <= BLOCK


# -- greedy: the target's own tokens ---------------------------------------------------------------
STOPS = {
    "fixed1": "{name: fixed, gamma: 1}",
    "fixed4": "{name: fixed, gamma: 4}",
    "confidence": "{name: confidence, threshold: 0.3}",
    "pacer": "{name: pacer, b: 3, max_draft: 8}",
}
TREES = {
    "chain": None,
    "tree6": "{topk: 3, depth: 3, nodes: 6}",
    "deep": "{topk: 3, depth: 6, nodes: 10}",  # two blocks: the further one on the main path
    "auto_cpu": "{topk: 3, depth: 3, nodes: auto, profile: cpu-2core-smollm2-fp32}",
}
FAST = {("fixed4", "chain"), ("confidence", "tree6"), ("pacer", "auto_cpu"), ("fixed1", "deep")}


GRID = [
    pytest.param(stop, tree, id=f"{stop}-{tree}", marks=() if (stop, tree) in FAST else pytest.mark.slow)
    for stop in STOPS
    for tree in TREES
]


@pytest.mark.parametrize("stop, tree", GRID)
def test_greedy_pard_drafting_equals_plain_decoding(pair, tmp_path, stop, tree):
    target, _, draft = pair
    stop_spec = STOPS[stop]
    if stop == "pacer":
        from helpers import write_checkpoint

        checkpoint = write_checkpoint(tmp_path / "mb", draft.hidden_size)
        stop_spec = stop_spec.replace("}", f", checkpoint: '{checkpoint}', allow_other_pair: true}}")
    engine = pard_engine(target, draft, stop=stop_spec, tree=TREES[tree], extra=["sampling.temperature=0"])
    accepted = 0
    for prompt in PROMPTS:  # one engine, several prompts: no state leaks from one to the next
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == reference_greedy(target, prompt, BUDGET), prompt
        accepted += result.metrics["accepted"]
        for drafted, forwards in zip(result.metrics["drafted_per_step"], result.metrics["draft_forwards_per_step"]):
            blocks = -(-6 // BLOCK) if tree == "deep" else 1  # a tree six deep: a forward a block of it
            assert forwards <= (blocks if TREES[tree] else -(-drafted // BLOCK) + 1)  # one forward a block
    assert accepted > 0


# -- sampling: exactly the target's distribution -------------------------------------------------
# every token once, then the first again: every token has a successor in the text, so the lookup prior
# raises one token of every drafted row
SAMPLE_PROMPT = [5, 9, 1, 14, 3, 12, 7, 0, 10, 6, 15, 2, 8, 13, 4, 11, 5]
SAMPLES = 500


@pytest.fixture(scope="module")
def sampling_pair(tmp_path_factory):
    """A peaky target (scale 15: few likely continuations) and a peaky random pard draft over its whole
    vocabulary, so drafted tokens are accepted and rejected alike."""
    target = tiny_llama(0, vocab=16, scale=15.0)
    lm, draft = make_pard_draft(tmp_path_factory.mktemp("pard-s") / "draft", peak=15.0, eos=False)
    return target, draft


def sampled_pvalue(target_model, draft, tree, monkeypatch=None, wrong=None, lookup_bias="null"):
    """The chi-square p-value of SAMPLES sampled generations (T = 1, speculative sampling), with the
    drafter's ``lookup_bias`` (null: the default prior); ``wrong``: the drafter reports another
    distribution than each token was drawn from (``misreport_block_rows``)."""
    if wrong:
        misreport_block_rows(monkeypatch, PardDrafter, wrong)
    engine = pard_engine(
        target_model,
        draft,
        tree=tree,
        eos=False,
        lookup_bias=lookup_bias,
        extra=[
            "sampling.temperature=1.0",
            "strategy.verifier={name: speculative_sampling}",
            "generation.ignore_eos=true",
        ],
    )
    with single_thread():
        outputs, _ = sample_outputs(engine, SAMPLE_PROMPT, SAMPLES)
    expected = exact_continuation_probs(
        adapter(target_model, eos=False), SAMPLE_PROMPT, LENGTH, SamplingParams(temperature=1.0)
    )
    return chisquare_pvalue(outputs, expected)


@pytest.mark.slow  # 500 sampled generations
@pytest.mark.parametrize("lookup_bias", ["null", "[6.0]", "[]"], ids=["prior", "strong-prior", "no-prior"])
@pytest.mark.parametrize("tree", [None, "{topk: 3, depth: 3, nodes: 6}"], ids=["chain", "tree"])
def test_sampled_pard_drafting_matches_the_target_distribution(sampling_pair, tree, lookup_bias):
    assert sampled_pvalue(*sampling_pair, tree, lookup_bias=lookup_bias) > PASS_P


@pytest.mark.slow  # 500 sampled generations
@pytest.mark.parametrize("wrong", ["columns", "prior"])
def test_rows_misreported_fail_the_distribution_test(sampling_pair, monkeypatch, wrong):
    # a strong one-token prior: the reported rows then differ from the drawn ones at every row
    assert sampled_pvalue(*sampling_pair, None, monkeypatch, wrong=wrong, lookup_bias="[6.0]") < 1e-6


@pytest.mark.slow  # 500 sampled generations
def test_tree_children_claimed_as_sampled_fail_the_distribution_test(sampling_pair, monkeypatch):
    levels = BlockTree.next_levels
    monkeypatch.setattr(
        BlockTree,
        "next_levels",
        lambda *a, **k: (lambda block: block and attrs.evolve(block, sampled=True))(levels(*a, **k)),
    )
    assert sampled_pvalue(*sampling_pair, "{topk: 3, depth: 3, nodes: 6}", lookup_bias="[]") < 1e-6


# -- refusals ------------------------------------------------------------------------------------
def test_a_draft_without_pard_files_is_refused_in_one_line(pair, tmp_path):
    target, lm, _ = pair
    plain = adapter(lm)
    for folder in (None, tmp_path):
        plain.folder = folder
        with pytest.raises(InputError) as info:
            pard_engine(target, plain)
        assert "\n" not in str(info.value) and "pard draft" in str(info.value)


@pytest.mark.parametrize(
    "config, weights, needle",
    [
        ('{"family": "pard", "block": 1}', None, "block: a whole number in 2..32"),
        ('{"family": "dflash", "block": 4}', None, "is not a pard config"),
        ('{"family": "pard", "block": "4"}', None, "is not a pard config"),
        (None, {"mask_embedding": torch.zeros(7)}, "hidden size 32"),
        (None, {"mask_embedding": torch.full((32,), float("nan"))}, "no finite mask_embedding"),
        (None, {"other": torch.zeros(32)}, "no finite mask_embedding"),
    ],
)
def test_damaged_pard_files_are_refused_in_one_line(pair, tmp_path, config, weights, needle):
    from safetensors.torch import save_file

    target, lm, _ = pair
    _, draft = make_pard_draft(tmp_path / "draft")
    if config is not None:
        (tmp_path / "draft" / "pard.json").write_text(config)
    if weights is not None:
        save_file(weights, str(tmp_path / "draft" / "pard.safetensors"))
    with pytest.raises(InputError) as info:
        pard_engine(target, draft)
    assert "\n" not in str(info.value) and needle in str(info.value)


def test_a_draft_of_another_vocabulary_is_refused(pair, tmp_path):
    target, _, _ = pair
    _, draft = make_pard_draft(tmp_path / "draft", vocab=24)
    with pytest.raises(InputError, match="sharing the target's tokenizer"):
        pard_engine(target, draft)


@pytest.mark.parametrize(
    "options, needle",
    [
        (["student.fused_layers=[1]"], "student.fused_layers"),
        (["init=/nonexistent/pard-init"], "is not a folder"),
        (["student.block=1"], "student.block"),
    ],
)
def test_distill_refuses_a_pard_option_in_one_line_before_any_model_loads(
    capsys, tmp_path, monkeypatch, options, needle
):
    import pacer_core.hf as hf

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(hf, "load_section", no_model)
    monkeypatch.setattr(hf, "load_model", no_model)
    message = one_line_error(capsys, ["distill", f"out={tmp_path / 'run'}", "student.kind=pard", *options])
    assert needle in message


# -- the export vLLM serves (a PARD checkpoint) -------------------------------------------------
def pard_drafter(engine) -> PardDrafter:
    return next(p for p in engine.pm.get_plugins() if isinstance(p, PardDrafter))


def saved_pard_draft(folder, subset=range(8)):
    """A tiny pard draft saved as ``pacer distill`` saves one: the causal LM's folder, its pard files
    and its vocabulary subset. Returns (the transformers model, its mask embedding)."""
    import json

    from safetensors.torch import load_file

    lm, _ = make_pard_draft(folder)
    lm.save_pretrained(folder)
    (folder / "pacer-vocab-subset.json").write_text(json.dumps(list(subset)))
    (folder / "manifest.json").write_text(json.dumps({"family": "pard"}))
    return lm, load_file(str(folder / "pard.safetensors"))["mask_embedding"].float()


def test_the_export_writes_the_mask_embedding_into_the_pard_tokens_row(tmp_path):
    """`pacer export` of a pard draft: a Llama checkpoint whose ``pard_token`` (the highest id outside
    the draft's subset) has the learned mask embedding as its input embedding, the output layer
    untied and unchanged, ``pard.json`` with the trained block."""
    import json

    from safetensors.torch import load_file

    from pacer_core.cli import main

    lm, mask = saved_pard_draft(tmp_path / "draft")
    assert main(["export", str(tmp_path / "draft"), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["pard_token"] == 15 and config["tie_word_embeddings"] is False
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    embed = lm.model.embed_tokens.weight.detach()
    assert torch.equal(tensors["model.embed_tokens.weight"][15], mask.half().float())
    assert torch.equal(tensors["model.embed_tokens.weight"][:15], embed[:15])
    assert torch.equal(tensors["lm_head.weight"], lm.lm_head.weight.detach())
    assert json.loads((tmp_path / "out" / "pard.json").read_text()) == {"family": "pard", "block": BLOCK}


def test_the_export_states_rope_theta_at_the_top_level(tmp_path):
    """transformers 5 writes θ inside ``rope_parameters`` only; the export states it at the top level too,
    where transformers 4 and SGLang's ``llama.py`` (``getattr(config, "rope_theta", 10000)``) read it, and
    transformers 5 reads the same θ back from the export."""
    import json

    from transformers import AutoConfig

    from pacer_core.cli import main

    saved_pard_draft(tmp_path / "draft")
    path = tmp_path / "draft" / "config.json"
    draft_config = json.loads(path.read_text())
    assert "rope_theta" not in draft_config
    draft_config["rope_parameters"]["rope_theta"] = 50000.0
    path.write_text(json.dumps(draft_config))
    assert main(["export", str(tmp_path / "draft"), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rope_theta"] == 50000.0 and config["rope_parameters"]["rope_theta"] == 50000.0
    assert AutoConfig.from_pretrained(tmp_path / "out").rope_parameters["rope_theta"] == 50000.0


def test_the_pard_drafter_runs_an_export_as_vllm_reads_it(pair, tmp_path):
    """Our drafter reads a PARD checkpoint by its ``pard_token``: the mask rows take that token's
    input embedding, the block comes from ``pard.json`` (else the ``block`` option, refused in one line
    when absent); greedy drafting stays equal to plain decoding, and the rows equal the original draft's."""
    from transformers import AutoModelForCausalLM

    from pacer_core.cli import main

    target, _, _ = pair
    lm, mask = saved_pard_draft(tmp_path / "draft")
    assert main(["export", str(tmp_path / "draft"), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    exported = adapter(AutoModelForCausalLM.from_pretrained(tmp_path / "out"))
    exported.folder = tmp_path / "out"
    engine = pard_engine(target, exported, lookup_bias="[]")
    drafter = pard_drafter(engine)
    assert torch.equal(drafter.mask.float(), mask.half().float()) and drafter.block == BLOCK
    original = adapter(lm)
    original.folder = tmp_path / "draft"
    rows = [d._forward([3, 7, 11, 5], [])[0] for d in (drafter, pard_drafter(pard_engine(target, original)))]
    torch.testing.assert_close(rows[0], rows[1], rtol=1e-3, atol=1e-3)  # the mask rounded to float16
    for prompt in PROMPTS:
        assert engine.generate(prompt, max_new_tokens=BUDGET).tokens == reference_greedy(target, prompt, BUDGET)
    (tmp_path / "out" / "pard.json").unlink()
    with pytest.raises(InputError, match="set strategy.drafter.block") as info:
        pard_engine(target, exported)
    assert "\n" not in str(info.value)
    assert pard_drafter(pard_engine(target, exported, extra=["strategy.drafter.block=2"])).block == 2


def test_the_serving_check_counts_a_pard_stack_from_the_first_token_as_vllm_drafts(pair, tmp_path, monkeypatch):
    """Our step 0 verifies a pard draft along with the prefill; vLLM drafts first after its prefill.
    The serving check's counts of a stack that drafted in step 0 come from the prompt and its first
    token (what vLLM's first draft reads), not from the step-0 draft."""
    import pacer_core.engine
    from pacer_bench.servecheck import accepted_by_position, ours

    target, lm, draft = pair
    monkeypatch.setattr(pacer_core.engine, "load_stack_draft", lambda plan, tokenizer: draft)
    stack = ["strategy.drafter={name: pard, lookup_bias: []}", f"strategy.stop=[{{name: fixed, gamma: {BLOCK}}}]"]
    counted = ours(adapter(target), None, PROMPTS, {"pard": stack}, 12, 1, BLOCK)["pard"]
    engine = pard_engine(target, draft, lookup_bias="[]")
    naive, shifted = [0, [0] * BLOCK], [0, [0] * BLOCK]
    for prompt, out in zip(PROMPTS, counted["tokens"]):
        for total, ids, tokens in ((naive, prompt, 12), (shifted, prompt + out[:1], 11)):
            m = engine.generate(ids, max_new_tokens=tokens + BLOCK).metrics
            assert total is shifted or m["drafted_per_step"][0] > 0  # step 0 drafts with the prefill
            d, p = accepted_by_position(
                m["drafted_per_step"], m["accepted_per_step"], m["accept_lengths"], BLOCK, tokens
            )
            total[0] += d
            total[1] = [a + b for a, b in zip(total[1], p)]
    assert [counted["spec"]["drafts"], counted["spec"]["accepted_tokens_per_pos"]] == shifted != naive

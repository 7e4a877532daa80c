"""transformers' baselines traced (``pacer_core.hf.baselines``): steps and drafts counted, with an
identical assistant."""

from __future__ import annotations

from pacer_core.hf import hf_generate_traced

from helpers import adapter, reference_greedy, tiny_llama


# -- transformers' baselines traced ------------------------------------------------------------
def test_hf_trace_counts_steps_and_drafts_with_an_identical_assistant():
    target, assistant = adapter(tiny_llama(0)), adapter(tiny_llama(0))
    prompt = [1, 5, 6, 7, 8, 5, 6, 7]
    before = assistant.model.generation_config.num_assistant_tokens
    settings = {
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    tokens, trace, after = hf_generate_traced(
        target, prompt, 12, ignore_eos=True, assistant=assistant, assistant_settings=settings
    )
    assert tokens == reference_greedy(target.model, prompt, 12, eos=False)
    assert trace["accept_lengths"] == [4, 4, 4]  # 3 accepted + the bonus, every step
    assert trace["drafted_per_step"] == [3, 3, 3]
    assert trace["target_forwards"] == 3 and trace["draft_forwards"] >= 9
    assert assistant.model.generation_config.num_assistant_tokens == before  # restored after the call
    _, trace, after = hf_generate_traced(
        target,
        prompt,
        12,
        ignore_eos=True,
        assistant=assistant,
        assistant_settings={**settings, "num_assistant_tokens_schedule": "heuristic"},
    )
    assert after["num_assistant_tokens"] > 3  # all accepted: transformers' schedule grew γ; carried over

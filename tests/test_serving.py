"""Drafting for a serving engine that verifies itself (pacer_core/serving.py, docs/serving.md).

The serving engine is played here by a loop that does what vLLM does around a custom proposer: it
prefills each prompt (one token), then, step after step, hands the proposer every request of the
batch (its tokens, the tokens committed since the last call), takes the drafts, verifies them
greedily against the target and commits the accepted tokens and its own. No vLLM is needed; the
serving check runs the same stacks inside vLLM (docs/eagle-checkpoints.md#serving-check).
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import numpy as np
import pytest

from pacer_core import Component, InputError, Stop, hookimpl
from pacer_core.config import load_config
from pacer_core.hf import HFModel, weights_digest
from pacer_core.hf.adapter import cache_keyword
from pacer_core.serving import ServedTarget, ServingDrafter, VllmProposer, own_cache, stack_options, vllm_rows
from pacer_core.testing import ScriptedLM

from helpers import DRAFT_TABLE, SCRIPTED_VOCAB, TARGET_TABLE, plain_greedy, tiny_llama, write_checkpoint

PROMPTS = [[0, 1, 2, 3, 0, 1], [4, 5, 6, 7, 4], [2, 2, 3, 1]]
BUDGET = 24
K = 4  # the engine's num_speculative_tokens


def models():
    return ScriptedLM(SCRIPTED_VOCAB, table=TARGET_TABLE), ScriptedLM(SCRIPTED_VOCAB, table=DRAFT_TABLE)


def drafter_for(
    stop: str, draft, k: int = K, plugins=(), drafter: str = "{name: draft_model}", sampling: float = 0.0
) -> ServingDrafter:
    cfg = load_config(
        overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", f"sampling.temperature={sampling}"],
        extra_plugins=plugins,
        require_models=False,
    )
    target = ServedTarget(vocab_size=SCRIPTED_VOCAB, hidden_size=16, max_length=1024, eos_token_ids=(), digest=None)
    return ServingDrafter(cfg, target, draft, max_draft_tokens=k, extra_plugins=plugins)


def greedy_next(target, tokens: list[int]) -> int:
    return int(target.next_logits(tokens).argmax())


def serve(drafter: ServingDrafter, target, prompts, budget: int = BUDGET, on_call=None):
    """The serving engine's loop: outputs per prompt, per call the drafts it was handed by request and
    how many of each it accepted (each call hands the batch in another order, as vLLM's batch is
    reordered when requests come and go)."""
    tokens = [list(p) + [greedy_next(target, p)] for p in prompts]  # the prefill's token
    new = [[t[-1]] for t in tokens]
    calls, accepted_per_call = [], []
    while min(len(t) - len(p) for t, p in zip(tokens, prompts)) < budget:
        order = list(range(len(prompts)))
        order = order[len(calls) % len(order) :] + order[: len(calls) % len(order)]
        drafts = drafter.propose([(list(tokens[i]), new[i]) for i in order])
        by_request = dict(zip(order, drafts))
        calls.append(by_request)
        if on_call is not None:
            on_call(tokens, by_request)
        accepted_per_call.append({})
        for i, draft in by_request.items():
            assert len(draft) <= K
            accepted = 0
            while accepted < len(draft) and draft[accepted] == greedy_next(target, tokens[i] + draft[:accepted]):
                accepted += 1
            new[i] = draft[:accepted] + [greedy_next(target, tokens[i] + draft[:accepted])]
            tokens[i] += new[i]
            accepted_per_call[-1][i] = accepted
    return [t[len(p) :][:budget] for t, p in zip(tokens, prompts)], calls, accepted_per_call


def stack_of(drafter: ServingDrafter, tokens: list[int]):
    (request,) = drafter.requests[tuple(tokens)]
    return request


# -- per-request state -------------------------------------------------------------------------
def test_each_request_keeps_its_own_draft_cache_rolled_back_after_a_rejection():
    target, draft = models()
    drafter = drafter_for("{name: fixed, gamma: 3}", draft)
    caches = {}

    def check_caches(tokens, drafts):
        for i, sent in drafts.items():
            model = stack_of(drafter, tokens[i]).engine.draft
            cached = list(model.cached_tokens)
            assert cached == (tokens[i] + sent)[: len(cached)]  # no rejected token left behind
            assert len(cached) >= len(tokens[i]) - 1  # the request's own context, not another's
            caches.setdefault(i, model)
            assert caches[i] is model  # the same stack every call, wherever the request sits in the batch

    outputs, calls, _ = serve(drafter, target, PROMPTS, on_call=check_caches)
    assert outputs == [plain_greedy(target, p, BUDGET) for p in PROMPTS]
    assert len({id(m) for m in caches.values()} | {id(draft)}) == len(PROMPTS) + 1
    assert list(draft.cached_tokens) == []  # the loaded draft model only lends its weights
    rejected = sum(n for (drafted, accepted), n in drafter.outcomes.items() if accepted < drafted)
    assert rejected > 0 and all(drafted == 3 for drafted, _ in drafter.outcomes)
    assert drafter.calls == len(calls)


def test_a_finished_request_is_dropped_and_an_unknown_step_starts_afresh():
    target, draft = models()
    drafter = drafter_for("{name: fixed, gamma: 2}", draft)
    a, b = [0, 1, 2], [4, 5, 6]
    first = drafter.propose([(a, a[-1:]), (b, b[-1:])])
    assert [len(d) for d in first] == [2, 2] and len(drafter.requests) == 2
    drafter.propose([(a + first[0][:1] + [7], first[0][:1] + [7])])  # b finished
    assert list(drafter.requests) == [tuple(a + first[0][:1] + [7])]
    # a step the stack did not draft for (the engine dropped the request and resumed it): a fresh stack
    old = next(iter(drafter.requests.values()))[0]
    lost = a + first[0][:1] + [7, 3, 3]
    assert len(drafter.propose([(lost, [3, 3])])[0]) == 2
    assert stack_of(drafter, lost) is not old and stack_of(drafter, lost).state.step_index == 1
    # a prompt still being prefilled in chunks: nothing to verify, nothing drafted, its stack kept
    assert drafter.propose([(lost, [])]) == [[]] and stack_of(drafter, lost).state.tokens == lost


def test_own_cache_shares_the_weights_not_the_cache():
    _, draft = models()
    twin = own_cache(draft)
    twin.forward([1, 2, 3])
    assert list(twin.cached_tokens) == [1, 2, 3] and list(draft.cached_tokens) == []
    assert twin.table is draft.table


# -- the stop decides each request's length ----------------------------------------------------
@attrs.define
class ByPromptConfig:
    pass


class ByPrompt:
    """A stop drafting 1 + (prompt length mod 3) tokens per step: each request its own length."""

    def __init__(self, config, resources):
        pass

    @hookimpl
    def pacer_draft_more(self, state, draft):
        wanted = 1 + state.prompt_length % 3
        return Stop() if len(draft) >= wanted else wanted - len(draft)


class ByPromptPlugin:
    @hookimpl
    def pacer_components(self):
        return [Component("stop", "by_prompt", ByPromptConfig, ByPrompt)]


@pytest.mark.parametrize("k", [4, 2])
def test_each_requests_draft_length_is_the_stops(k):
    """Fails when the stop is ignored: every request would get the engine's bound k."""
    target, draft = models()
    plugin = ByPromptPlugin()
    drafter = drafter_for("{name: by_prompt}", draft, k=k, plugins=[plugin])
    outputs, calls, _ = serve(drafter, target, PROMPTS)
    assert outputs == [plain_greedy(target, p, BUDGET) for p in PROMPTS]
    wanted = [min(k, 1 + len(p) % 3) for p in PROMPTS]  # prompts of 6, 5 and 4 tokens: 1, 3, 2
    for by_request in calls:
        assert {i: len(d) for i, d in by_request.items()} == dict(enumerate(wanted))


def test_the_stops_learn_from_the_engines_verdicts():
    """heuristic's schedule (+2 after a fully accepted draft, else -1) read off the engine's own
    verdicts: each request's next length follows from what the engine accepted of its last draft."""
    target, draft = models()
    drafter = drafter_for("{name: heuristic, gamma: 1, max_gamma: 64}", draft)
    _, calls, accepted = serve(drafter, target, PROMPTS, budget=40)
    for i in range(len(PROMPTS)):
        lengths = [len(by_request[i]) for by_request in calls]
        gamma = 1
        for step, length in enumerate(lengths):
            assert length == min(gamma, K)
            gamma = gamma + 2 if accepted[step][i] >= gamma else max(1, gamma - 1)
    assert len({len(d) for by_request in calls for d in by_request.values()}) > 1


STOPS = {
    "confidence": "{name: confidence, threshold: 0.5}",
    "pacer": "{name: pacer, b: 1, t0: 0.5, checkpoint: CHECKPOINT, allow_other_pair: true}",
    "pacer(throughput)": (
        "{name: pacer, b: 1, rule: throughput, checkpoint: CHECKPOINT, allow_other_pair: true, "
        "costs: {verify_s: [0.02, 0.021, 0.022, 0.023], draft_token_s: 0.004}}"
    ),
}


@pytest.mark.parametrize("name", sorted(STOPS))
def test_pacer_sd_stops_vary_the_length_and_keep_the_output(name, tmp_path):
    target, draft = models()
    checkpoint = write_checkpoint(tmp_path / "mb", input_size=draft.hidden_size)
    drafter = drafter_for(STOPS[name].replace("CHECKPOINT", str(checkpoint)), draft)
    outputs, calls, _ = serve(drafter, target, PROMPTS, budget=40)
    assert outputs == [plain_greedy(target, p, 40) for p in PROMPTS]
    lengths = {len(d) for by_request in calls for d in by_request.values()}
    assert len(lengths) > 1 and max(lengths) <= K  # the stop chose, per request and step


# -- refusals ----------------------------------------------------------------------------------
def test_a_stack_that_cannot_draft_for_a_serving_engine_is_refused():
    _, draft = models()
    with pytest.raises(InputError, match="drafts greedily .* set sampling.temperature: 0"):
        drafter_for("{name: fixed, gamma: 2}", draft, sampling=0.7)
    with pytest.raises(InputError, match="eagle reads the target's hidden states"):
        drafter_for("{name: fixed, gamma: 2}", None, drafter="{name: eagle}")
    with pytest.raises(InputError, match="draft length bound must be a positive int"):
        drafter_for("{name: fixed, gamma: 2}", draft, k=0)
    with pytest.raises(InputError, match="serving engine runs"):
        ServedTarget(vocab_size=8, hidden_size=4, max_length=16, eos_token_ids=()).forward([1])


# -- vLLM's side -------------------------------------------------------------------------------
def test_vllms_arguments_become_rows():
    table = np.zeros((4, 16), dtype=np.int32)
    table[0, :5] = [9, 8, 7, 6, 5]
    table[1, :3] = [1, 2, 3]
    rows = vllm_rows([[6, 5], []], np.array([5, 3, 0, 0]), table)
    assert rows == [([9, 8, 7, 6, 5], [6, 5]), ([1, 2, 3], [])]


def test_the_stack_options_come_from_additional_config():
    assert stack_options(None) == {"config": None, "overrides": [], "record": None}
    given = {"pacer_config": "configs/vllm.yaml", "pacer_overrides": ["strategy.stop=[]"], "pacer_record": "r.jsonl"}
    assert stack_options(given) == {
        "config": "configs/vllm.yaml",
        "overrides": ["strategy.stop=[]"],
        "record": "r.jsonl",
    }
    with pytest.raises(InputError, match="pacer_overrides must be a list of key=value strings"):
        stack_options({"pacer_overrides": "strategy.stop=[]"})


def test_the_vllm_proposer_refuses_a_target_that_is_not_a_folder(tmp_path):
    config = SimpleNamespace(
        additional_config={"pacer_overrides": ["strategy.drafter={name: prompt_lookup}"]},
        model_config=SimpleNamespace(model=str(tmp_path), max_model_len=64),
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
    )
    with pytest.raises(InputError, match="is not a model folder .* serve a local Hugging Face folder"):
        VllmProposer(config)


# -- the served target and the model adapter under vLLM's transformers -----------------------------
def test_a_served_target_reads_what_loading_the_model_would(tmp_path):
    tiny_llama(0).save_pretrained(tmp_path)
    loaded = HFModel.load(tmp_path)
    served = ServedTarget.from_folder(tmp_path, max_length=96)
    assert (served.vocab_size, served.hidden_size, served.eos_token_ids) == (
        loaded.vocab_size,
        loaded.hidden_size,
        loaded.eos_token_ids,
    )
    assert served.digest == weights_digest(tmp_path) and served.max_length == 96
    assert ServedTarget.from_folder(tmp_path).max_length == loaded.max_length


def test_the_adapter_hands_the_cache_by_the_name_the_forward_takes():
    """transformers renamed the forward's ``past_key_values`` to ``cache`` (vLLM 0.32 pins a version from
    before); an older forward swallows ``cache=`` in its ``**kwargs`` and would run without the cache."""

    class Old:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
            pass

    class New:
        def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
            pass

    assert cache_keyword(Old()) == "past_key_values" and cache_keyword(New()) == "cache"


@pytest.mark.slow
def test_the_shipped_stack_drafts_inside_a_serving_loop_on_the_real_models(real_model_threads):
    """configs/vllm.yaml through ``VllmProposer`` (the token draft, PACER's stop with its shipped M_B) on
    the embedded target's folder, as vLLM builds it; the serving loop verifies with the target itself."""
    from pacer_core.hf import load_model, materialize

    folder = materialize(None)
    target, tokenizer, _ = load_model(str(folder), "float32", "cpu", None, "target")
    config = SimpleNamespace(
        additional_config={"pacer_config": "configs/vllm.yaml"},
        model_config=SimpleNamespace(model=str(folder), max_model_len=2048),
        speculative_config=SimpleNamespace(num_speculative_tokens=8),
    )
    proposer = VllmProposer(config)
    prompt = tokenizer.encode("Write a Python function that returns the sum of a list.")

    def argmax_after(tokens, draft):  # the target's argmax after tokens, then after each draft prefix
        cached, keep = list(target.cached_tokens), 0
        while keep < min(len(cached), len(tokens) - 1) and cached[keep] == tokens[keep]:
            keep += 1
        target.crop(keep)  # the rows of rejected draft tokens go
        return target.forward((tokens + draft)[keep:], logits_from=len(tokens) - 1 - keep).logits.argmax(-1).tolist()

    plain = list(prompt)
    for _ in range(32):
        plain.append(argmax_after(plain, [])[-1])
    tokens = list(prompt) + [argmax_after(prompt, [])[-1]]
    new, lengths = tokens[-1:], []
    while len(tokens) - len(prompt) < 32:
        table = np.zeros((1, 2048), dtype=np.int64)
        table[0, : len(tokens)] = tokens
        (draft,) = proposer.propose([new], np.array([len(tokens)]), table)
        lengths.append(len(draft))
        best = argmax_after(tokens, draft)
        accepted = 0
        while accepted < len(draft) and draft[accepted] == best[accepted]:
            accepted += 1
        new = draft[:accepted] + [best[accepted]]
        tokens += new
    assert tokens[len(prompt) :][:32] == plain[len(prompt) :]
    assert 0 < max(lengths) <= 8 and any(accepted for _, accepted in proposer.drafter.outcomes)

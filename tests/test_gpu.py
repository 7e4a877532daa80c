"""The GPU path: host syncs per step, and the engine on the run's device (docs/gpu.md).

Marked ``gpu``: ``scripts/gpu_check.sh`` runs them (with a short bench) when a GPU is at hand. Without
one they run here on the CPU with the same code: ``OnDevice`` tensors stand for the GPU's, so every
read of a target output on the host is counted as the sync it would be, and mixing them with host
tensors fails as it would on CUDA. With CUDA the same engines run on the GPU, and PyTorch's sync
debug mode counts the real syncs.
"""

import pytest
import torch

from pacer_core import Engine, hookimpl, load_config
from pacer_core.hf import HFModel
from pacer_core.testing import DeviceLM, OnDevice, ScriptedLM, count_host_reads, count_host_syncs, on_device

from helpers import EOS, make_draft, tiny_llama

pytestmark = pytest.mark.gpu

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
PROMPT = [1, 2, 3, 4, 1, 2, 3, 1, 2]


def test_on_device_counts_host_reads_and_refuses_mixing():
    x = on_device(torch.arange(6.0).reshape(2, 3))
    assert not x.is_cpu and not (x * 2).is_cpu and x.device.type == "cpu"  # stands for a GPU's; data here
    with count_host_reads() as counted:
        y = (x * 2).softmax(-1)  # ops stay on the device: no read
        assert isinstance(y, OnDevice)
        assert x.argmax(-1).tolist() == [2, 2]
        assert int(x[1, 2]) == 5 and float(x.sum()) == 15.0
        host = x.cpu()
        assert type(host) is torch.Tensor and host.tolist() == [[0, 1, 2], [3, 4, 5]]  # already on the host
        assert x[torch.tensor([1])].shape == (1, 3)  # indexing with host indices is allowed, as on CUDA
    assert counted.reads == ["tolist", "__int__", "__float__", "cpu"]
    with pytest.raises(RuntimeError, match="device tensor mixed with a host tensor"):
        x + torch.ones(3)
    assert (x + torch.tensor(1.0)).tolist() == [[1, 2, 3], [4, 5, 6]]  # a 0-d host tensor is a scalar


STACKS = {
    "autoregressive": (["strategy.drafter={name: autoregressive}", "strategy.stop=[]"], False),
    "prompt_lookup": (["strategy.drafter={name: prompt_lookup}", "strategy.stop=[{name: fixed, gamma: 3}]"], False),
    "prompt_lookup tree": (["strategy.drafter={name: prompt_lookup, branches: 3}", "strategy.stop=[]"], False),
    "draft_model": (["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 3}]"], True),
    "draft_model entropy": (["strategy.drafter={name: draft_model}", "strategy.stop=[{name: entropy}]"], True),
    "draft_model tree": (
        ["strategy.drafter={name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}", "strategy.stop=[]"],
        True,
    ),
    "datastore": (["strategy.drafter={name: datastore}", "strategy.stop=[{name: fixed, gamma: 3}]"], False),
    "phrase_pool": (["strategy.drafter={name: phrase_pool}", "strategy.stop=[{name: fixed, gamma: 3}]"], False),
    "hybrid": (
        [
            "strategy.drafter={name: hybrid, members: [{name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}, "
            "{name: prompt_lookup}, {name: datastore}]}",
            "strategy.stop=[]",
        ],
        True,
    ),
}


class ReadsTargetArgmax:
    """An observer reading every step's target argmax on the host: one more sync per step."""

    @hookimpl
    def pacer_observe_step(self, state, step):
        self.last = step.target_argmax.tolist()


def scripted_engine(overrides, with_draft, temperature, plugins=()):
    target = DeviceLM(ScriptedLM(vocab_size=8, seed=0))
    draft = DeviceLM(ScriptedLM(vocab_size=8, seed=1)) if with_draft else None
    cfg = load_config(
        overrides=[*overrides, f"sampling.temperature={temperature}", "generation.ignore_eos=true"],
        require_models=False,
    )
    return Engine.build(target, draft=draft, cfg=cfg, extra_plugins=plugins)


@pytest.mark.parametrize("temperature", [0, 1])
@pytest.mark.parametrize("stack", STACKS)
def test_one_host_read_per_verification_and_per_draft_forward(stack, temperature):
    """The target's outputs are read on the host once per step (the verdict), a draft model's once
    per forward (its tokens): nothing else waits for the device."""
    overrides, with_draft = STACKS[stack]
    engine = scripted_engine(overrides, with_draft, temperature)
    with count_host_reads() as counted:
        result = engine.generate(PROMPT, max_new_tokens=16, seed=3)
    steps, draft_forwards = len(result.metrics["accept_lengths"]), result.metrics["draft_forwards"]
    # the phrase pool learns the target's phrases from its argmax after each step that drafted
    learning = sum(1 for d in result.metrics["drafted_per_step"] if d) if stack == "phrase_pool" else 0
    assert len(counted.reads) == steps + draft_forwards + learning, counted.reads


def test_an_extra_read_per_step_is_caught():
    """The deliberately wrong variant: an observer reading the target's argmax every step."""
    overrides, _ = STACKS["prompt_lookup"]
    observer = ReadsTargetArgmax()
    engine = scripted_engine(overrides, False, 0, plugins=[observer])
    with count_host_reads() as counted:
        result = engine.generate(PROMPT, max_new_tokens=16)
    assert len(counted.reads) == 2 * len(result.metrics["accept_lengths"])


def device_model(model, dtype=torch.float32):
    """A tiny Llama's adapter on the run's device; on the CPU its outputs play a GPU's (``DeviceLM``)."""
    hf = HFModel(model.to(DEVICE, dtype), eos_token_ids=[EOS])
    return hf if CUDA else DeviceLM(hf)


def reference(model, prompt, budget):
    """transformers' greedy ``generate`` on the same model and device: what the engine must equal."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        max_new_tokens=budget,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    return out[0, len(prompt) :].tolist()


def counted_generate(engine, prompt, budget):
    """(result, host syncs): real CUDA syncs on a GPU, host reads of device tensors on the CPU."""
    with count_host_syncs() as syncs, count_host_reads() as reads:
        result = engine.generate(prompt, max_new_tokens=budget)
    return result, (syncs.count if CUDA else len(reads.reads))


@pytest.mark.parametrize("drafter", ["autoregressive", "draft_model", "draft_model tree"])
def test_hf_models_on_the_device_decode_exactly_with_few_syncs(drafter):
    target_model = tiny_llama(0, scale=6.0)
    draft_model = tiny_llama(0, scale=6.0)
    with torch.no_grad():
        for param in draft_model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    target = device_model(target_model)
    draft = device_model(draft_model) if drafter != "autoregressive" else None
    overrides = {
        "autoregressive": ["strategy.drafter={name: autoregressive}", "strategy.stop=[]"],
        "draft_model": ["strategy.drafter={name: draft_model}", "strategy.stop=[{name: fixed, gamma: 3}]"],
        "draft_model tree": [
            "strategy.drafter={name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}",
            "strategy.stop=[]",
        ],
    }[drafter]
    engine = Engine.build(target, draft=draft, cfg=load_config(overrides=overrides, require_models=False))
    engine.generate(PROMPT, max_new_tokens=4)  # warm-up: first calls may allocate and sync
    result, syncs = counted_generate(engine, PROMPT, 24)
    assert result.tokens == reference(target_model, PROMPT, 24)
    steps, draft_forwards = len(result.metrics["accept_lengths"]), result.metrics["draft_forwards"]
    # the verdict and each draft forward's tokens; on CUDA transformers may add one of its own per forward
    bound = (steps + draft_forwards) * (2 if CUDA else 1)
    assert syncs <= bound, f"{syncs} host syncs for {steps} steps and {draft_forwards} draft forwards"


@pytest.mark.parametrize("tree", ["", ", tree: {topk: 3, depth: 3, nodes: 6}"], ids=["chain", "tree"])
def test_eagle_on_the_device_decodes_exactly(tmp_path, tree):
    """The feature draft lives on its target's device; greedy output equals the target's there,
    as a chain and as a tree (whose levels index the device's features with the chosen rows)."""
    target_model = tiny_llama(0, scale=6.0).to(DEVICE)
    folder = make_draft(target_model.cpu(), tmp_path / "draft")
    target = HFModel(target_model.to(DEVICE), eos_token_ids=[EOS])
    cfg = load_config(
        overrides=[
            f"strategy.drafter={{name: eagle, path: '{folder}'{tree}}}",
            "strategy.stop=[{name: fixed, gamma: 3}]",
        ],
        require_models=False,
    )
    engine = Engine.build(target, cfg=cfg)
    result = engine.generate(PROMPT, max_new_tokens=24)
    assert result.tokens == reference(target_model, PROMPT, 24)


@pytest.mark.skipif(not CUDA, reason="bfloat16 kernels differ by device: checked where the GPU is")
def test_bfloat16_on_the_gpu_equals_generate():
    target_model = tiny_llama(0, scale=6.0).to(DEVICE, torch.bfloat16)
    engine = Engine.build(
        HFModel(target_model, eos_token_ids=[EOS]),
        cfg=load_config(
            overrides=["strategy.drafter={name: autoregressive}", "strategy.stop=[]"], require_models=False
        ),
    )
    result, syncs = counted_generate(engine, PROMPT, 24)
    assert result.tokens == reference(target_model, PROMPT, 24)
    assert syncs <= 2 * len(result.tokens)

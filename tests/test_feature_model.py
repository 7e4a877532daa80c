"""The model capabilities plugins may use are the declared ones: ``LanguageModel`` (with ``digest``)
and ``FeatureModel`` (weights and layout), implemented by ``HFModel``; the plugins reach no further
into the adapter (no ``target.model``/``target.config``, no ``getattr`` probing of models)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from pacer_core import Engine, FeatureModel, InputError, LanguageModel, load_config
from pacer_core.protocols import AttentionShape
from pacer_core.testing import ScriptedLM

from helpers import adapter, tiny_llama

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def test_hf_model_is_a_feature_model_and_the_scripted_lm_only_a_language_model():
    model = adapter(tiny_llama(0, layers=3))
    assert isinstance(model, FeatureModel) and model.digest is None
    fake = ScriptedLM(8)
    assert not isinstance(fake, FeatureModel) and fake.digest is None
    for name in ("vocab_size", "hidden_size", "max_length", "eos_token_ids", "num_forwards", "digest"):
        assert name in LanguageModel.__annotations__ and hasattr(fake, name), name


def test_layout_and_shared_weights_come_from_the_model():
    raw = tiny_llama(0, layers=3)
    model = adapter(raw)
    assert model.num_layers == len(raw.model.layers) == 3
    assert model.attention_shape() == AttentionShape(
        num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_eps=1e-6
    )
    embed, head = model.embedding_weights()
    assert embed.data_ptr() == raw.model.embed_tokens.weight.data_ptr()  # shared, not copied
    assert head.data_ptr() == raw.lm_head.weight.data_ptr() and not head.requires_grad
    assert model.packed_weights is False


def test_the_distill_arch_reads_the_declared_attention_shape():
    from pacer_plugins.eagle.students import _attention_shape

    model = adapter(tiny_llama(0))
    assert _attention_shape(model) == attrs.asdict(model.attention_shape())
    assert _attention_shape(model) == {
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "rope_theta": 10000.0,
        "rms_eps": 1e-6,
    }


def test_eagle_refuses_a_target_that_does_not_show_its_weights(tmp_path):
    from helpers import make_draft

    folder = make_draft(tiny_llama(0), tmp_path / "draft")
    cfg = load_config(overrides=[f"strategy.drafter={{name: eagle, path: '{folder}'}}"], require_models=False)
    with pytest.raises(InputError, match="FeatureModel") as info:
        Engine.build(ScriptedLM(64, hidden_size=32), cfg=cfg)
    assert "\n" not in str(info.value)


# what plugins may not write about a model (the draft value object and the distill student, a
# transformers module the trainer owns, are not models of the engine)
REACHES = [
    r"\b(target|resources\.target|resources\.draft|self\.model)\.(model|config)\b",
    r"getattr\(\s*(target|resources\.target|resources\.draft|self\.model|model)\b",
    r"\.model\.base_model\b",
]


@pytest.mark.parametrize("path", sorted(PLUGINS.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_plugins_use_only_declared_model_capabilities(path):
    text = path.read_text()
    found = [m.group(0) for pattern in REACHES for m in re.finditer(pattern, text)]
    assert not found, f"{path}: reaches past the LanguageModel/FeatureModel protocols: {found}"


def test_the_reach_patterns_catch_the_old_forms():
    old = [
        "count = len(target.model.base_model.layers)",
        "config = target.config",
        'getattr(resources.target, "digest", None)',
        'getattr(model, "hidden_size", None)',
    ]
    for line in old:
        assert any(re.search(pattern, line) for pattern in REACHES), line

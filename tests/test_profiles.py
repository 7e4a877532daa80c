"""The shipped cost profiles (pacer_core/profiles/*.yaml) keep the format's rules and cite every number.

Read with ``yaml.safe_load`` and checked field by field (known fields, positive finite seconds,
curves non-decreasing in k, k = 1 in verify_s, a ``sources`` entry for every top-level number),
then loaded through ``pacer_core.cost_profiles.load_profile``. docs/costs.md must list each one.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from pacer_core import InputError
from pacer_core.cost_profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
PROFILES = sorted((ROOT / "pacer_core" / "profiles").glob("*.yaml"))
FIELDS = {
    "format",
    "name",
    "kind",
    "device",
    "dtype",
    "target",
    "context",
    "verify_s",
    "tree_verify_s",
    "draft_s",
    "preverify_s",
    "host_s",
    "sources",
}
NUMBER_FIELDS = ("context", "verify_s", "tree_verify_s", "draft_s", "preverify_s", "host_s")
TARGET_FIELDS = {"name", "params_b", "layers", "hidden", "vocab", "heads", "kv_heads", "intermediate", "digest"}


def seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_curve(curve, where: str) -> None:
    assert isinstance(curve, dict) and curve, f"{where}: a non-empty {{k: seconds}} mapping"
    for k, t in curve.items():
        assert isinstance(k, int) and not isinstance(k, bool) and k >= 1, f"{where}: token count {k!r}"
        assert seconds(t), f"{where}.{k}: {t!r} is not a positive number of seconds"
    ks = sorted(curve)
    for k0, k1 in zip(ks, ks[1:]):
        assert curve[k1] >= curve[k0], f"{where} falls from k={k0} to k={k1}"


def test_profiles_are_shipped():
    assert any(p.stem == "a100-7b-bf16" for p in PROFILES), "the published A100 7B profile is missing"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_follows_the_format(path):
    data = yaml.safe_load(path.read_text())
    assert set(data) <= FIELDS, f"unknown fields {sorted(set(data) - FIELDS)}"
    assert data["format"] == 1 and data["name"] == path.stem
    assert data["kind"] in ("measured", "published") and data["device"].strip()
    assert set(data.get("target") or {}) <= TARGET_FIELDS
    context = data.get("context")
    assert context is None or (isinstance(context, int) and not isinstance(context, bool) and context >= 0)

    check_curve(data["verify_s"], "verify_s")
    assert 1 in data["verify_s"], "verify_s must give k = 1 (plain decoding's forward)"
    if data["kind"] == "published":
        assert max(data["verify_s"]) >= 128, "a published profile covers k up to at least 128"
    if data.get("tree_verify_s") is not None:
        check_curve(data["tree_verify_s"], "tree_verify_s")
    assert data["draft_s"] and set(data["draft_s"]) <= {"feature", "token", "block"}
    for kind, curve in data["draft_s"].items():
        check_curve(curve, f"draft_s.{kind}")
    if data.get("preverify_s") is not None:
        assert seconds(data["preverify_s"])
    host = data["host_s"]
    assert {"plain", "chain"} <= set(host) <= {"plain", "chain", "tree"}
    assert seconds(host["plain"]) and seconds(host["chain"])
    if host.get("tree") is not None:
        check_curve(host["tree"], "host_s.tree")

    sources = data["sources"]
    present = [f for f in NUMBER_FIELDS if data.get(f) is not None]
    uncited = [f for f in present if not (isinstance(sources.get(f), str) and sources[f].strip())]
    assert not uncited, f"no source for {uncited}"
    assert set(sources) <= FIELDS, f"sources for unknown fields {sorted(set(sources) - FIELDS)}"


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_loads_by_name_and_path(path):
    by_name, by_path = load_profile(path.stem), load_profile(path)
    assert by_name == by_path and by_name.name == path.stem
    data = yaml.safe_load(path.read_text())
    assert by_name.verify(1) == pytest.approx(data["verify_s"][1])
    assert by_name.plain_step() == pytest.approx(data["verify_s"][1] + data["host_s"]["plain"])


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_is_documented(path):
    doc = (ROOT / "docs" / "costs.md").read_text()
    assert "## Published profiles" in doc
    assert f"`{path.stem}`" in doc, f"docs/costs.md does not list {path.stem}"


def test_published_gpu_profile_has_the_gpu_shape():
    """What the replay relies on a GPU profile for: at batch 1 a forward over tens of tokens costs
    about one token, and drafting is cheap beside verification."""
    profile = load_profile("a100-7b-bf16")
    assert profile.kind == "published"
    assert profile.verify(64) / profile.verify(1) < 1.2
    assert profile.verify(128) > profile.verify(1)
    assert profile.draft_forward("feature") < 0.1 * profile.verify(1)
    assert profile.tree_verify is not None and profile.host_tree is not None


def test_a_broken_copy_of_a_shipped_profile_is_refused(tmp_path):
    data = yaml.safe_load((ROOT / "pacer_core" / "profiles" / "a100-7b-bf16.yaml").read_text())
    data["verify_s"][128] = data["verify_s"][1] / 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="falls"):
        load_profile(bad)

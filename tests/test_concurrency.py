"""Models shared between engines and between processes.

- Two engines built on one loaded target (and draft), one thread each: each generation gives the
  output it gives alone (the KV cache is the model's, so the engines take turns on it); a hook of one
  engine calling another engine on the same model is refused, not deadlocked.
- Processes completing the same draft folder for the first time at once (a folder storing only the
  tensors it does not share with its target, completed into the user cache): each builds in its own
  temporary folder and publishes it by an atomic rename, so every process loads a whole copy.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from pacer_core import InputError, hookimpl

from helpers import adapter, build_engine, noisy_copy, reference_greedy, tiny_llama

BUDGET = 40
PROMPTS = ([5, 9, 13, 7, 22], [17, 3, 4, 17, 3], [8, 8, 1])


# -- two engines on one loaded model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_pair():
    target = tiny_llama(0, scale=3.0)
    return target, noisy_copy(target, std=0.03)


STACKS = (
    ("draft_model", "{name: fixed, gamma: 3}"),
    ("prompt_lookup", "{name: fixed, gamma: 2}"),
    ("draft_model, tree: {topk: 2, depth: 3, nodes: 6}", "{name: heuristic}"),
)


@pytest.mark.parametrize("shared", ["target and draft", "target only"])
def test_two_engines_on_one_target_one_thread_each(llama_pair, shared):
    target_model, draft_model = llama_pair
    target = adapter(target_model, eos=False)
    drafts = [adapter(draft_model, eos=False)]
    drafts.append(drafts[0] if shared == "target and draft" else adapter(draft_model, eos=False))
    engines = [
        build_engine(target, drafts[i], drafter, stop, {"temperature": 0.0}, "greedy")
        for i, (drafter, stop) in enumerate(STACKS[:2])
    ]
    expected = {tuple(p): reference_greedy(target_model, p, BUDGET, eos=False) for p in PROMPTS}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(engine) -> None:
        try:
            start.wait()
            for _ in range(3):
                for prompt in PROMPTS:
                    assert engine.generate(prompt, max_new_tokens=BUDGET).tokens == expected[tuple(prompt)]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors


def test_a_hook_decoding_with_another_engine_on_the_same_target_is_refused(llama_pair):
    target_model, draft_model = llama_pair
    target, draft = adapter(target_model, eos=False), adapter(draft_model, eos=False)
    other = build_engine(target, draft, "prompt_lookup", "{name: fixed, gamma: 2}", {"temperature": 0.0})

    class Nested:
        @hookimpl
        def pacer_start(self, state):
            other.generate([5, 9], max_new_tokens=2)

    probe = Nested()
    outer = build_engine(
        target, None, "prompt_lookup", "{name: fixed, gamma: 2}", {"temperature": 0.0}, plugins=[probe]
    )
    with pytest.raises(InputError, match="another engine's generation on the same model"):
        outer.generate([5, 9, 13], max_new_tokens=4)
    outer.pm.unregister(probe)
    assert len(outer.generate([5, 9, 13], max_new_tokens=4).tokens) == 4  # the locks were released
    assert len(other.generate([5, 9, 13], max_new_tokens=4).tokens) == 4
    # a model of its own: nesting is fine
    own = build_engine(
        adapter(target_model, eos=False), None, "prompt_lookup", "{name: fixed, gamma: 2}", {"temperature": 0.0}
    )

    class NestedOwn:
        tokens = None

        @hookimpl
        def pacer_start(self, state):
            self.tokens = own.generate([5, 9], max_new_tokens=2).tokens

    probe = NestedOwn()
    outer.pm.register(probe)
    outer.generate([5, 9, 13], max_new_tokens=4)
    assert probe.tokens is not None and len(probe.tokens) == 2


# -- processes completing one draft folder ----------------------------------------------------------
ROUNDS = 12


def complete_in_rounds(draft: str, cache: str, rounds: int, barrier, results) -> None:
    """In a spawned process: for each round, wait for the other process, then complete ``draft`` into
    the round's empty cache and read the completed weights back; puts (round, tensors or error)."""
    import os

    from helpers import single_thread

    with single_thread():
        from pacer_core.hf import load_safetensors, materialize

        for round_ in range(rounds):
            os.environ["PACER_CACHE"] = f"{cache}/{round_}"
            barrier.wait(timeout=300)
            try:
                folder = materialize(draft)
                tensors = load_safetensors(folder / "model.safetensors", "")
                results.put((round_, {name: t.numpy() for name, t in tensors.items()}))  # by value
            except Exception as exc:  # reported by the test
                results.put((round_, f"{type(exc).__name__}: {exc}"))


def test_two_processes_completing_one_draft_folder_both_load_it(tmp_path, monkeypatch):
    from pacer_core.hf import HFModel, load_safetensors, materialize, weights_digest
    from pacer_train.students import save_student, student_from_target

    monkeypatch.setenv("PACER_CACHE", str(tmp_path / "reference-cache"))
    target, draft = tmp_path / "target", tmp_path / "draft"
    tiny_llama(0).save_pretrained(target)
    student = student_from_target(HFModel(tiny_llama(0)), [1])  # stores its embeddings as the target's
    save_student(student, draft, target_path=str(target), target_digest=weights_digest(target), dtype="float32")
    expected = load_safetensors(materialize(str(draft)) / "model.safetensors", "")
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=complete_in_rounds, args=(str(draft), str(tmp_path / "cache"), ROUNDS, barrier, results))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=600) for _ in range(2 * ROUNDS)]
    for worker in workers:
        worker.join(timeout=60)
    errors = [outcome for _, outcome in outcomes if isinstance(outcome, str)]
    assert not errors, errors
    for _, tensors in outcomes:
        assert tensors.keys() == expected.keys()
        assert all(torch.equal(torch.from_numpy(tensors[name]), expected[name]) for name in expected)
    leftovers = [p.name for p in (tmp_path / "cache").glob("*/drafts/*") if "partial" in p.name]
    assert not leftovers, leftovers  # the temporary folders are gone

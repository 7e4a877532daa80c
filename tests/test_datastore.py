"""The ``datastore`` drafter and the ``phrase_pool`` member: retrieval exact and lossless.

The index against brute force, built incrementally and at once, with eviction; the ranking of
continuations (longest match, counts, ties); the datastore file (round trip, size bound, every
kind of bad file refused in one line); greedy equality with plain decoding of ``datastore`` alone
and of ``hybrid`` with ``datastore`` and ``phrase_pool`` members; the exact-distribution chi-square
test of such a hybrid, and a hybrid lying about its retrieved tokens that the same test rejects.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from pacer_core import ConfigError, InputError, load_config
from pacer_core.testing import ScriptedLM, chisquare_pvalue, exact_continuation_probs
from pacer_plugins.datastore.index import TokenIndex, context_matches, rank_continuations
from pacer_plugins.datastore.store import FORMAT, VERSION, load_documents, save_documents

from helpers import (
    DRAFT_TABLE,
    LENGTH,
    PASS_P,
    PROMPT,
    SAMPLINGS,
    TARGET_TABLE,
    build_engine,
    lie_about_merged_nodes,
    sample_outputs,
)
from helpers import SCRIPTED_VOCAB as VOCAB

# -- the index -------------------------------------------------------------------------------------


def brute_find(documents: list[list[int]], ngram: list[int]) -> list[tuple[int, int]]:
    """(document, offset) of every occurrence of ``ngram`` inside one document."""
    n = len(ngram)
    return [(d, i) for d, doc in enumerate(documents) for i in range(len(doc) - n + 1) if doc[i : i + n] == ngram]


def located(index: TokenIndex, positions) -> list[tuple[int, int]]:
    """Absolute index positions as (document, offset), documents numbered oldest first."""
    starts = np.concatenate([[0], np.cumsum(np.array(index.lengths) + 1)[:-1]])
    out = []
    for p in positions:
        d = int(np.searchsorted(starts, p, "right") - 1)
        out.append((d, int(p - starts[d])))
    return out


def random_documents(seed: int, count: int, vocab: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(0, 30))] for _ in range(count)]


@pytest.mark.parametrize("seed", range(3))
def test_find_equals_brute_force_built_incrementally_and_at_once(seed):
    docs = random_documents(seed, 40)
    incremental, at_once = TokenIndex(3), TokenIndex(3)
    for doc in docs:
        incremental.add(doc)
    at_once.extend(docs)
    assert incremental.runs <= 7 and at_once.runs == 1  # merged: O(log size) runs
    kept = [d for d in docs if d]
    ngrams = [[a] for a in range(6)] + [[a, b] for a in range(5) for b in range(5)] + [[1, 2, 3], [0, 0, 0], [4, 3, 2]]
    for ngram in ngrams:
        expected = sorted(brute_find(kept, ngram), reverse=True)  # most recent first
        assert located(incremental, incremental.find(ngram)) == expected, ngram
        assert at_once.find(ngram).tolist() == incremental.find(ngram).tolist()
    with pytest.raises(ValueError):
        incremental.find([1, 2, 3, 4])  # longer than the index's width


def test_continuations_stop_at_the_document_end():
    index = TokenIndex(2)
    index.extend([[1, 2, 3], [2, 3, 4, 5]])
    assert [index.continuation(p + 2, 5) for p in index.find([2, 3])] == [[4, 5], []]


def test_eviction_drops_the_oldest_documents_and_keeps_the_index_exact():
    docs = random_documents(7, 30)
    bounded = TokenIndex(2)
    for doc in docs:
        bounded.add(doc, max_tokens=60)
        assert bounded.size <= 60
    kept = [d for d in bounded.documents()]
    assert kept == [d for d in docs if d][-len(kept) :]  # the newest, in order
    assert sum(map(len, kept)) + len([d for d in docs if d][-len(kept) - 1]) > 60  # the next older one did not fit
    rebuilt = TokenIndex(2)
    rebuilt.extend(docs, max_tokens=60)
    assert rebuilt.documents() == kept
    for ngram in ([a, b] for a in range(5) for b in range(5)):
        assert located(bounded, bounded.find(ngram)) == sorted(brute_find(kept, ngram), reverse=True)
        assert rebuilt.find(ngram).tolist() == bounded.find(ngram).tolist()
    single = TokenIndex(2)
    single.add(list(range(10)), max_tokens=4)  # one document longer than the bound keeps its end
    assert single.documents() == [[6, 7, 8, 9]]


def test_context_matches_exclude_the_suffix_itself():
    context = np.array([7, 1, 2, 9, 1, 2, 5, 1, 2])
    assert context_matches(context, 2).tolist() == [4, 1]  # most recent first
    assert context_matches(context, 3).tolist() == []
    assert context_matches(np.array([3]), 1).tolist() == []


# -- ranking ---------------------------------------------------------------------------------------


def test_the_main_phrase_follows_the_most_frequent_continuation():
    phrases = rank_continuations([[1, 2], [3, 4], [3, 5], [3, 4, 6]], branches=3)
    assert phrases[0] == [3, 4, 6]  # 3 is seen three times, then 4 twice
    assert phrases[1:] == [[1, 2], [3, 5]]  # both branches have one match; 1 was seen first


def test_ties_go_to_the_most_recent_match_and_branches_are_capped():
    assert rank_continuations([[5, 6], [7, 8]], branches=1) == [[5, 6]]
    assert rank_continuations([[5, 6], [5, 7], [5, 7]], branches=4) == [[5, 7], [5, 6]]
    assert rank_continuations([[], []], branches=2) == []


def datastore_plugin(engine):
    return next(p for name, p in engine.pm.list_name_plugin() if name.endswith(":datastore"))


def test_the_longest_match_wins_over_a_more_frequent_shorter_one(tmp_path):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([[4, 5, 6, 7], [1, 2, 3, 6], [0, 5, 6, 1], [0, 5, 6, 1]]))
    target = ScriptedLM(VOCAB, table=TARGET_TABLE)
    engine = build_engine(
        target,
        None,
        f"datastore, corpus: '{corpus}', max_ngram: 3, min_ngram: 1",
        "{name: fixed, gamma: 3}",
        {"temperature": 0.0},
        verifier="greedy",
    )
    plugin = datastore_plugin(engine)
    assert plugin.phrases([3, 4, 5, 6], 3)[0] == [7]  # [4, 5, 6] once beats [5, 6] three times
    assert plugin.phrases([2, 5, 6], 3) == [[1], [7]]  # [5, 6]: twice followed by 1, once by 7
    assert plugin.phrases([5, 6, 2, 5, 6], 3) == [[1], [2, 5, 6], [7]]  # 1 twice; then the tie: the context first
    assert plugin.phrases([6, 3, 2, 6, 3], 2)[0] == [2, 6]  # the context itself: [6, 3] then 2, 6
    assert plugin.phrases([6, 3, 2, 6, 3], 2, search_context=False) == [[6]]  # the corpus alone: [3] then 6
    assert plugin.phrases([3, 7], 3) == []  # 7 ends a document: nothing follows it


# -- the datastore file ----------------------------------------------------------------------------


def scripted_pair():
    return ScriptedLM(VOCAB, table=TARGET_TABLE), ScriptedLM(VOCAB, table=DRAFT_TABLE)


def datastore_engine(options: str = "", sampling=None, target=None):
    target = target or ScriptedLM(VOCAB, table=TARGET_TABLE)
    return build_engine(
        target,
        None,
        f"datastore{options}",
        "{name: fixed, gamma: 3}",
        sampling or {"temperature": 0.0},
        verifier="greedy" if not sampling else "speculative_sampling",
    )


def test_generations_persist_across_runs(tmp_path):
    path = tmp_path / "store.npz"
    first = datastore_engine(f", path: '{path}'")
    outputs = [first.generate(prompt, max_new_tokens=12).tokens for prompt in ([1, 2, 3], [4, 5])]
    assert path.exists() and not (tmp_path / "store.npz.partial").exists()
    stored = datastore_plugin(first).store.documents()
    assert stored == [[1, 2, 3] + outputs[0], [4, 5] + outputs[1]]  # max_ngram (4) prompt tokens before each
    second = datastore_engine(f", path: '{path}'")
    assert datastore_plugin(second).store.documents() == stored
    result = second.generate([1, 2, 3], max_new_tokens=12)
    assert result.tokens == outputs[0] and result.metrics["datastore_documents"] == 3
    assert datastore_plugin(second).proposals > 0


def test_the_size_bound_evicts_the_oldest_generations(tmp_path):
    path = tmp_path / "store.npz"
    engine = datastore_engine(f", path: '{path}', max_tokens: 20")
    for prompt in ([1], [2], [3]):
        engine.generate(prompt, max_new_tokens=9)  # 10 tokens stored each
    stored = datastore_plugin(engine).store.documents()
    assert [d[0] for d in stored] == [2, 3] and sum(map(len, stored)) == 20
    assert datastore_plugin(datastore_engine(f", path: '{path}', max_tokens: 20")).store.documents() == stored
    assert datastore_plugin(datastore_engine(f", path: '{path}', max_tokens: 12")).store.documents() == [stored[1]]


def _write_store(path, header_changes=None, tokens=(1, 2, 3), lengths=(3,), header=None):
    header = header or {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": f"ids:{VOCAB}",
        "tokens": len(tokens),
        "documents": len(lengths),
    }
    header.update(header_changes or {})
    with open(path, "wb") as f:
        np.savez(
            f,
            header=np.array(json.dumps(header)),
            tokens=np.array(tokens, dtype=np.int32),
            lengths=np.array(lengths, dtype=np.int64),
        )


def bad_stores(tmp_path):
    good = tmp_path / "good.npz"
    save_documents(good, np.array([1, 2, 3]), np.array([3]), f"ids:{VOCAB}")
    cases = {}
    cases["truncated"] = tmp_path / "truncated.npz"
    cases["truncated"].write_bytes(good.read_bytes()[:40])
    cases["not a zip"] = tmp_path / "text.npz"
    cases["not a zip"].write_text("hello")
    cases["empty"] = tmp_path / "empty.npz"
    cases["empty"].write_bytes(b"")
    for name, changes in {
        "version": {"version": 2},
        "format": {"format": "other"},
        "tokenizer": {"tokenizer": "vocab-sha256:0123456789abcdef"},
        "count": {"tokens": 4},
    }.items():
        cases[name] = tmp_path / f"{name}.npz"
        _write_store(cases[name], changes)
    cases["lengths"] = tmp_path / "lengths.npz"
    _write_store(
        cases["lengths"],
        lengths=(2,),
        header={"format": FORMAT, "version": VERSION, "tokenizer": f"ids:{VOCAB}", "tokens": 3, "documents": 1},
    )
    cases["ids"] = tmp_path / "ids.npz"
    _write_store(cases["ids"], tokens=(1, 2, 99))
    cases["pickle"] = tmp_path / "pickle.npz"
    with open(cases["pickle"], "wb") as f:
        np.savez(f, header=np.array([{"format": FORMAT}], dtype=object), tokens=np.array([1]), lengths=np.array([1]))
    cases["huge"] = tmp_path / "huge.npz"  # 1 KB claiming 5e10 tokens: was a MemoryError (5e9: 18.6 GiB allocated)
    _write_claiming(cases["huge"], 5 * 10**10)
    return good, cases


def _write_claiming(path, count: int) -> None:
    """A small store whose tokens array's .npy header declares ``count`` int32 values."""
    import io
    import zipfile

    def npy(array=None, header=None) -> bytes:
        out = io.BytesIO()
        if array is not None:
            np.lib.format.write_array(out, array)
        else:
            np.lib.format.write_array_header_1_0(out, header)
            out.write(b"\0" * 64)
        return out.getvalue()

    header = {"format": FORMAT, "version": VERSION, "tokenizer": f"ids:{VOCAB}", "tokens": count, "documents": 1}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("header.npy", npy(np.array(json.dumps(header))))
        archive.writestr("tokens.npy", npy(header={"descr": "<i4", "fortran_order": False, "shape": (count,)}))
        archive.writestr("lengths.npy", npy(np.array([count], dtype=np.int64)))


NEEDLES = {
    "huge": "declares 200000000000 bytes, more than the file's",
    "truncated": "not a readable",
    "not a zip": "not a readable",
    "empty": "not a readable",
    "version": "format version 2",
    "format": "not a datastore file",
    "tokenizer": "another tokenizer",
    "count": "inconsistent",
    "lengths": "inconsistent",
    "ids": "outside this target's vocabulary",
    "pickle": "not a readable",
}


def test_bad_store_files_are_refused_in_one_line(tmp_path):
    good, cases = bad_stores(tmp_path)
    assert datastore_plugin(datastore_engine(f", path: '{good}'")).store.documents() == [[1, 2, 3]]
    for name, path in cases.items():
        with pytest.raises(InputError) as info:
            datastore_engine(f", path: '{path}'")
        message = str(info.value)
        assert "\n" not in message and str(path) in message and "delete it or set another" in message, message
        assert NEEDLES[name] in message, (name, message)


def test_a_path_no_save_could_write_is_refused_before_decoding(tmp_path):
    from helpers import bad_out_folders

    a_folder = tmp_path / "a-folder"
    a_folder.mkdir()
    places = [a_folder] + [place / "store.npz" for place in bad_out_folders(tmp_path) if place.name != "a-file"]
    for path in places:
        with pytest.raises(InputError, match=f"datastore path '{path}' (is a folder|lies under|cannot be written)"):
            datastore_engine(f", path: '{path}'")  # was refused only by the save after the first generation


_WRITER = """
import sys, numpy as np
from pacer_plugins.datastore.store import load_documents, save_documents
path, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)
for i in range(150):
    lengths = rng.integers(1, 400, size=50)
    save_documents(path, rng.integers(0, 8, size=int(lengths.sum())), lengths, "ids:8")
    docs = load_documents(path, "ids:8", 8)
    assert sum(map(len, docs)) > 0
"""


def test_two_processes_saving_and_loading_one_store(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "store.npz"
    runs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(seed)], stderr=subprocess.PIPE, text=True)
        for seed in (1, 2)
    ]
    errors = [run.communicate(timeout=300)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], errors  # was FileNotFoundError, "not a zip file", bad CRC
    assert load_documents(path, "ids:8", 8) and [p.name for p in tmp_path.iterdir()] == ["store.npz"]


def test_corpus_files(tmp_path):
    class Tokenizer:  # what the datastore needs of the target's tokenizer
        def vocab(self):
            return {"a": 0, "b": 1}

        def encode(self, text, chat_template=True):
            assert not chat_template
            return [int(c) for c in text.split()]

    text = tmp_path / "corpus.txt"
    text.write_text("1 2 3 4 5")
    from pacer_core import Resources, SamplingParams
    from pacer_plugins.datastore.plugin import Datastore, DatastoreConfig

    target = ScriptedLM(VOCAB, table=TARGET_TABLE)
    resources = Resources(target=target, draft=None, sampling=SamplingParams(), tokenizer=Tokenizer())
    plugin = Datastore(DatastoreConfig(corpus=str(text)), resources)
    assert plugin.corpus.documents() == [[1, 2, 3, 4, 5]] and plugin.phrases([0, 2, 3], 2) == [[4, 5]]
    assert plugin.identity.startswith("vocab-sha256:")
    with pytest.raises(InputError, match="no tokenizer"):
        datastore_engine(f", corpus: '{text}'")
    for content, needle in (("[1, 2, 99]", "token ids in"), ("{", "not readable JSON"), ('[[1], "x"]', "token ids in")):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(InputError, match=needle):
            datastore_engine(f", corpus: '{bad}'")
    with pytest.raises(InputError, match="does not exist"):
        datastore_engine(f", corpus: '{tmp_path / 'gone.txt'}'")


def _corpus_folder(folder, digest="f00d"):
    """A two-answer corpus folder as `pacer corpus` writes it (prompt, then the target's answer)."""
    from pacer_train.corpus.shards import CorpusStore

    store = CorpusStore(folder)
    store.set_header({"seed": 0}, {"path": "scripted", "digest": digest}, {})
    records = [
        {
            "id": f"chat/{i}",
            "family": "chat",
            "position": i,
            "sha": str(i),
            "prompt_tokens": 3,
            "answer_tokens": 3,
            "finished": True,
        }
        for i in range(2)
    ]
    store.append(records, [[7, 7, 1, 2, 3, 4], [7, 7, 2, 5, 6, 0]], [], 2, VOCAB, {})
    return folder


def test_a_corpus_folder_gives_the_targets_answers_after_their_prompts_tail(tmp_path):
    from pacer_train.corpus.loaders import load_corpus

    folder = _corpus_folder(tmp_path / "corpus")
    # each answer with its prompt's last max_ngram (here 2) tokens; a prompt shorter than that, whole
    assert load_corpus(str(folder), None, VOCAB, "f00d", 2) == [[7, 1, 2, 3, 4], [7, 2, 5, 6, 0]]
    assert load_corpus(str(folder), None, VOCAB, None, 9) == [[7, 7, 1, 2, 3, 4], [7, 7, 2, 5, 6, 0]]
    plugin = datastore_plugin(datastore_engine(f", corpus: '{folder}', max_ngram: 2, min_ngram: 2"))
    assert plugin.phrases([9, 7, 2], 3) == [[5, 6, 0]]  # found after the prompt's tail
    with pytest.raises(InputError, match="written by another target .*weights f00d; this target's are beef"):
        load_corpus(str(folder), None, VOCAB, "beef", 2)
    with pytest.raises(InputError, match="beyond this target's vocabulary"):
        load_corpus(str(folder), None, 4, None, 2)
    with pytest.raises(InputError, match="manifest.json is missing"):
        datastore_engine(f", corpus: '{tmp_path}'")
    shard = folder / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    with pytest.raises(InputError, match="does not match its sha256"):
        datastore_engine(f", corpus: '{folder}'")
    folder = _corpus_folder(tmp_path / "damaged")
    (folder / "shard-00000.json").write_text('{"records": [')  # damaged JSON: one line naming it
    with pytest.raises(InputError, match="corpus shard '.*shard-00000.json' is not valid JSON"):
        datastore_engine(f", corpus: '{folder}'")


def test_the_shipped_corpus_is_the_embedded_targets_answers():
    from pathlib import Path

    import pacer_plugins.eagle
    from pacer_train.corpus.loaders import load_corpus
    from pacer_train.corpus.shards import CorpusStore

    manifest = CorpusStore(Path(pacer_plugins.eagle.__file__).parent / "corpus", create=False).manifest
    docs = load_corpus("shipped", None, 49152, manifest["target"]["digest"], 4)
    assert len(docs) == manifest["totals"]["records"]
    assert sum(map(len, docs)) == manifest["totals"]["answer_tokens"] + 4 * len(docs)
    with pytest.raises(InputError, match="written by another target"):
        load_corpus("shipped", None, 49152, "another", 4)


def test_config_refusals():
    with pytest.raises(ConfigError, match="min_ngram"):
        load_config(overrides=["strategy.drafter={name: datastore, min_ngram: 5}"], require_models=False)
    with pytest.raises(ConfigError, match="topk"):
        load_config(overrides=["strategy.drafter={name: phrase_pool, topk: 30}"], require_models=False)


# -- greedy equality -------------------------------------------------------------------------------

PROMPTS = [PROMPT, [3, 5, 7], [6]]
DRAFTERS = {
    "datastore": "datastore",
    "datastore(branches 1)": "datastore, branches: 1, min_ngram: 1",
    "phrase_pool": "phrase_pool",
    "hybrid(draft+datastore)": "hybrid, members: [{name: draft_model}, {name: datastore}]",
    "hybrid(draft-tree+datastore+pool)": "hybrid, members: [{name: draft_model, tree: {topk: 2, depth: 3, nodes: 6}}, "
    "{name: datastore}, {name: phrase_pool, level: 4}]",
    "hybrid(lookup+pool)": "hybrid, members: [{name: prompt_lookup}, {name: phrase_pool, level: 3}]",
}


def greedy_reference(target, prompt, budget):
    engine = build_engine(target, None, "autoregressive", "", {"temperature": 0.0}, verifier="greedy")
    return engine.generate(prompt, max_new_tokens=budget).tokens


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("verifier", ["greedy", "speculative_sampling"])
def test_greedy_output_equals_plain_decoding(drafter, verifier):
    target, draft = scripted_pair()
    engine = build_engine(
        target, draft, DRAFTERS[drafter], "{name: fixed, gamma: 3}", {"temperature": 0.0}, verifier=verifier
    )
    accepted = {}
    for _ in range(2):  # the second round drafts from the first round's stored generations and pool
        for prompt in PROMPTS:
            for budget in (1, 7, 24):
                result = engine.generate(prompt, max_new_tokens=budget)
                assert result.tokens == greedy_reference(target, prompt, budget)
                for key, value in result.metrics.items():
                    if key.startswith("hybrid_accepted_"):
                        accepted[key] = accepted.get(key, 0) + value
    if drafter.startswith("hybrid"):
        members = [m.split(",")[0].split("}")[0] for m in DRAFTERS[drafter].split("{name: ")[1:]]
        assert {f"hybrid_accepted_{m}" for m in members} <= set(accepted)
        assert all(accepted[f"hybrid_accepted_{m}"] > 0 for m in members[1:]), accepted  # each source helps


# -- exact distribution ----------------------------------------------------------------------------

HYBRID = "hybrid, members: [{name: draft_model}, {name: datastore, min_ngram: 1}, {name: phrase_pool, level: 3}]"


def _pvalue(engine, samples: int) -> float:
    target = ScriptedLM(VOCAB, table=TARGET_TABLE)
    outputs, _ = sample_outputs(engine, PROMPT, samples)
    return chisquare_pvalue(outputs, exact_continuation_probs(target, PROMPT, LENGTH, engine.sampling))


def warm_store(tmp_path) -> str:
    """A datastore file of the target's own greedy continuations of PROMPT: drafts are often right."""
    path = tmp_path / "warm.npz"
    engine = datastore_engine(f", path: '{path}'")
    for prompt in (PROMPT, PROMPT[1:], PROMPT[2:]):
        engine.generate(prompt, max_new_tokens=16)
    return str(path)


@pytest.mark.parametrize(
    "drafter, sampling",
    [
        (HYBRID, "t1"),
        pytest.param("datastore, min_ngram: 1", "topk3", marks=pytest.mark.slow),
        pytest.param(HYBRID, "topp0.8", marks=pytest.mark.slow),
        pytest.param("phrase_pool, level: 3", "t0.6", marks=pytest.mark.slow),
    ],
)
def test_sampling_has_the_target_distribution(request, tmp_path, drafter, sampling):
    target, draft = scripted_pair()
    engine = build_engine(
        target,
        draft,
        f"{drafter}, path: '{warm_store(tmp_path)}'"
        if drafter.startswith("datastore")
        else drafter.replace("{name: datastore", f"{{name: datastore, path: '{warm_store(tmp_path)}'"),
        "{name: fixed, gamma: 2}",
        SAMPLINGS[sampling],
    )
    slow = request.node.get_closest_marker("slow") is not None
    assert _pvalue(engine, 6000 if slow else 2000) > PASS_P


def test_a_hybrid_lying_about_its_retrieved_tokens_is_rejected(tmp_path):
    target, draft = scripted_pair()
    drafter = HYBRID.replace("{name: datastore", f"{{name: datastore, path: '{warm_store(tmp_path)}'")
    engine = build_engine(target, draft, drafter, "{name: fixed, gamma: 2}", SAMPLINGS["t1"])
    lie_about_merged_nodes(engine)  # its retrieved side nodes claimed drawn from the draft's distribution
    assert _pvalue(engine, 1500) < PASS_P


def test_a_seed_reproduces_a_sampled_generation_while_the_store_grows(tmp_path):
    path = tmp_path / "store.npz"
    engine = datastore_engine(f", path: '{path}', min_ngram: 1", sampling={"temperature": 1.0})
    outputs = set()
    for prompt in ([1, 2, 3, 1, 2], [4, 5, 4, 5], PROMPT):
        outputs.add(tuple(engine.generate(PROMPT, max_new_tokens=16, seed=1).tokens))
        engine.generate(prompt, max_new_tokens=16, seed=7)
    assert len(outputs) == 1
    assert datastore_plugin(engine).store.size > 60 and datastore_plugin(engine).searched.size == 0
    assert len(np.load(path)["lengths"]) == 6  # every generation is saved for later runs


def test_tiny_llama_greedy_output_equals_transformers_generate():
    from helpers import adapter, greedy_pair

    prompts = [[5, 9, 13, 5, 9, 13, 5], [17, 4, 17, 4]]
    target, draft, references = greedy_pair(8.0, prompts, 20)
    engine = build_engine(
        adapter(target, eos=False),
        adapter(draft, eos=False),
        "hybrid, members: [{name: draft_model}, {name: datastore, min_ngram: 1}, {name: phrase_pool, level: 3}]",
        "{name: fixed, gamma: 3}",
        {"temperature": 0.0},
        verifier="greedy",
    )
    for _ in range(2):  # the second round retrieves from the first one's generations
        for prompt, reference in zip(prompts, references):
            assert engine.generate(prompt, max_new_tokens=20).tokens == reference

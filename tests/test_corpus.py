"""The self-distillation corpus (`pacer corpus`): instruction stream, benchmark guard, batched
greedy answers, shards, resume after a kill, the loader's digest check, and the command's errors.
A scripted fake generator stands in for the target (no real model here)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from pacer_core import InputError, cli
from pacer_core.hf import greedy_batch
from pacer_train.corpus import CorpusError, corpus_stats, iter_corpus
from pacer_train.corpus.command import Backend, CorpusConfig, run_corpus
from pacer_train.corpus.generate import answer_all
from pacer_train.corpus.guard import BenchmarkGuard
from pacer_train.corpus.stream import FAMILIES, PATTERN, Stream

from helpers import EOS, adapter, reference_greedy, tiny_llama


@pytest.fixture(scope="module")
def stream() -> Stream:
    return Stream(0)


# -- the instruction stream -----------------------------------------------------------------------
def test_stream_is_deterministic_large_and_varied(stream):
    again = Stream(0, stream.mat)
    first = [stream.at(p) for p in range(6000)]
    assert first == [again.at(p) for p in range(6000)]
    assert [stream.at(p).id for p in (5999, 17, 3)] == [first[5999].id, first[17].id, first[3].id]  # random access
    assert len({i.id for i in first}) == len(first)
    texts = [i.text for i in first]
    assert len(set(texts)) >= 0.99 * len(texts)
    counts = Counter(i.family for i in first)
    assert set(counts) == set(FAMILIES)
    assert all(counts[f] == 300 * PATTERN.count(f) for f in FAMILIES)
    sizes = stream.describe()["family_sizes"]
    assert min(sizes.values()) >= 5000 and sum(sizes.values()) >= 200_000
    other = Stream(1, stream.mat)
    assert sum(other.at(p).text != first[p].text for p in range(200)) >= 190
    edits = [i.text for i in first if i.family == "code_edit"]
    assert all("```python\ndef " in t for t in edits)
    assert len({t.split("```python")[1] for t in edits}) >= 0.8 * len(edits)  # many different functions


def test_a_stream_of_chosen_families_gives_them_in_turn_and_records_them(stream):
    """``families=[...]``: a corpus of open-ended chat only (or any mix); the default stream's record
    stays as every corpus made before the option has it."""
    open_chat = Stream(0, stream.mat, families=["open_chat"])
    items = [open_chat.at(p) for p in range(600)]
    assert {i.family for i in items} == {"open_chat"}
    assert [i.id for i in items[:3]] == ["open_chat/0", "open_chat/1", "open_chat/2"]
    assert items == [Stream(0, stream.mat, families=["open_chat"]).at(p) for p in range(600)]
    texts = [i.text for i in items]
    assert len(set(texts)) >= 0.75 * len(texts)  # a few fixed puzzles repeat; the corpus skips repeats
    starts = Counter(t.split()[0] for t in texts)
    assert len(starts) >= 15 and max(starts.values()) < 0.3 * len(texts)  # writing, role-play, extraction, ...
    assert any("\n\n" in t and "JSON" in t for t in texts)
    assert any(t.startswith(("Pretend", "Act as", "You are")) for t in texts)
    assert open_chat.describe()["families"] == ["open_chat"] and "families" not in stream.describe()
    mixed = Stream(0, stream.mat, families=["math", "open_chat"])
    assert [mixed.at(p).family for p in range(4)] == ["math", "open_chat", "math", "open_chat"]
    assert mixed.at(2).text == stream.families["math"].text(*_combo(stream, mixed, "math", 1))
    for bad in (["poetry"], ["chat", "chat"], []):
        with pytest.raises(ValueError, match="families must be distinct names"):
            Stream(0, stream.mat, families=bad)


def test_the_word_lists_are_data_files_the_stream_reads_and_the_package_ships():
    """pacer_train/corpus/words/*.txt: each read by the stream or the instructions (none left over),
    one item per line with no padding, and matched by pyproject's package data (an installed pacer
    corpus finds them)."""
    from pacer_train.corpus import instructions
    from pacer_train.corpus import stream as stream_module

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    files = sorted(stream_module.WORDS.glob("*.txt"))
    source = Path(stream_module.__file__).read_text() + Path(instructions.__file__).read_text()
    assert files and all(f'words("{f.stem}")' in source for f in files)
    for f in files:
        items = stream_module.words(f.stem)
        assert items and all(item == item.strip() for item in items), f.name
    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["pacer_train"]
    package = root / "pacer_train"
    assert all(any(f.relative_to(package).match(pattern) for pattern in data) for f in files)
    assert stream_module.CHAT_MODIFIERS[0] == stream_module.CODE_EXTRAS[0] == stream_module.MATH_SUFFIXES[0] == ""


def _combo(stream, other, family, j):
    """The combination and rng item ``j`` of ``family`` gets (the same in any stream of that seed)."""
    import random

    a, b = other._perms[family]
    return (a * j + b) % stream.families[family].size, random.Random(f"0:{family}:{j}")


# -- the benchmark guard --------------------------------------------------------------------------
def test_guard_refuses_long_overlaps_and_short_whole_prompts():
    long = "Natalia sold clips to forty eight of her friends in April and then she sold half as many in May"
    guard = BenchmarkGuard([("gsm8k/0", long), ("mtbench/1", "Compose a travel blog post.")])
    words = long.split()
    assert "gsm8k/0" in guard.refuses("Hi. " + " ".join(words[3:16]).upper() + " ok")  # 13 words, any case
    assert guard.refuses("Tell me: " + " ".join(words[3:15])) is None  # 12 words
    assert "mtbench/1" in guard.refuses("Please compose a travel blog post, thanks")
    assert guard.refuses("Compose a travel blog") is None


def test_the_real_guard_covers_the_benchmark_sets_and_the_stream_avoids_them(stream):
    guard = BenchmarkGuard.from_benchmarks()
    assert guard.describe()["prompts"] >= 1700
    from pacer_train.corpus.guard import _prompt_sets  # wherever the prompt sets live

    for name in ("humaneval", "gsm8k", "mtbench", "summarization", "code_editing"):
        prompt = _prompt_sets()[name]()[0]
        assert guard.refuses("Please answer this.\n\n" + prompt.text) is not None, name
    second = next(p for p in _prompt_sets()["mtbench"]() if len(p.turns) > 1)  # multi-turn benches use them
    assert f"{second.question_id}/turn2" in guard.refuses("Next: " + second.turns[1])
    refused = [stream.at(p) for p in range(3000) if guard.refuses(stream.at(p).text)]
    assert len(refused) < 0.05 * 3000 and {i.family for i in refused} <= {"summary"}


# -- batched greedy -------------------------------------------------------------------------------
def test_batched_greedy_answers_are_the_targets_own():
    model = tiny_llama(3, scale=4.0)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 64, (int(n),), generator=generator).tolist()
        for n in torch.randint(1, 20, (10,), generator=generator)
    ]
    common = Counter(t for p in prompts for t in reference_greedy(model, p, 20)).most_common(1)[0][0]
    with torch.no_grad():  # EOS takes over from a frequent token: answers end at different steps
        model.lm_head.weight[EOS] = model.lm_head.weight[common] * 1.05
    target = adapter(model)
    wanted = [reference_greedy(model, p, 20) for p in prompts]
    assert len({len(a) for a in wanted}) >= 3
    done = []
    generate = lambda ps, n, rows, on_answer: greedy_batch(target, ps, n, rows, on_answer)  # noqa: E731
    assert answer_all(generate, prompts, 4, 20, done.append) == wanted
    assert sorted(map(tuple, done)) == sorted(map(tuple, wanted))  # each answer reported once, when complete
    for rows in (1, 3, 10):  # one row at a time, rows joining a running batch, all at once
        assert greedy_batch(target, prompts, 20, rows) == wanted


def test_the_real_backend_loads_the_target_and_warns_where_its_dtype_is_slow_for_batches(monkeypatch, capsys):
    """``load_backend``: the target's digest, device and dtype recorded, its greedy batches as the
    target's own, and one warning line where the dtype is slow for many rows on this CPU."""
    import pacer_core.hf as hf
    import pacer_train.corpus.command as command

    model = tiny_llama(3, scale=4.0)
    target = adapter(model)
    target.digest = "f00d"
    tokenizer = type("Tokenizer", (), {"encode": lambda self, text: [3, 4]})()
    monkeypatch.setattr(hf, "load_section", lambda section, name: (target, tokenizer, "f00d"))
    monkeypatch.setattr(
        command, "batched_dtype_hint", lambda dtype, device, option: f"slow for batches: set {option}=float32"
    )
    backend = command.load_backend(CorpusConfig(out="unused"))
    assert backend.target["digest"] == "f00d" and backend.target["device"] == "cpu" and backend.encode("x") == [3, 4]
    assert backend.generate([[5, 6, 7]], 8, 1, None) == [reference_greedy(model, [5, 6, 7], 8)]
    assert capsys.readouterr().err.strip().endswith("warning: slow for batches: set dtype=float32")


# -- shards, resume, loader -----------------------------------------------------------------------
def fake_backend(fail_after: int = -1) -> Backend:
    """Prompt ids from the text's bytes; the answer a function of the prompt, ending with EOS 2."""
    calls = []

    def generate(prompts, max_new_tokens, rows, on_answer):
        answers = []
        for index, p in enumerate(prompts):
            calls.append(1)
            if len(calls) == fail_after:
                raise KeyboardInterrupt  # what Ctrl-C or SIGTERM does mid-shard
            answers.append([(sum(p) + k) % 250 + 3 for k in range(min(len(p) % 9, max_new_tokens - 1))] + [2])
            if on_answer is not None:
                on_answer(index, answers[-1])
        return answers

    return Backend(
        encode=lambda text: [b % 250 + 3 for b in text.encode()[:60]],
        generate=generate,
        vocab_size=256,
        target={"path": "fake", "digest": "f00d", "dtype": "float32", "device": "cpu"},
        eos=[2],
    )


def config(out: Path, **kw) -> CorpusConfig:
    return CorpusConfig(
        out=str(out),
        tokens=kw.pop("tokens", 200),
        shard_size=kw.pop("shard_size", 10),
        batch_size=kw.pop("batch_size", 4),
        **kw,
    )


def records(out: Path) -> list[tuple]:
    return [(s.id, s.family, s.position, s.tokens.tolist(), s.prompt_length) for s in iter_corpus(out)]


def test_shards_round_trip(tmp_path, stream):
    refused_text = stream.at(3).text
    guard = BenchmarkGuard([("bench/0", refused_text)])
    stats = run_corpus(config(tmp_path), "pacer corpus test", backend=fake_backend(), stream=stream, guard=guard)
    assert stats["answer_tokens"] >= 200 and stats["shards"] == len(list(tmp_path.glob("shard-*.safetensors")))
    backend = fake_backend()
    samples = list(iter_corpus(tmp_path))
    for s in samples:
        item = stream.at(s.position)
        prompt = backend.encode(item.text)
        assert (s.id, s.family) == (item.id, item.family)
        assert s.prompt.tolist() == prompt and s.answer.tolist() == backend.generate([prompt], 256, 1, None)[0]
        assert s.finished
    assert 3 not in {s.position for s in samples}
    info = json.loads((tmp_path / "shard-00000.json").read_text())
    assert info["refused"][0]["position"] == 3 and "bench/0" in info["refused"][0]["reason"]
    assert info["generation"]["max_new_tokens"] == 256 and info["target"]["digest"] == "f00d"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["totals"]["families"].keys() == set(FAMILIES)
    assert sum(f["answer_tokens"] for f in manifest["totals"]["families"].values()) == stats["answer_tokens"]
    math_only = [s.family for s in iter_corpus(tmp_path, families=["math"])]
    assert math_only == ["math"] * stats["families"]["math"]["records"]
    from safetensors.torch import load_file

    assert load_file(str(tmp_path / "shard-00000.safetensors"))["tokens"].dtype == torch.uint16
    # a larger target continues where the corpus stopped
    more = run_corpus(
        config(tmp_path, tokens=400), "pacer corpus test", backend=fake_backend(), stream=stream, guard=guard
    )
    assert more["answer_tokens"] >= 400 and records(tmp_path)[: len(samples)] == [
        (s.id, s.family, s.position, s.tokens.tolist(), s.prompt_length) for s in samples
    ]


def test_resume_after_a_kill_has_no_duplicate_and_no_gap(tmp_path, stream):
    guard = BenchmarkGuard([])
    whole = tmp_path / "whole"
    run_corpus(config(whole), "pacer corpus test", backend=fake_backend(), stream=stream, guard=guard)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):  # killed in the third shard, at its fifth answer
        run_corpus(config(cut), "pacer corpus test", backend=fake_backend(fail_after=25), stream=stream, guard=guard)
    assert corpus_stats(cut)["shards"] == 2
    # a SIGKILL can leave a temporary file, and a finished shard the manifest did not record yet
    (cut / "shard-00002.safetensors.tmp").write_bytes(b"partial")
    manifest = (cut / "manifest.json").read_text()
    run_corpus(
        config(cut, tokens=corpus_stats(cut)["answer_tokens"] + 1),
        "pacer corpus test",
        backend=fake_backend(),
        stream=stream,
        guard=guard,
    )
    (cut / "manifest.json").write_text(manifest)  # the manifest update of shard 2 was lost
    (cut / "shard-00003.json").write_text("{}")  # and a later shard's JSON is incomplete
    run_corpus(config(cut), "pacer corpus test", backend=fake_backend(), stream=stream, guard=guard)
    assert not list(cut.glob("*.tmp"))
    assert records(cut) == records(whole)
    entries = json.loads((cut / "manifest.json").read_text())["shards"]
    assert [e["positions"] for e in entries] == [[10 * i, 10 * i + 10] for i in range(len(entries))]
    positions = [r[2] for r in records(cut)]
    assert positions == sorted(set(positions)) == list(range(positions[-1] + 1))


def test_a_corrupt_shard_is_refused_in_one_line(tmp_path, stream, capsys):
    run_corpus(
        config(tmp_path, tokens=60),
        "pacer corpus test",
        backend=fake_backend(),
        stream=stream,
        guard=BenchmarkGuard([]),
    )
    shard = tmp_path / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match="shard-00000.safetensors' does not match its sha256.*git checkout"):
        list(iter_corpus(tmp_path))
    capsys.readouterr()
    assert cli.main(["corpus", f"out={tmp_path}", "tokens=1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not match its sha256" in err


def test_a_corpus_continues_only_with_its_seed(tmp_path, stream):
    run_corpus(config(tmp_path, tokens=20), "t", backend=fake_backend(), stream=stream, guard=BenchmarkGuard([]))
    with pytest.raises(CorpusError, match="seed=0"):
        run_corpus(
            config(tmp_path, tokens=50, seed=1),
            "t",
            backend=fake_backend(),
            stream=Stream(1, stream.mat),
            guard=BenchmarkGuard([]),
        )
    with pytest.raises(CorpusError, match=r"made with families=\[\]: continue it with those"):
        run_corpus(
            config(tmp_path, tokens=50, families=["open_chat"]),
            "t",
            backend=fake_backend(),
            stream=Stream(0, stream.mat, families=["open_chat"]),
            guard=BenchmarkGuard([]),
        )


def test_an_open_chat_corpus_records_its_families_and_continues_only_with_them(tmp_path, stream):
    open_chat = Stream(0, stream.mat, families=["open_chat"])
    run_corpus(
        config(tmp_path, tokens=20, families=["open_chat"]),
        "t",
        backend=fake_backend(),
        stream=open_chat,
        guard=BenchmarkGuard([]),
    )
    assert {r[1] for r in records(tmp_path)} == {"open_chat"}
    assert corpus_stats(tmp_path)["stream"]["families"] == ["open_chat"]
    shard = json.loads(next(tmp_path.glob("shard-*.json")).read_text())
    assert shard["stream"]["families"] == ["open_chat"]
    with pytest.raises(CorpusError, match=r"made with families=\['open_chat'\]"):
        run_corpus(config(tmp_path, tokens=50), "t", backend=fake_backend(), stream=stream, guard=BenchmarkGuard([]))
    run_corpus(
        config(tmp_path, tokens=60, families=["open_chat"]),
        "t",
        backend=fake_backend(),
        stream=Stream(0, stream.mat, families=["open_chat"]),
        guard=BenchmarkGuard([]),
    )
    assert corpus_stats(tmp_path)["answer_tokens"] >= 60


# -- the command ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["tokens=0"], "tokens must be a positive integer"),
        (["batch_size=-2"], "batch_size must be a positive integer"),
        (["shard_size=100000"], "shard_size must be at most 10000"),
        (["dtype=int8"], "unknown dtype 'int8'"),
        (["colour=red"], "unknown option 'colour'"),
        (["tokens=many"], "tokens"),
        (["--stats", "out=NOPE"], "holds no corpus"),
        (["out=FILE"], "is a file"),
        (["families=[poetry]"], "give distinct names among chat"),
        (["families=[chat,chat]"], "give distinct names among chat"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "FILE").write_text("x")
    argv = [a.replace("NOPE", str(tmp_path / "nope")).replace("FILE", str(tmp_path / "FILE")) for a in argv]
    assert cli.main(["corpus", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacer: error: ") and err.count("\n") == 1 and message in err


def test_an_out_folder_that_cannot_be_written_is_refused_before_generating(tmp_path, capsys, monkeypatch):
    from pacer_train.corpus import command as corpus_command

    from helpers import bad_out_folders

    monkeypatch.setattr(corpus_command, "load_backend", lambda cfg: pytest.fail("the target loaded first"))
    for out in bad_out_folders(tmp_path):
        assert cli.main(["corpus", f"out={out}", "tokens=10"]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith("pacer: error: ") and err.count("\n") == 1 and f"'{out}'" in err, err


def test_stats_prints_the_totals_per_family(tmp_path, stream, capsys):
    run_corpus(config(tmp_path, tokens=40), "t", backend=fake_backend(), stream=stream, guard=BenchmarkGuard([]))
    capsys.readouterr()
    assert cli.main(["corpus", "--stats", f"out={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "target-written tokens" in out and all(f in out for f in ("chat", "math"))


@pytest.mark.parametrize(
    "name, text",
    [
        ("shard-00000.json", '{"records": [{"id": "chat/0"'),
        ("shard-00000.json", '{"records": 3}'),
        ("shard-00000.json", '{"records": [{"id": "chat/0"}]}'),
        ("manifest.json", "[1, 2]"),
    ],
)
def test_a_damaged_shard_or_manifest_json_is_one_line(tmp_path, stream, capsys, name, text):
    run_corpus(config(tmp_path, tokens=40), "t", backend=fake_backend(), stream=stream, guard=BenchmarkGuard([]))
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match="damaged; restore it"):
        list(iter_corpus(tmp_path))
    capsys.readouterr()
    assert cli.main(["corpus", "--stats", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacer: error: ") and err.count("\n") == 1 and f"'{tmp_path / name}'" in err, err


def test_the_stream_still_makes_the_committed_open_chat_corpus(stream):
    """Every record of plugins/eagle/corpus-open is the instruction its stream position gives
    (id and text digest): a change to the open_chat family that would silently rewrite the corpus's
    provenance fails here."""
    root = Path(__file__).resolve().parents[1] / "plugins" / "eagle" / "corpus-open"
    open_chat = Stream(0, stream.mat, families=["open_chat"])
    records = [r for shard in sorted(root.glob("shard-*.json")) for r in json.loads(shard.read_text())["records"]]
    assert len(records) >= 1000
    for r in records:
        item = open_chat.at(r["position"])
        assert (item.id, item.sha) == (r["id"], r["sha"]), r["id"]


@pytest.mark.parametrize("folder, families", [("corpus", set(FAMILIES)), ("corpus-open", {"open_chat"})])
def test_the_committed_corpus_is_intact_counted_and_never_a_benchmark_prompt(folder, families):
    """The corpora the repository carries (plugins/eagle/corpus, and corpus-open of open-ended
    chat only): every shard's sha256 matches the manifest, the totals are the records', and no prompt
    the target answered overlaps a benchmark prompt (the guard, run again on the decoded prompts)."""
    from tokenizers import Tokenizer

    root = Path(__file__).resolve().parents[1] / "plugins" / "eagle"
    stats = corpus_stats(root / folder)
    samples = list(iter_corpus(root / folder))  # checks each shard's sha256 first
    assert {s.family for s in samples} == families
    assert stats["stream"].get("families", sorted(FAMILIES)) == sorted(families)
    assert stats["shards"] >= 1 and stats["positions"] == 128 * stats["shards"]
    assert len(samples) == stats["records"] and stats["target"]["digest"] == "b179c9523d0e6a0f"
    assert sum(len(s.tokens) - s.prompt_length for s in samples) == stats["answer_tokens"]
    assert Counter(s.family for s in samples) == {f: t["records"] for f, t in stats["families"].items()}
    tokenizer = Tokenizer.from_file(str(root / "default" / "tokenizer.json"))  # the target's tokenizer
    guard = BenchmarkGuard.from_benchmarks()
    for sample in samples:
        prompt = tokenizer.decode(sample.tokens[: sample.prompt_length].tolist())
        assert guard.refuses(prompt) is None, sample.id

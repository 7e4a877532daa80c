"""Corpus-making for the trainers: what ``pacer distill`` and ``pacer train-preverify`` read to
build their training text, and the self-distillation corpus ``pacer corpus`` grows (docs/corpus.md).

- ``sources``: distill's text sources (the standard-library source, documentation prose) and the
  record of what was read.
- ``instructions``: the instructions distill's target answers (code, explanations, math).
- ``stream``: a deterministic, seeded stream of instructions in five families (chat, code writing,
  code editing, math word problems, documentation summaries) built from material that ships with
  Python; every instruction has a stable id (``family/index``) and a stream position.
- ``guard``: refuses any instruction that overlaps a benchmark prompt by a long word n-gram.
- ``generate``: batched greedy answers (left padding, finished rows dropped) and the throughput
  measurement behind the default batch size and dtype.
- ``shards``: the shard files (uint16 token ids + offsets, JSON provenance), the manifest, the
  resumable writer and ``iter_corpus``, the loader trainers use.
- ``command``: ``pacer corpus``.
- ``loaders``: a corpus as documents of token ids (``shipped``, a corpus folder, a ``.json`` of ids
  or a text file): what the ``datastore`` drafter searches and the corpus prior counts.
- ``prior``: the corpus prior's successor table and default bias, shared by the drafters that apply it
  (``eagle``, ``dflash``, ``pard``).
"""

from .shards import CorpusError, Sample, corpus_stats, iter_corpus

__all__ = ["CorpusError", "Sample", "corpus_stats", "iter_corpus"]

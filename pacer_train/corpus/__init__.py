"""Corpus-making for the trainers: what ``pacer distill`` and ``pacer train-preverify`` read to
build their training text (``sources``: the standard-library source, documentation prose and the
record of what was read)."""

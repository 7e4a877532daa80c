"""PACER (arXiv 2602.01274): the ``pacer`` stop policy and ``pacer train-preverify`` (docs/pacer.md)."""

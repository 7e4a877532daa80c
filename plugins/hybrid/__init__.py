"""The ``hybrid`` drafter: one token tree from several draft sources (docs/trees.md)."""

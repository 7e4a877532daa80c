"""Feature-level draft (EAGLE-style) for a target: the ``eagle`` drafter and ``pacer distill``."""

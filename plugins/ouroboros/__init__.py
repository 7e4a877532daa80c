"""Ouroboros (Zhao et al., EMNLP 2024, arXiv 2402.13720): training-free phrase drafting.

``pacer_plugins.ouroboros.pool`` holds the phrase pool (pure Python); ``pacer_plugins.ouroboros.plugin``
the ``ouroboros`` drafter component (entry point ``ouroboros = "pacer_plugins.ouroboros.plugin"``).
See docs/ouroboros.md.
"""

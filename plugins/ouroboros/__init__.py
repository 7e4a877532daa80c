"""Ouroboros (Zhao et al., EMNLP 2024, arXiv 2402.13720): training-free phrase drafting.

``ouroboros.pool`` holds the phrase pool (pure Python); ``ouroboros.plugin`` the ``ouroboros``
drafter component (entry point ``ouroboros = "ouroboros.plugin"``). See docs/ouroboros.md.
"""

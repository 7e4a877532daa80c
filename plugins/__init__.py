"""The plugins shipped with PACER-SD, installed as the package ``pacer_plugins`` (this folder, plugins/):
``pacer_plugins.pacer_builtins`` (the built-in drafters, stops, verifiers, observers),
``eagle`` (``eagle``), ``pacer_stop`` (``pacer``), ``entropy_stop``, ``ouroboros``, ``datastore``
and ``hybrid``. Each registers through the ``pacer_sd`` entry points in pyproject.toml and depends only on
``pacer_core`` and ``pacer_train``, never on another plugin (tests/test_layout.py); YAML names them by their
components' names (``eagle``, ``pacer``, ...), not by package. See docs/writing-plugins.md.
"""

"""The ``datastore`` drafter: continuations retrieved by exact suffix match from this generation's
tokens, earlier generations (kept in memory and, with ``path``, in a file) and a corpus.

``pacer_plugins.datastore.index`` holds the n-gram index and the ranking of continuations (numpy,
no models); ``pacer_plugins.datastore.store`` the file format; ``pacer_plugins.datastore.plugin``
the component. See docs/config.md and docs/trees.md.
"""

"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class PacerError(Exception):
    """A problem with the user's input: the message names the problem and the fix, on one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


class ConfigError(PacerError):
    """The configuration (YAML, overrides, plugin names or options) is invalid."""


class UnknownHookError(ConfigError):
    """A plugin implements a ``pacer_*`` hook that does not exist (a misspelled name): the message
    names the plugin, the hook and the closest real one; nothing else about the run is wrong."""


class InputError(PacerError):
    """A prompt, budget or model pairing cannot be decoded."""


class PluginError(PacerError):
    """A plugin broke a hook's contract (a wrong return, an exception of its own): the message names
    the plugin, the hook and what it should do instead (``pacer_core.hookcheck``)."""

"""The ``pacer`` command line: ``generate``, ``plugins``, ``validate``; every other command plugs in
through the ``pacer_sd.commands`` entry-point group (the command API: pacer_core/commands.py).

Each command is a function decorated with ``@command(name, help)`` that receives its argparse
subparser to declare its arguments, and returns the function that runs it (``run(args) -> int``).
User errors (``PacerError`` and the config parsers' errors) print as one line,
``pacer: error: <message>``, and exit with code 2; there is never a traceback for them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, cast

import attrs

from .commands import COMMAND_GROUP, COMMANDS, EXIT_INTERRUPTED, EXIT_USAGE, Runner, command
from .config import RunPlan, load_config, load_plan
from .errors import InputError, PacerError
from .hookspecs import hookimpl
from .hostmemory import reuse_freed_memory
from .jsonfile import MAX_LINE_BYTES, read_bytes, size_text
from .registry import components, new_plugin_manager

PROG = "pacer"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (``pacer: error: ...``) with exit code 2."""

    def error(self, message: str):
        raise _UsageError(f"{message}; see `{self.prog} --help`")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, except that ``key=value`` overrides may stand anywhere on the line
        (``generate target.path=X --prompt P --json a=b``): argparse gives a ``nargs="*"`` positional
        only one run of words, so the words after a later option are collected here, in order."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras and hasattr(parsed, "overrides") and not any(word.startswith("-") for word in extras):
            parsed.overrides = [*(parsed.overrides or []), *extras]
        elif extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


class _UsageError(Exception):
    pass


def build_engine(plan: RunPlan):
    """The engine of ``plan``: loads its models and builds its stack on the plan's plugin manager.
    Tests replace this function to inject tiny models."""
    from .engine import Engine

    return Engine.from_plan(plan)


# -- generate ----------------------------------------------------------------------------------
class StreamPrinter:
    """An observer printing the generated text as steps commit.

    It decodes all new tokens after every step and writes the new suffix of the text, holding back
    a trailing U+FFFD (an incomplete multi-byte character) until the next step completes it.
    """

    def __init__(self, tokenizer: Any, out=None):
        self.tokenizer = tokenizer
        self.out = out if out is not None else sys.stdout
        self.printed = ""

    def _write(self, text: str) -> None:
        if text.startswith(self.printed) and len(text) > len(self.printed):
            self.out.write(text[len(self.printed) :])
            self.out.flush()
            self.printed = text

    @hookimpl
    def pacer_start(self, state) -> None:
        self.printed = ""

    @hookimpl
    def pacer_observe_step(self, state, step) -> None:
        self._write(self.tokenizer.decode(state.new_tokens).rstrip("\ufffd"))

    def finish(self, text: str) -> None:
        """Write whatever the steps did not (the final text decides)."""
        if text.startswith(self.printed):
            self._write(text)
        else:  # decoding was not prefix-stable: never lose text, even if some repeats
            self.out.write(text[len(os.path.commonprefix([text, self.printed])) :])
        self.out.write("\n")
        self.out.flush()


_RECODE = "e.g. with iconv -f latin1 -t utf-8"
MAX_PROMPT_BYTES = MAX_LINE_BYTES  # a prompt file or stdin: over a million tokens, more than any context


def _not_utf8(source: str, data: bytes, exc: UnicodeDecodeError, fix: str) -> InputError:
    return InputError(f"{source} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}): {fix}")


def _text(data: bytes) -> str:
    """UTF-8 bytes as text with universal newlines (as reading a file in text mode gives)."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def _read_prompt(args: argparse.Namespace) -> str:
    """The prompt text of ``--prompt``, ``--prompt-file PATH`` or ``--prompt-file -`` (stdin), as
    UTF-8 text; ``InputError`` in one line for a missing or unreadable source, bytes that are not
    UTF-8, or an empty prompt."""
    if args.prompt_file is None:
        prompt = args.prompt
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:  # undecodable argv bytes arrive as lone surrogates
            code = ord(prompt[exc.start])
            what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
            raise InputError(
                f"the --prompt text is not UTF-8 ({what} at character {exc.start}): give UTF-8 text, "
                f"or convert it into a file ({_RECODE}) and pass --prompt-file"
            ) from None
    elif args.prompt_file == "-":
        stream = sys.stdin
        if stream is None:
            raise InputError("--prompt-file - reads stdin, which is closed: pipe the prompt in, or give --prompt")
        data = (
            stream.buffer.read(MAX_PROMPT_BYTES + 1)
            if hasattr(stream, "buffer")
            else stream.read(MAX_PROMPT_BYTES + 1).encode("utf-8", "surrogateescape")
        )
        if len(data) > MAX_PROMPT_BYTES:
            raise InputError(
                f"the prompt on stdin is longer than {size_text(MAX_PROMPT_BYTES)}, more than any "
                "model's context: pipe a shorter prompt"
            )
        try:
            prompt = _text(data)
        except UnicodeDecodeError as exc:
            raise _not_utf8("the prompt on stdin", data, exc, f"pipe UTF-8 text ({_RECODE})") from None
    else:
        path = Path(args.prompt_file)
        fix = "give the path of a text file (or - for stdin)"
        if not path.exists():
            raise InputError(f"prompt file '{path}' does not exist: {fix}")
        if path.is_dir():
            raise InputError(f"prompt file '{path}' is a folder, not a file: {fix}")
        # a regular file, a pipe (<(...)) or a device such as /dev/stdin, never read past the bound
        data = read_bytes(path, "prompt file", fix, limit=MAX_PROMPT_BYTES, pipes=True)
        try:
            prompt = _text(data)
        except UnicodeDecodeError as exc:
            raise _not_utf8(f"prompt file '{path}'", data, exc, f"save it as UTF-8 ({_RECODE})") from None
    if not prompt.strip():
        raise InputError("the prompt is empty: give some text with --prompt or --prompt-file")
    return prompt


def _summary(result) -> str:
    m = result.metrics
    return (
        f"{len(result.tokens)} tokens in {m.get('wall_s', 0.0):.2f} s ({m.get('tokens_per_s', 0.0):.1f} tokens/s), "
        f"steps {m.get('steps', '?')}, tau {m.get('mean_accepted_length', 0.0):.2f}, "
        f"acceptance {100 * m.get('acceptance_rate', 0.0):.1f}% ({m.get('accepted', 0)}/{m.get('drafted', 0)}), "
        f"target forwards {m.get('target_forwards', '?')}, finish {result.finish_reason}"
    )


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # tensors, numpy values
        return value.tolist()
    if attrs.has(type(value)):
        return attrs.asdict(value)
    return str(value)


@command("generate", "generate text for one prompt with a strategy stack")
def _setup_generate(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--config", "-c", metavar="YAML", help="config file (defaults apply to keys it omits)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", "-p", help="the prompt text")
    source.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a file (- for stdin)")
    p.add_argument("--max-new-tokens", "-n", type=int, metavar="N", help="token budget (generation.max_new_tokens)")
    p.add_argument("--seed", type=int, metavar="S", help="random seed (sampling.seed)")
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="encode the prompt as plain text (generation.chat_template=false)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object: text, tokens, metrics")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. strategy.stop.0.gamma=6 sampling.temperature=0.7",
    )

    def run(args: argparse.Namespace) -> int:
        overrides = list(args.overrides)  # explicit flags below win over the dotlist
        if args.max_new_tokens is not None:
            overrides.append(f"generation.max_new_tokens={args.max_new_tokens}")
        if args.seed is not None:
            overrides.append(f"sampling.seed={args.seed}")
        if args.no_chat_template:
            overrides.append("generation.chat_template=false")
        # the whole config validated, its stack resolved once, before any model loads; the summary
        # and --json read the step metrics
        plan = load_plan(args.config, overrides, step_metrics=True)
        prompt = _read_prompt(args)
        engine = build_engine(plan)
        printer = None
        if not args.json:
            printer = StreamPrinter(engine.tokenizer)
            engine.pm.register(printer, name="cli:stream")
        result = engine.generate(prompt)
        text = result.text if result.text is not None else ""
        if args.json:
            payload = {
                "text": text,
                "tokens": list(result.tokens),
                "finish_reason": result.finish_reason,
                "metrics": result.metrics,
            }
            print(json.dumps(payload, default=_json_default))
        else:
            cast(StreamPrinter, printer).finish(text)  # made when not --json
            print(_summary(result), file=sys.stderr)
        return 0

    return run


# -- plugins -----------------------------------------------------------------------------------
def type_name(hint: Any) -> str:
    """An option's type as its config class writes it: ``float``, ``Optional[float]``, ``List[int]``
    (a class by its name, not ``<class 'float'>``; a string annotation as written)."""
    if isinstance(hint, str):
        return hint
    if isinstance(hint, type) and not getattr(hint, "__args__", None):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def _options(config_cls: type) -> list[dict[str, Any]]:
    options = []
    for field in attrs.fields(config_cls):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        options.append({"name": field.name, "type": type_name(field.type), "default": default})
    return options


_SECTIONS = {
    "drafter": "strategy.drafter",
    "stop": "strategy.stop (a list)",
    "verifier": "strategy.verifier",
    "observer": "strategy.observers (a list)",
}


@command("plugins", "list the installed strategies by kind, with their options and defaults")
def _setup_plugins(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("--json", action="store_true", help="print the list as JSON")

    def run(args: argparse.Namespace) -> int:
        from .registry import KINDS

        table = components(new_plugin_manager())
        listing: dict[str, list[dict[str, Any]]] = {
            kind: [
                {
                    "name": c.name,
                    "description": c.description,
                    "options": _options(c.config),
                    "needs": sorted(c.needs),
                    "provides": sorted(c.provides),
                }
                for c in sorted(table[kind].values(), key=lambda c: c.name)
            ]
            for kind in KINDS
        }
        if args.json:
            print(json.dumps(listing, default=_json_default, indent=2))
            return 0
        lines = []
        for kind in KINDS:
            lines.append(f"{kind}s ({_SECTIONS[kind]}):")
            for item in listing[kind] or [
                {"name": "(none installed)", "description": "", "options": [], "needs": [], "provides": []}
            ]:
                caps = [f"{word}: {', '.join(item[word])}" for word in ("needs", "provides") if item[word]]
                caps_text = f" [{'; '.join(caps)}]" if caps else ""
                lines.append(f"  {item['name']}: {item['description']}{caps_text}")
                for option in item["options"]:
                    lines.append(f"      {option['name']}: {option['type']} = {option['default']!r}")
            lines.append("")
        print("\n".join(lines).rstrip())
        return 0

    return run


# -- validate ----------------------------------------------------------------------------------
def split_overrides(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """(files, overrides) of ``validate``'s words: a ``key=value`` word whose key is a dotted config
    key (``strategy.stop.0.gamma=6``) and that names no existing file is an override."""
    files: list[str] = []
    overrides: list[str] = []
    for word in words:
        key = word.split("=", 1)[0]
        is_override = "=" in word and re.fullmatch(r"[A-Za-z_][\w.\[\]-]*", key) and not Path(word).exists()
        (overrides if is_override else files).append(word)
    return files, overrides


@command("validate", "check config files (names, options, types) without loading any model")
def _setup_validate(p: argparse.ArgumentParser) -> Runner:
    p.add_argument(
        "configs",
        nargs="*",
        metavar="CONFIG",
        help="YAML files to check, and key=value overrides applied to each (e.g. strategy.stop.0.gamma=6); "
        "overrides alone check the defaults with them",
    )

    def run(args: argparse.Namespace) -> int:
        files, overrides = split_overrides([*args.configs, *getattr(args, "overrides", [])])
        if not files and not overrides:
            raise InputError(
                "validate needs a config file or key=value overrides, e.g. "
                "`pacer validate configs/pacer.yaml strategy.stop.0.b=2`"
            )
        failed = 0
        paths: list[Optional[str]] = [*files] or [None]  # None: the defaults
        for path in paths:
            where = path if path is not None else "the defaults"
            try:
                load_config(path, overrides)
            except PacerError as exc:
                failed += 1
                _error(str(exc))
            else:
                print(f"ok: {where}" + (f" with {' '.join(overrides)}" if overrides else ""))
        return EXIT_USAGE if failed else 0

    return run


# -- entry point -------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    """The parser of every command: this module's, then those of the modules registered under the
    ``pacer_sd.commands`` entry-point group (the bench's, the trainers', any plugin's)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=COMMAND_GROUP):
        entry.load()
    parser = _Parser(prog=PROG, description="PACER-SD: lossless speculative decoding with plugin strategies.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_text, setup) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(run=setup(p))
    return parser


def _error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``pacer`` command line; returns the exit code."""
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    parser = make_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            raise _UsageError(f"choose a command: {', '.join(COMMANDS)}; see `{PROG} --help`")
        reuse_freed_memory()  # before any model loads: a step's large buffers reuse memory (hostmemory.py)
        return args.run(args)
    except SystemExit as exc:
        if args is None:  # argparse: --help (0) or a usage error (2)
            return exc.code if isinstance(exc.code, int) else 0
        # raised while the command ran (a plugin's sys.exit): it did not finish, so never exit 0
        _error(
            f"the command stopped early: something it ran (a plugin?) raised SystemExit({exc.code!r}); "
            "its work is incomplete"
        )
        return exc.code if isinstance(exc.code, int) and exc.code != 0 else 1
    except (_UsageError, PacerError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except (OmegaConfBaseException, YAMLError) as exc:
        _error(f"invalid configuration: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
        return EXIT_USAGE
    except FileNotFoundError as exc:
        _error(f"file not found: {exc.filename or exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `pacer generate ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:  # a file or folder the command could not read or write (a folder, no permission, ...)
        where = f" '{exc.filename}'" if exc.filename else ""
        _error(f"cannot use{where}: {exc.strerror or type(exc).__name__}; check the path and its permissions")
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

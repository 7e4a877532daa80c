"""Config files as schemas: the hardened YAML reader, ``key=value`` overrides and typed validation.

Every YAML config is read and validated here: the run config (pacer_core/config.py), and through
``load_schema`` the bench and ablation YAML (pacer_bench/config.py) and the training commands'
configs, each an attrs class. ``read_yaml`` refuses duplicate keys and alias bombs with the line;
``apply_override`` edits a loaded tree with one ``key=value`` (the value read as YAML by
``parse_value``); ``validate_typed`` merges plain data over an attrs class's defaults in OmegaConf
struct mode, so an unknown option lists the valid ones (``unknown option 'x'; valid options: ...``,
at any depth: nested config classes, mappings of them), an option given as the wrong kind of value
says what it must be (a mapping of options, a list, a mapping), and NaN and infinite numbers are
refused. Every problem is a one-line ``ConfigError``.
"""

from __future__ import annotations

import math
import re
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import attrs
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError
from .jsonfile import MAX_DEPTH, nesting_depth, read_bytes, too_deep


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none). An exception
    raised with several arguments (attrs' validators add the attribute, the options and the value)
    gives its first, the message."""
    args: tuple[Any, ...] = getattr(exc, "args", ())
    message = args[0] if len(args) > 1 and isinstance(args[0], str) else str(exc)
    text = message.strip().splitlines()
    return text[0] if text else type(exc).__name__


MAX_YAML_NODES = 100_000  # a config's tree, aliases expanded; real configs have a few hundred nodes


class _YAMLRefusal(Exception):
    """A YAML document the reader refuses (duplicate key, alias bomb): ``problem`` and its mark."""

    def __init__(self, problem: str, mark: Any = None):
        super().__init__(problem)
        self.problem, self.mark = problem, mark


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes of the tree ``root`` stands for once every alias is expanded, counted without expanding:
    an alias is the anchored node object itself, so each distinct node's size is computed once.
    Stops counting past ``limit``; a node containing itself (a recursive alias) is refused."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()  # the nodes being counted: the ancestors of the current one
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]

    def children(node: yaml.Node) -> list[yaml.Node]:
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    while stack:
        node, counted = stack.pop()
        key = id(node)
        if counted:
            on_path.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(child)] for child in children(node)))
            if sizes[key] > limit:
                return sizes[key]
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _YAMLRefusal(
                "an alias refers to a node that contains it (a recursive alias): remove the alias", node.start_mark
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children(node) if id(child) not in sizes)
    return sizes[id(root)]


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys in a mapping, nodes nested deeper than
    ``MAX_DEPTH`` and documents whose aliases expand to more than ``MAX_YAML_NODES`` nodes (checked
    on the composed node graph, before any expansion: the loaded tree is small, but turning it into
    an OmegaConf object expands it)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Nodes nested deeper than ``MAX_DEPTH`` are refused while composing, before the composer's
        recursion could end in a ``RecursionError``."""
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _YAMLRefusal(
                    f"it is nested more than {MAX_DEPTH} lists or mappings deep, deeper than a config goes: flatten it",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`: keys given beside it override the merged ones, as YAML says
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # unhashable: the base class reports it
                    continue
                if duplicate:
                    raise _YAMLRefusal(
                        f"duplicate key '{key}' (a later value would silently replace the earlier one): keep one",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise _YAMLRefusal(
                f"its aliases expand to more than {MAX_YAML_NODES} nodes (an alias bomb?); "
                "a config is refused before it is expanded: write it without nested aliases"
            )
        data = self.construct_document(node)
        if nesting_depth(data) > MAX_DEPTH:  # aliases inside aliases nest without nesting in the text
            raise _YAMLRefusal(
                f"its aliases nest more than {MAX_DEPTH} lists or mappings deep: write it without nested aliases"
            )
        return data


def _load_yaml(text: str) -> Any:
    """``text`` read by ``_ConfigLoader`` (raises ``yaml.YAMLError`` or ``_YAMLRefusal``)."""
    loader = _ConfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def parse_value(text: str, where: Optional[str] = None) -> Any:
    """The value of an override's right-hand side, read as YAML (plain text when it is not YAML).

    Duplicate keys and alias bombs are refused as in files (``ConfigError``; ``where`` names the
    override in the message)."""
    try:
        return _load_yaml(text) if text != "" else ""
    except yaml.YAMLError:
        return text
    except _YAMLRefusal as exc:
        raise ConfigError(f"{where or f'value {text!r}'}: {exc.problem}") from None


def load_yaml_file(path: Path, what: str, fix: str, error: type[Exception] = ConfigError) -> Any:
    """The data of the YAML (or JSON) file ``path``, read as every user-named file is
    (``pacer_core.jsonfile.read_bytes``: a regular file, bounded) by the hardened loader: a
    duplicate key, an alias bomb and nesting deeper than ``MAX_DEPTH`` are refused with the line.
    Every problem is one ``error`` line naming the file (a ``what``) and ``fix``."""
    data = read_bytes(path, what, fix, error=error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} '{path}' is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}): save it as UTF-8"
        ) from None
    try:
        return _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or one_line(exc)
        raise error(f"malformed YAML in '{path}'{_at(mark)}: {problem}; fix the file's syntax") from None
    except _YAMLRefusal as exc:
        raise error(f"'{path}'{_at(exc.mark)}: {exc.problem}") from None
    except RecursionError:  # a guard: compose_node refuses depth first
        raise error(too_deep(f"{what} '{path}'", "fix the file")) from None


def read_yaml(path: Path) -> DictConfig:
    """A YAML file holding a mapping, as an OmegaConf node; raises ``ConfigError`` in one line.

    Every YAML config is read here (run, bench and training configs), by ``load_yaml_file``."""
    loaded = load_yaml_file(path, "config file", "give the path of a YAML file")
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"'{path}' must hold a mapping of sections, not a {type(loaded).__name__}: fix the file")
    return OmegaConf.create(loaded)


_ABSENT = object()


def _seed_defaults(cfg: DictConfig, parts: list[str], defaults: Mapping[str, Any]) -> None:
    """Copy from ``defaults`` the default of the first container an override reaches that ``cfg`` lacks.

    So, for the run config, ``strategy.stop.0.gamma=7`` edits the default stop list (and
    ``strategy.drafter.x=1`` the default drafter) when the YAML does not set ``strategy.stop``
    (``strategy.drafter``).
    """
    default: Any = defaults
    for i, part in enumerate(parts[:-1]):
        if isinstance(default, dict) and part in default:
            default = default[part]
        elif isinstance(default, list) and part.isdigit() and int(part) < len(default):
            default = default[int(part)]
        else:
            return
        if not isinstance(default, (dict, list)):
            return
        prefix = ".".join(parts[: i + 1])
        if OmegaConf.select(cfg, prefix, default=_ABSENT) is _ABSENT:
            OmegaConf.update(cfg, prefix, default, merge=False)
            return


RUN_EXAMPLE = "strategy.stop.0.gamma=3"  # an override of the run config, shown in messages


def apply_override(
    cfg: DictConfig, override: str, defaults: Optional[Mapping[str, Any]] = None, example: str = RUN_EXAMPLE
) -> None:
    """Apply one ``key=value`` override to ``cfg`` in place (``ConfigError`` in one line). With
    ``defaults`` (the schema's defaults as plain data), a list or mapping the override reaches but
    ``cfg`` lacks is first copied from them, so an index or key into a default is edited.
    ``example``: an override of this config, shown in messages."""
    if "=" not in override:
        raise ConfigError(f"override '{override}' is not key=value (e.g. {example})")
    key, value = override.split("=", 1)
    key = re.sub(r"\[(-?\d+)\]", r".\1", key.strip())
    negative = next((part for part in key.split(".") if re.fullmatch(r"-\d+", part)), None)
    if negative is not None:  # OmegaConf would count it from the end and silently edit another item
        first = ".".join("0" if part == negative else part for part in key.split("."))
        raise ConfigError(
            f"override '{override}': list index {negative} is negative; indices count from 0 "
            f"({first}={value} is the first item)"
        )
    if defaults is not None:
        _seed_defaults(cfg, key.split("."), defaults)
    parsed = parse_value(value, where=f"override '{override}'")
    # a whole strategy entry ({name: ...}) replaces the old one; options of another plugin would not fit
    merge = not (isinstance(parsed, dict) and "name" in parsed)
    try:
        OmegaConf.update(cfg, key, parsed, merge=merge)
    except (OmegaConfBaseException, ValueError, IndexError, KeyError) as exc:
        raise ConfigError(f"override '{override}': {one_line(exc)}") from None


def _non_finite(value: Any, path: str = "") -> Optional[tuple[str, float]]:
    """The first float that is NaN or infinite in ``value`` (an attrs object, or dicts and lists of
    them, searched recursively), as ``(dotted path, value)``; None when every number is finite."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if attrs.has(type(value)):
        items = [(f.name, getattr(value, f.name)) for f in attrs.fields(type(value))]
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None
    for name, item in items:
        found = _non_finite(item, f"{path}.{name}" if path else name)
        if found is not None:
            return found
    return None


def check_finite(value: Any, where: str) -> None:
    """Refuse NaN and infinite numbers anywhere in a validated config (``ConfigError``, one line):
    ``.nan`` and ``.inf`` are valid YAML floats, but no option means anything with them."""
    found = _non_finite(value)
    if found is not None:
        key, number = found
        raise ConfigError(f"{where}: '{key}' must be a finite number, got {number}")


@attrs.frozen
class _Shape:
    """What an option's value must be: a mapping of an attrs config class's options (``config``), a
    list, or a mapping whose values may have a shape of their own (``values``)."""

    kind: str  # "config" | "list" | "mapping"
    config: Optional[type] = None
    values: Optional["_Shape"] = None
    optional: bool = False  # None is allowed too


def _shape(hint: Any) -> Optional[_Shape]:
    """The shape of an option annotated ``hint`` (``TreeConfig``, ``Optional[List[int]]``,
    ``Dict[str, StackConfig]``); None for a scalar or an annotation of another kind."""
    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) != 1:
        return None
    kind, optional = kinds[0], type(None) in args
    origin = typing.get_origin(kind) or kind
    if isinstance(kind, type) and attrs.has(kind):
        return _Shape("config", config=kind, optional=optional)
    if origin is list:
        return _Shape("list", optional=optional)
    if origin is dict:
        values = typing.get_args(kind)[1:]
        return _Shape("mapping", values=_shape(values[0]) if values else None, optional=optional)
    return None


def config_class(hint: Any) -> Optional[type]:
    """The attrs config class an option annotated ``hint`` takes (``TreeConfig``,
    ``Optional[TreeConfig]``), else None."""
    shape = _shape(hint)
    return shape.config if shape is not None else None


def _option_shapes(schema_cls: type) -> dict[str, _Shape]:
    """The options of ``schema_cls`` whose values have a shape (``_shape``): name -> shape."""
    try:
        hints = typing.get_type_hints(schema_cls)
    except Exception:  # an annotation that does not resolve: OmegaConf reports it
        return {}
    shapes = {name: _shape(hint) for name, hint in hints.items()}
    return {name: shape for name, shape in shapes.items() if shape is not None}


def _got(value: Any) -> str:
    return f"got {type(value).__name__} {value!r:.80}"


def _check_shape(shape: _Shape, value: Any, where: str, path: str) -> None:
    """Refuse ``value`` (the option at dotted ``path``) unless it has ``shape``; a nested config is
    validated against its own class, so its errors name its options."""
    if value is None and shape.optional:
        return
    if shape.kind == "config" and shape.config is not None:  # a "config" shape always names its class
        if not isinstance(value, dict):
            fields = ", ".join(f.name for f in attrs.fields(shape.config))
            raise ConfigError(f"{where}: '{path}' must be a mapping of options ({fields}), {_got(value)}")
        validate_typed(shape.config, value, where, finite=False, prefix=f"{path}.")
    elif shape.kind == "list":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: '{path}' must be a list, {_got(value)}")
    elif not isinstance(value, dict):
        raise ConfigError(f"{where}: '{path}' must be a mapping, {_got(value)}")
    elif shape.values is not None:
        for key, item in value.items():
            _check_shape(shape.values, item, where, f"{path}.{key}")


def _open_mappings(node: DictConfig, schema_cls: type, data: dict, shapes: dict[str, _Shape]) -> None:
    """In ``node``, the struct-mode schema of ``schema_cls``, open each mapping that ``data`` gives
    (a strategy entry, a stack's inline section) to any key, replaced whole rather than merged; in
    nested configs too. Their keys are checked by their own schema (``_check_shape``, the resolver)."""
    try:
        defaults = schema_cls()
    except (TypeError, ValueError):  # a plugin config with required options
        defaults = None
    for name, value in data.items():
        shape = shapes.get(name)
        if not isinstance(value, dict):
            continue
        if shape is not None and shape.kind == "config" and shape.config is not None:
            if node[name] is None:  # an optional config left out by default: its defaults, to merge into
                node[name] = OmegaConf.structured(shape.config)
            _open_mappings(node[name], shape.config, value, _option_shapes(shape.config))
        elif (shape is not None and shape.kind == "mapping") or isinstance(getattr(defaults, name, None), dict):
            node[name] = {}
            OmegaConf.set_struct(node[name], False)


def validate_typed(schema_cls: type, data: Any, where: str, finite: bool = True, prefix: str = "") -> Any:
    """``data`` merged over ``schema_cls``'s defaults in struct mode, as an attrs object; with
    ``finite``, NaN and infinite numbers anywhere in it are refused too. An option whose type is an
    attrs class (or Optional of one) takes a mapping of that class's options, validated the same way
    (``prefix``: the dotted path of the option being validated, in messages)."""
    if not isinstance(data, dict):
        fields = ", ".join(f.name for f in attrs.fields(schema_cls))
        raise ConfigError(
            f"{where}: {f'{prefix[:-1]!r} ' if prefix else ''}must be a mapping of options ({fields}), {_got(data)}"
        )
    if finite:  # before the merge, so a validator's range message does not hide it
        check_finite(data, where)
    # each nested config, list and mapping first, so an error names the option and what it must be
    # (``where: unknown option 'tree.tpk'; valid options: topk, ...``, ``where: 'stop' must be a list, ...``)
    shapes = _option_shapes(schema_cls)
    for name, shape in shapes.items():
        if name in data:
            _check_shape(shape, data[name], where, f"{prefix}{name}")
    schema = OmegaConf.structured(schema_cls)
    OmegaConf.set_struct(schema, True)
    _open_mappings(schema, schema_cls, data, shapes)
    try:
        merged = OmegaConf.merge(schema, data)
        typed = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
        fields = ", ".join(f.name for f in attrs.fields(schema_cls))
        text = one_line(exc)
        if "Key" in type(exc).__name__ or "not in struct" in text:
            raise ConfigError(f"{where}: unknown option '{prefix}{key}'; valid options: {fields}") from None
        types = {f.name: f.type for f in attrs.fields(schema_cls)}
        expected = f"; give a value of type {types[key]}" if key in types else ""
        raise ConfigError(f"{where}: bad value for '{prefix}{key}': {text}{expected}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {prefix[:-1] + ': ' if prefix else ''}{one_line(exc)}") from None
    if finite:  # again after the merge: OmegaConf reads the text "nan" into a float field as NaN
        check_finite(typed, where)
    return typed


def override_list(overrides: Any) -> list[str]:
    """``overrides`` as a list of ``key=value`` strings; a lone string (which would be read one
    character at a time) or an item that is not a string is refused in one line."""
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(
            f"overrides must be a list of key=value strings, got a single {type(overrides).__name__} "
            f"{overrides!r}: pass [{overrides!r}]"
        )
    try:
        items = list(overrides)
    except TypeError:
        raise ConfigError(f"overrides must be a list of key=value strings, got {type(overrides).__name__}") from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ConfigError(f"overrides must be key=value strings: item {i} is {type(item).__name__} {item!r}")
    return items


def load_schema(
    schema_cls: type, path: Optional[str | Path], overrides: Sequence[str], where: str, example: str = RUN_EXAMPLE
) -> Any:
    """Any attrs config class (a training command's, the bench's) from a YAML file and ``key=value``
    overrides, validated in struct mode like the run config; raises ``ConfigError`` in one line,
    starting with ``where``. ``example``: an override of this config, shown in messages."""
    raw = read_yaml(Path(path)) if path else OmegaConf.create({})
    for override in override_list(overrides):
        try:
            apply_override(raw, override, example=example)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return validate_typed(schema_cls, OmegaConf.to_container(raw), where)

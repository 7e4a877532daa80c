"""The user documentation is kept true: hooks, options, examples and YAML are checked against the code.

Adding a hook, a value-object field or a plugin component without documenting it fails here.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import re
import shlex
import sys
import types
from pathlib import Path

import attrs
import pytest
import tomllib
import torch
import yaml

import pacer_core
from pacer_core import ConfigError, Engine, PacerConfig, hookimpl, hookspecs, load_config
from pacer_core.config import GenerationConfig, ModelConfig, SamplingConfig, StrategyConfig
from pacer_core.registry import KINDS, components, new_plugin_manager

from helpers import adapter, reference_greedy, tiny_llama

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = DOCS / "examples"
SECTIONS = {f.name for f in attrs.fields(PacerConfig)}
PAGES = sorted([*DOCS.glob("*.md"), *(DOCS / "lab").glob("*.md")])  # the reference pages and the lab notebooks


def read(name: str) -> str:
    return (DOCS / name).read_text()


def section(text: str, heading: str) -> str:
    """The text under the first heading line equal to ``heading``, up to the next heading of the
    same or a higher level."""
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    assert heading in lines, f"missing heading {heading!r}"
    start = lines.index(heading) + 1
    end = start
    while end < len(lines):
        match = re.match(r"(#+) ", lines[end])
        if match and len(match.group(1)) <= level:
            break
        end += 1
    return "\n".join(lines[start:end])


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def table_rows(text: str) -> list[list[str]]:
    """Body rows of the markdown tables in ``text``, as cells (header and rule rows skipped)."""
    rows = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        if i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: ") and lines[i + 1].startswith("|"):
            continue  # a header row
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def render(value) -> str:
    """A default value as the docs write it: YAML scalars, flow-style containers."""
    if value is None:
        return "null"
    if attrs.has(type(value)):  # a nested section: its options as a flow mapping
        value = attrs.asdict(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def assert_options_documented(text: str, config_cls: type, where: str) -> None:
    """Each field of ``config_cls`` has a row ``| `name` | ... | `default` |``; no stale rows."""
    defaults = config_cls()
    rows = {spans(r[0])[0]: r for r in table_rows(text) if spans(r[0])}
    names = [f.name for f in attrs.fields(config_cls)]
    for name in names:
        assert name in rows, f"{where}: option '{name}' is not documented"
        expected = f"`{render(getattr(defaults, name))}`"
        assert expected in rows[name], f"{where}: option '{name}' should show default {expected}: {rows[name]}"
    stale = set(rows) - set(names)
    assert not stale, f"{where}: documented options that do not exist: {sorted(stale)}"
    if not names:
        assert "No options." in text, f"{where}: say 'No options.'"


@pytest.fixture(scope="module")
def example_plugin():
    spec = importlib.util.spec_from_file_location("my_stop_plugin", EXAMPLES / "my_stop_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- hooks.md ----------------------------------------------------------------------------------
HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("pacer_"))


def _strip_quotes(annotation) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    while len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text


def test_hookspecs_are_found():
    assert {"pacer_components", "pacer_draft_more", "pacer_propose", "pacer_verify"} <= set(HOOKS)


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_is_documented_with_its_exact_signature(name):
    """Like datasette's test: a heading ``### `hook(arg, ...)` `` and the typed ``def`` line."""
    hooks_md = read("hooks.md")
    signature = inspect.signature(getattr(hookspecs, name))
    params = signature.parameters.values()
    heading = f"### `{name}({', '.join(p.name for p in params)})`"
    body = section(hooks_md, heading)
    typed = ", ".join(f"{p.name}: {_strip_quotes(p.annotation)}" for p in params)
    assert f"def {name}({typed}) -> {_strip_quotes(signature.return_annotation)}" in body
    firstresult = getattr(hookspecs, name).pacer_sd_spec["firstresult"]
    assert f"**firstresult**: {'yes' if firstresult else 'no'}" in body


def test_no_documented_hook_is_missing_from_hookspecs():
    documented = re.findall(r"^### `(pacer_\w+)\(", read("hooks.md"), flags=re.M)
    assert sorted(documented) == HOOKS


@pytest.mark.parametrize(
    "cls",
    [
        pacer_core.DraftBlock,
        pacer_core.Draft,
        pacer_core.Stop,
        pacer_core.Verdict,
        pacer_core.StepRecord,
        pacer_core.DecodeState,
        pacer_core.SamplingParams,
        pacer_core.GenerationResult,
        pacer_core.Component,
        pacer_core.Resources,
        pacer_core.DraftInfo,
    ],
    ids=lambda c: c.__name__,
)
def test_value_object_fields_are_documented(cls):
    body = section(read("hooks.md"), f"### `{cls.__name__}`")
    rows = {spans(r[0])[0] for r in table_rows(body) if spans(r[0])}
    fields = {f.alias for f in attrs.fields(cls)}  # a private field is documented by its init name
    # public derived views (properties; attrs turns cached properties into slots), e.g. Draft.tokens,
    # its own or a base's (DraftBlock's row-table views)
    derived = {
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if not name.startswith("_")
        and isinstance(value, (property, functools.cached_property, types.MemberDescriptorType))
    }
    assert fields - rows == set(), f"{cls.__name__}: undocumented fields"
    assert rows - fields - derived == set(), f"{cls.__name__}: documented fields that do not exist"


def test_capabilities_are_documented():
    from pacer_core.registry import CAPABILITIES

    rows = {spans(r[0])[0] for r in table_rows(section(read("hooks.md"), "### Capabilities")) if spans(r[0])}
    assert rows == set(CAPABILITIES)


# -- config.md ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,cls",
    [
        ("target", ModelConfig),
        ("sampling", SamplingConfig),
        ("generation", GenerationConfig),
        ("strategy", StrategyConfig),
    ],
)
def test_config_sections_are_documented(name, cls):
    assert_options_documented(section(read("config.md"), f"### `{name}`"), cls, name)


def test_skip_drafting_options_are_documented():
    from pacer_core.skipping import SkipConfig

    options = section(section(read("costs.md"), "## Skipping drafting"), "### Options")
    assert_options_documented(options, SkipConfig, "generation.skip_drafting")


@pytest.mark.parametrize(
    "heading,cls",
    [("#### `corpus`", "CorpusConfig"), ("#### `student`", "StudentConfig"), ("#### `train`", "TrainConfig")],
)
def test_distill_options_are_documented(heading, cls):
    from pacer_plugins.eagle import distill_config
    from pacer_train.corpus import sources

    options = section(read("config.md"), "## `pacer distill` options")
    schema = getattr(sources if cls == "CorpusConfig" else distill_config, cls)
    assert_options_documented(section(options, heading), schema, f"distill {heading}")


def test_distill_top_level_options_are_documented():
    from pacer_plugins.eagle.distill import DistillConfig

    table = section(section(read("config.md"), "## `pacer distill` options"), "#### `distill` (top level)")
    sections = {"corpus", "student", "train"}  # each its own table (test_distill_options_are_documented)
    assert_table_shows_defaults(table, DistillConfig, "distill", skip=sections)


def assert_table_shows_defaults(table: str, config_cls: type, where: str, skip: set = frozenset()) -> None:
    """A row per option of ``config_cls`` but ``skip``, each showing its default (sections excepted)."""
    rows = {spans(r[0])[0]: r for r in table_rows(table) if spans(r[0])}
    assert set(rows) == {f.name for f in attrs.fields(config_cls)} - set(skip)
    defaults = config_cls()
    for name, row in rows.items():
        value = getattr(defaults, name)
        if not attrs.has(type(value)):
            assert f"`{render(value)}`" in row, f"{where} option '{name}' should show default {render(value)}"


def test_draft_eval_options_are_documented():
    from pacer_plugins.eagle.agreement import DraftEvalConfig

    table = section(read("draft.md"), "### Measuring a draft in a minute: `pacer draft-eval`")
    assert_table_shows_defaults(table, DraftEvalConfig, "draft-eval")


def test_tree_options_and_their_defaults_are_documented():
    from pacer_core.trees import TreeConfig

    assert_table_shows_defaults(
        section(read("trees.md"), "## Tree drafters: `tree: {topk, depth, nodes}`"), TreeConfig, "tree"
    )
    d = TreeConfig()
    assert (d.nodes, d.budget("cpu"), d.budget("cuda")) == (None, 10, "auto")
    assert (
        read("config.md").count(f"`{{}}` = {d.topk}, {d.depth} and the device's budget: 10 on a CPU, `auto` elsewhere")
        == 2
    )  # both drafters


def test_corpus_totals_in_the_docs_are_the_committed_corpus():
    """corpus.md's "Committed so far" line names the committed corpus's shards, answers and tokens."""
    from pacer_train.corpus.shards import corpus_stats

    stats = corpus_stats(DOCS.parent / "plugins" / "eagle" / "corpus")
    line = next(p for p in read("corpus.md").split("\n\n") if p.startswith("**Committed so far:**"))
    for figure in (
        f"{stats['shards']} shards",
        f"{stats['records']:,} answers",
        f"{stats['answer_tokens']:,} answer tokens",
        f"{stats['tokens']:,} with their prompts",
        f"{stats['generation_hours']} hours",
    ):
        assert figure in " ".join(line.split()), f"corpus.md should say {figure!r}: update its 'Committed so far' line"


def test_the_shipped_drafts_figures_in_the_docs_are_its_manifests():
    """The held-out agreement and tokens seen that results.md and the draft's lab notebook give for the
    shipped `eagle` draft are the ones its manifest records."""
    import json

    from pacer_plugins.eagle.drafter import DEFAULT_DRAFT

    manifest = json.loads((DEFAULT_DRAFT / "manifest.json").read_text())
    held, tokens = manifest["heldout"], manifest["training"]["tokens_total"]
    first, second, both = (
        f"{held[k]:.3f}" for k in ("heldout_top1_first", "heldout_top1_second", "heldout_top1_first_two")
    )
    shipped = [row for row in table_rows(read("results.md")) if row[0] == "**v6 (shipped, `eagle`)**"]
    assert shipped and shipped[0][1:3] == [f"**{first}**", f"**{both}**"], "results.md: update the shipped draft's row"
    curve = [row for row in table_rows(read("lab/draft-training.md")) if row[0].startswith("**v6")]
    assert curve and curve[0][1:] == [f"**{tokens:,}**", f"**{first}**", f"**{second}**", f"**{both}**"], (
        "lab/draft-training.md: update the shipped draft's row of the continuing runs' table"
    )


def test_the_headline_figures_have_one_dated_source():
    """results.md opens with one table of the headline figures, each row dated, with the command that
    measured it and a link to the page holding the run; the README quotes no figure of its own."""
    rows = table_rows(section(read("results.md"), "## Headline results"))
    assert len(rows) >= 8
    for stack, _what, figure, date, command, details in rows:
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", date), f"results.md: {stack}: date {date!r}"
        assert figure and spans(command) and spans(command)[0].startswith("pacer "), f"results.md: {stack}"
        assert re.search(r"\]\([\w./-]+\.md#[\w-]+\)", details), f"results.md: {stack}: no link to its run"
    readme = (DOCS.parent / "README.md").read_text()
    assert not re.findall(r"\d\.\d+×", readme), "README.md: a figure belongs in docs/results.md's headline table"


def test_every_section_is_documented():
    config_md = read("config.md")
    for name in SECTIONS:
        assert f"### `{name}`" in config_md.splitlines()


def _installed():
    table = components(new_plugin_manager())
    return [(kind, name, table[kind][name]) for kind in KINDS for name in sorted(table[kind])]


@pytest.mark.parametrize("kind,name,component", _installed(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_installed_component_is_documented(kind, name, component):
    body = section(read("config.md"), f"#### `{name}` ({kind})")
    assert_options_documented(body, component.config, f"{kind} '{name}'")


def test_builtins_are_among_the_documented_components():
    names = {name for _, name, _ in _installed()}
    assert {
        "autoregressive",
        "draft_model",
        "prompt_lookup",
        "fixed",
        "heuristic",
        "greedy",
        "speculative_sampling",
        "metrics",
    } <= names


def test_the_written_out_defaults_are_the_defaults(tmp_path):
    block = next(b for b in code_blocks(read("config.md"), "yaml") if set(yaml.safe_load(b)) == SECTIONS)
    path = tmp_path / "defaults.yaml"
    path.write_text(block)
    assert load_config(path) == PacerConfig()


def test_documented_overrides_apply():
    rows = table_rows(section(read("config.md"), "## Overrides"))
    overrides = [spans(r[0])[0] for r in rows]
    assert len(overrides) >= 8
    for override in overrides:
        load_config(overrides=[override], require_models=False)
    assert load_config(overrides=["strategy.stop.0.gamma=3"]).strategy.stop == [{"name": "heuristic", "gamma": 3}]
    assert load_config(overrides=["strategy.stop[0].gamma=3"]).strategy.stop == [{"name": "heuristic", "gamma": 3}]
    assert load_config(overrides=["strategy.drafter.max_ngram_size=4"]).strategy.drafter == {
        "name": "prompt_lookup",
        "max_ngram_size": 4,
    }


def test_documented_validation_errors_are_the_real_messages():
    rows = table_rows(section(read("config.md"), "## Validation errors"))
    assert len(rows) >= 10
    for cells in rows:
        overrides, (message,) = spans(cells[0]), spans(cells[1])
        with pytest.raises(ConfigError) as caught:
            load_config(overrides=overrides)
        actual = str(caught.value)
        if "…" in message:
            assert actual.startswith(message.split("…")[0]), (overrides, actual)
        else:
            assert actual == message, overrides


# -- YAML in all docs --------------------------------------------------------------------------
def _yaml_configs():
    found = []
    for doc in PAGES:
        for block in code_blocks(doc.read_text(), "yaml"):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and set(data) & SECTIONS:  # looks like a config
                found.append((str(doc.relative_to(DOCS)), block, data))
    return found


def test_every_yaml_config_in_the_docs_validates(tmp_path, example_plugin):
    configs = _yaml_configs()
    assert len(configs) >= 5
    for i, (doc, block, data) in enumerate(configs):
        path = tmp_path / f"{i}.yaml"
        path.write_text(block)
        names_a_draft = bool((data.get("draft") or {}).get("path"))
        try:
            load_config(path, extra_plugins=[example_plugin], require_models=not names_a_draft)
        except ConfigError as exc:
            pytest.fail(f"{doc}: a YAML block does not validate: {exc}\n{block}")


# -- links and CLI lines -----------------------------------------------------------------------
def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_resolve():
    for doc in PAGES:
        for target in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", doc.read_text()):
            file, anchor = target
            linked = doc.parent / file if file else doc
            assert linked.exists(), f"{doc.name}: broken link to {file}"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), flags=re.M)
                assert anchor in {_slug(h) for h in headings}, f"{doc.name}: no anchor #{anchor} in {linked.name}"


def test_cli_lines_in_the_docs_parse():
    cli = pytest.importorskip("pacer_core.cli")
    lines = []
    for doc in PAGES:
        text = doc.read_text()
        lines += [s for s in re.findall(r"`(pacer [^`]+)`", text)]
        for block in code_blocks(text, "text"):
            lines += [line for line in block.splitlines() if line.startswith("pacer ")]
    assert any(line.startswith("pacer generate") for line in lines)
    for line in lines:
        argv = shlex.split(re.split(r"\s{2,}", line)[0])[1:]  # drop a trailing description
        try:
            cli.make_parser().parse_args(argv)
        except Exception as exc:  # noqa: BLE001 — the CLI's usage errors are private classes
            pytest.fail(f"documented command does not parse: {line!r}: {exc}")


# -- writing-plugins.md ------------------------------------------------------------------------
def test_the_example_files_are_included_verbatim():
    text = read("writing-plugins.md")
    for name in ("my_stop_plugin.py", "test_my_stop_plugin.py"):
        assert f"```python\n{(EXAMPLES / name).read_text()}```" in text, f"{name} differs from writing-plugins.md"


def test_the_example_pyproject_registers_the_module():
    (block,) = code_blocks(read("writing-plugins.md"), "toml")
    project = tomllib.loads(block)
    assert "my_stop_plugin" in project["project"]["entry-points"]["pacer_sd"].values()
    assert project["tool"]["setuptools"]["py-modules"] == ["my_stop_plugin"]


def test_the_example_plugin_validates_its_options(example_plugin):
    plugins = [example_plugin]
    drafter = "strategy.drafter={name: draft_model}"
    cfg = load_config(
        overrides=[drafter, "strategy.stop=[{name: prob_floor}]"], extra_plugins=plugins, require_models=False
    )
    assert cfg.strategy.stop == [{"name": "prob_floor"}]
    for bad, words in [
        ("{name: prob_floor, floor: high}", "floor"),
        ("{name: prob_floor, max_tokens: 0}", "max_tokens"),
        ("{name: prob_floor, flor: 0.3}", "unknown option 'flor'"),
    ]:
        with pytest.raises(ConfigError, match=words):
            load_config(overrides=[drafter, f"strategy.stop=[{bad}]"], extra_plugins=plugins, require_models=False)
    with pytest.raises(ConfigError, match="probabilities"):  # prompt_lookup has none
        load_config(overrides=["strategy.stop=[{name: prob_floor}]"], extra_plugins=plugins)


class StepLog:
    """Records each step's draft probabilities of the chosen tokens and the draft bound."""

    def __init__(self):
        self.steps = []

    @hookimpl
    def pacer_observe_step(self, state, step):
        draft = step.draft
        chosen = draft.draft_probs.gather(1, draft.tokens[:, None]).squeeze(1)  # [n]
        self.steps.append((chosen.tolist(), state.max_draft_tokens))


def test_the_example_plugin_shapes_drafts_and_keeps_greedy_output(example_plugin):
    target = tiny_llama(0, scale=32.0)  # peaky: draft probabilities spread over [0, 1]
    draft = copy.deepcopy(target)  # a perturbed copy: agrees often, not always
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=gen))
    prompt, budget, floor, max_tokens = [5, 9, 13, 5, 9, 21, 7], 40, 0.3, 6
    cfg = load_config(
        overrides=[
            "strategy.drafter={name: draft_model}",
            "strategy.verifier={name: greedy}",
            f"strategy.stop=[{{name: prob_floor, floor: {floor}, max_tokens: {max_tokens}}}]",
        ],
        extra_plugins=[example_plugin],
        require_models=False,
    )
    log = StepLog()
    engine = Engine.build(
        adapter(target, eos=False), draft=adapter(draft, eos=False), cfg=cfg, extra_plugins=[example_plugin, log]
    )
    result = engine.generate(prompt, max_new_tokens=budget)

    assert result.tokens == reference_greedy(target, prompt, budget, eos=False)
    stopped_low = 0
    for chosen, bound in log.steps:
        assert chosen, "the policy always lets at least one token be drafted"
        assert all(p >= floor for p in chosen[:-1]), "drafting went on after a low-probability token"
        low = chosen[-1] < floor
        assert low or len(chosen) in (max_tokens, bound), "drafting stopped without a reason"
        stopped_low += low and len(chosen) < max_tokens
    assert stopped_low >= 3, "the floor never cut a draft short: the test would not notice a no-op policy"
    assert len({len(chosen) for chosen, _ in log.steps}) >= 3  # draft lengths vary with the model


def test_the_documented_example_test_passes(monkeypatch, example_plugin):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setitem(sys.modules, "my_stop_plugin", example_plugin)
    spec = importlib.util.spec_from_file_location("test_my_stop_plugin", EXAMPLES / "test_my_stop_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_prob_floor_bounds_drafts_and_keeps_the_output()


# -- documented file, prompt and folder errors ----------------------------------------------------
def _matches(documented: str, actual: str) -> bool:
    """``documented`` with each ``…`` standing for any text equals ``actual``."""
    return re.fullmatch(".*".join(re.escape(part) for part in documented.split("…")), actual, flags=re.S) is not None


def _cli_error(argv: list[str], capsys) -> str:
    cli = pytest.importorskip("pacer_core.cli")
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("pacer: error: "), (argv, code, err)
    return lines[0][len("pacer: error: ") :]


def _assert_documented_errors(doc: str, heading: str, scenarios: dict, capsys) -> None:
    rows = table_rows(section(read(doc), heading))
    documented = {cells[0]: spans(cells[1])[0] for cells in rows}
    assert set(documented) == set(scenarios), f"{doc} {heading}: rows and scenarios differ"
    for key, message in documented.items():
        argv = scenarios[key]()
        if argv is None:  # not reproducible here (e.g. no read-only file system)
            continue
        actual = _cli_error(argv, capsys)
        assert _matches(message, actual), f"{doc}: {key}: documented {message!r}, actual {actual!r}"


def _never(*args, **kwargs):
    raise AssertionError("no model may load before these errors")


def test_documented_file_and_prompt_errors_are_the_real_messages(tmp_path, capsys, monkeypatch):
    import io

    from pacer_core import cli

    monkeypatch.setattr(cli, "build_engine", _never)
    latin1 = "caf\xe9 au lait".encode("latin-1")
    (tmp_path / "configs").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "latin1.txt").write_bytes(latin1)

    def stdin():
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(latin1), encoding="utf-8"))
        return ["generate", "--prompt-file", "-"]

    scenarios = {
        "`--config gone.yaml`": lambda: ["validate", str(tmp_path / "gone.yaml")],
        "`--config configs/` (a folder)": lambda: ["generate", "-p", "x", "--config", str(tmp_path / "configs")],
        "`--prompt-file gone.txt`": lambda: ["generate", "--prompt-file", str(tmp_path / "gone.txt")],
        "`--prompt-file notes/` (a folder)": lambda: ["generate", "--prompt-file", str(tmp_path / "notes")],
        "`--prompt-file latin1.txt`": lambda: ["generate", "--prompt-file", str(tmp_path / "latin1.txt")],
        "`--prompt-file -` with Latin-1 on stdin": stdin,
        "`--prompt` with Latin-1 bytes": lambda: ["generate", "--prompt", latin1.decode("utf-8", "surrogateescape")],
        '`--prompt " "`': lambda: ["generate", "--prompt", " "],
    }
    _assert_documented_errors("config.md", "## File and prompt errors", scenarios, capsys)


def test_documented_bench_errors_are_the_real_messages(tmp_path, capsys, monkeypatch):
    import json
    import os

    from pacer_bench import units

    monkeypatch.setattr(units, "load_models", _never)
    prompts = tmp_path / "prompts.jsonl"
    good_prompts = '{"prompt": "abc abc"}\n'
    (tmp_path / "results.txt").write_text("x")

    def bench(*extra: str, out: str = "out", lines: str = good_prompts) -> list[str]:
        if prompts.is_dir():
            prompts.rmdir()
        prompts.write_text(lines) if isinstance(lines, str) else prompts.write_bytes(lines)
        return ["bench", f"prompt_sets=[{prompts}]", "--out", str(tmp_path / out), *extra]

    def bench_yaml(text: str) -> list[str]:
        path = tmp_path / "bench.yaml"
        path.write_text(text)
        return ["bench", "--config", str(path), "--out", str(tmp_path / "out")]

    def prompt_folder() -> list[str]:
        argv = bench()
        prompts.unlink()
        prompts.mkdir()
        return argv

    def read_only():
        place = next((p for p in (Path("/proc/pacer-out"), Path("/sys/pacer-out")) if p.parent.is_dir()), None)
        if place is None and os.geteuid() != 0:
            place = tmp_path / "locked" / "out"
            place.parent.mkdir()
            place.parent.chmod(0o555)
        return None if place is None else bench(out=str(place))

    meta = {
        "version": 1,
        "settings": {},
        "baseline": "autoregressive",
        "prompt_sets": ["s"],
        "units": [{"name": "autoregressive", "kind": "stack", "config": {}}],
    }
    record = {
        "prompt_set": "s",
        "model_id": "autoregressive",
        "repeat": 0,
        "tokens": [5],
        "metrics": {},
        "choices": [
            {"turns": ["x"], "decoding_steps": [1], "new_tokens": [1], "wall_time": [0.1], "accept_lengths": [1]}
        ],
    }

    def run_folder(meta_text: str, answers: list[str] = (), cost: str = None) -> list[str]:
        folder = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
        folder.mkdir()
        (folder / "bench.json").write_text(meta_text)
        lines = answers or [json.dumps({**record, "question_id": f"q{i}"}) for i in range(6)]
        (folder / "answers.jsonl").write_text("".join(line + "\n" for line in lines))
        if cost is not None:
            (folder / "cost_model.json").write_text(cost)
        return ["report", str(folder), "--no-plots"]

    damaged = [json.dumps({**record, "question_id": f"q{i}"}) for i in range(6)]
    damaged[4] = damaged[4][:20]
    scenarios = {
        "`--out results.txt` (a file)": lambda: bench(out="results.txt"),
        "`--out /dev/null`": lambda: bench(out=os.devnull),
        "`--out results.txt/run`": lambda: bench(out="results.txt/run"),
        "`--out` on a read-only file system": read_only,
        "`target: 3`": lambda: bench_yaml("target: 3\n"),
        "`target: {pth: x}`": lambda: bench_yaml("target: {pth: x}\n"),
        "`stacks: [a, b]`": lambda: bench_yaml("stacks: [a, b]\n"),
        "a prompt file that does not exist": lambda: ["bench", f"prompt_sets=[{tmp_path / 'gone.jsonl'}]"],
        "a prompt file that is a folder": prompt_folder,
        "a prompt file in Latin-1": lambda: bench(lines='{"prompt": "caf\xe9"}\n'.encode("latin-1")),
        "a prompt file line that is not JSON": lambda: bench(lines=good_prompts + "not json\n"),
        "a prompt file line without text": lambda: bench(lines='{"question_id": "q"}\n'),
        'a question file line with `"turns": ["a", 5]`': lambda: bench(
            lines='{"question_id": 81, "turns": ["a", 5]}\n'
        ),
        'a question file repeating `"question_id": 81` on line 2': lambda: bench(
            lines='{"question_id": 81, "turns": ["a", "b"]}\n{"question_id": 81, "turns": ["c"]}\n'
        ),
        "an empty prompt file": lambda: bench(lines=""),
        "`bench.json` that is not JSON": lambda: run_folder("{oops"),
        "`bench.json` without its `units`": lambda: run_folder(
            json.dumps({k: v for k, v in meta.items() if k != "units"})
        ),
        "a damaged line 5 of `answers.jsonl`": lambda: run_folder(json.dumps(meta), damaged),
        "an `oracle.log_stack` drafting a token tree": lambda: bench_yaml(
            "stacks: {t: {strategy: {drafter: {name: eagle, tree: {topk: 2}}, stop: [{name: fixed, gamma: 8}]}}}\n"
            "oracle: {log_stack: t}\n"
        ),
        "`oracle: {verify_tree_k: [1, 4]}`": lambda: bench_yaml("oracle: {verify_tree_k: [1, 4]}\n"),
        "`cost_model.json` without `verify_s`": lambda: run_folder(json.dumps(meta), cost="{}"),
    }
    _assert_documented_errors("benchmarks.md", "## Errors", scenarios, capsys)
    assert not (tmp_path / "out").exists()


# -- cited paths ---------------------------------------------------------------------------------
ROOT = DOCS.parent
_CITED = re.compile(
    r"(?<![\w./-])((?:docs|pacer_core|pacer_bench|pacer_train|plugins|scripts|configs|tests|examples)"
    r"/[\w./*-]*[\w*])(#[\w-]+)?(?![\w<])"
)


def _citing_files() -> list[Path]:
    """What a reader follows citations from: the docs, the README, the set-up files and the code's
    docstrings and comments (tests are left out: they hold paths as data, some deliberately wrong)."""
    code = [
        p
        for folder in ("pacer_core", "pacer_bench", "pacer_train", "plugins", "scripts")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".sh")
    ]
    return [
        *DOCS.rglob("*.md"),
        ROOT / "README.md",
        ROOT / "constraints.txt",
        ROOT / "pyproject.toml",
        ROOT / ".ci" / "run",
        *code,
    ]


def test_every_cited_path_and_anchor_exists():
    """A path a doc, comment or docstring names (`pacer_core/trees.py`, `docs/costs.md#anchor`,
    `configs/*.yaml`) exists, and a cited anchor is a heading of that page."""
    missing = []
    for file in _citing_files():
        for path, anchor in _CITED.findall(file.read_text(errors="replace")):
            path = path.rstrip(".")
            where = f"{file.relative_to(ROOT)}: {path}{anchor}"
            found = list(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
            if not found:
                missing.append(where)
            elif anchor and path.endswith(".md"):
                headings = re.findall(r"^#+ (.*)$", found[0].read_text(), flags=re.M)
                if anchor[1:] not in {_slug(h) for h in headings}:
                    missing.append(where)
    assert not missing, "cited but missing: " + ", ".join(missing)


def test_every_bench_module_is_in_the_code_map():
    """docs/benchmarks.md's "Where the code lives" names every module of the bench package (its
    subpackages' too)."""
    table = section(read("benchmarks.md"), "## Where the code lives")
    named = set(re.findall(r"(\w+)\.py", table))
    modules = {p.stem for p in (ROOT / "pacer_bench").rglob("*.py") if p.stem != "__init__"}
    assert not modules - named, f"docs/benchmarks.md does not say what these hold: {sorted(modules - named)}"

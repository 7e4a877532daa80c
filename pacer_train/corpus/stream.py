"""The instruction stream: deterministic, seeded, random-access, in five families (a sixth,
``open_chat``, for a stream of chosen families).

Position ``p`` of the stream belongs to the family ``PATTERN[p % 20]`` (6 chat, 4 code writing,
4 code editing, 3 math, 3 summaries in every 20) and is that family's item ``j`` (how many earlier
positions of the cycle went to the same family). Item ``j`` of a family is combination
``perm(j)`` of the family's finite space (a seeded affine permutation, so items are distinct and
spread over the space) and has the stable id ``family/j``. Everything is built from material that
ships with Python: standard-library source (top-level modules, read with ``ast``, never imported),
``pydoc_data.topics`` and module docstrings, plus templates and word lists written for this
project (the lists in ``words/*.txt``, one item per line). None of it comes from a benchmark set;
``guard.py`` checks that anyway.

The material depends on the Python version (its standard library): ``Stream.material_digest``
names it, and a corpus refuses to be continued by a stream with another digest.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence

import attrs

from .material import STREAM_VERSION, Material, material

FAMILIES = ("chat", "code_write", "code_edit", "math", "summary")  # the default pattern's
ALL_FAMILIES = FAMILIES + ("open_chat",)  # open_chat: only in a stream made with ``families=[...]``
PATTERN = (
    "chat",
    "code_edit",
    "code_write",
    "math",
    "chat",
    "summary",
    "code_edit",
    "chat",
    "code_write",
    "math",
    "chat",
    "code_edit",
    "summary",
    "code_write",
    "chat",
    "math",
    "code_edit",
    "chat",
    "summary",
    "code_write",
)


@attrs.frozen
class Instruction:
    id: str  # family/index: stable for a seed and a material digest
    family: str
    position: int  # place in the stream
    text: str

    @property
    def sha(self) -> str:
        return text_sha(self.text)


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# -- word lists (words/*.txt) and templates, written for this project -----------------------------
WORDS = Path(__file__).resolve().parent / "words"


def words(name: str) -> list[str]:
    """The list ``words/<name>.txt``: one item per line, in order (an instruction is a combination
    of indices into these lists, so the order is part of the stream); ``#`` lines are comments."""
    lines = (WORDS / f"{name}.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


TOPICS = words("topics")
CHAT_TEMPLATES = words("chat_templates")
CHAT_MODIFIERS = ["", *words("chat_modifiers")]  # "": none

CODE_TASKS = words("code_tasks")
CODE_TASK_TEMPLATES = words("code_task_templates")
CODE_DOC_TEMPLATES = [
    'Write a Python function `{sig}`. Its documentation says: "{doc}" Implement it.',
    "Implement this function from its description.\n\nSignature: `{sig}`\nDescription: {doc}",
    'Write the body of this function:\n\n```python\ndef {sig}:\n    """{doc}"""\n```',
    "Using only the Python standard library, write `{sig}`: {doc}",
    "I need a Python function called `{name}` with parameters ({params}). {doc} Please write it.",
]
CODE_EXTRAS = ["", *(" " + extra for extra in words("code_extras"))]  # "": none

EDIT_NAMES = words("edit_names")
EDIT_OPS = words("edit_ops")
EDIT_FRAMES = ["{op}\n\n```python\n{code}\n```", "```python\n{code}\n```\n\n{op}"]
SUMMARY_ASKS = words("summary_asks")
SUMMARY_FRAMES = ["{ask}\n\n{text}", "{text}\n\n{ask}"]
NAMES = words("names")
ITEMS = words("items")
MATH_SUFFIXES = ["", *(" " + suffix for suffix in words("math_suffixes"))]  # "": none


def _math_problem(template: int, rng: random.Random) -> str:
    n1, n2 = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a, b, c = rng.randint(5, 90), rng.randint(2, 30), rng.randint(2, 12)
    price, hours, pct = rng.randint(2, 25), rng.randint(2, 10), rng.choice([10, 15, 20, 25, 30, 40, 50])
    problems = [
        f"{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} splits them evenly into {c} bags. "
        f"How many {item} go in each bag, and how many are left?",
        f"A store sells {item} at ${price} each. {n1} buys {b} of them and pays with ${price * b + a}. "
        f"What change does {n1} receive?",
        f"{n1} reads {b} pages every day for {c} days, then {a} pages on the final day. How many pages is that in all?",
        f"A box holds {a + b * (c + 1)} {item}. {n1} removes {b}, and {n2} removes {c} times as many as {n1}. "
        f"How many {item} remain?",
        f"{n1} earns ${price * 2} per hour and works {hours} hours a day for {b} days, then spends ${a} on {item}. "
        f"How much money is left?",
        f"A cyclist rides {a} kilometres in {c} hours. At that speed, how far does the cyclist ride in {b} hours?",
        f"{n1} is {c} years older than {n2}. In {b} years the sum of their ages will be {2 * a + 2 * b + c}. "
        f"How old is {n2} today?",
        f"A jacket costs ${a * 4}. It is on sale for {pct}% off. {n1} also uses a ${b % 10 + 1} coupon. "
        f"How much does {n1} pay?",
        f"{n1} saves ${b} each week. {n2} starts with ${a} and saves ${c} each week. After how many weeks "
        f"will {n1} have saved at least as much as {n2} has?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"A recipe needs {c} eggs for every {b} muffins. How many eggs are needed for {b * hours} muffins?",
        f"{n1} bought {a} {item} and gave {pct}% of them to {n2}, rounding down. How many does {n1} keep?",
        f"A tank holds {a * 10} litres. It leaks {c} litres an hour and is refilled by {b} litres every {hours} hours. "
        f"How much water is in it after {hours * 2} hours?",
        f"There are {a} students in a class. {pct}% of them walk to school, {b} take the bus, and the rest cycle. "
        f"How many students cycle?",
        f"{n1} runs {c} laps of a {b * 50}-metre track every morning for {hours} days. How many kilometres is that?",
        f"A farmer plants {a} rows of {b} plants. {c} plants in each row die. How many plants are still alive?",
        f"{n1}, {n2} and a friend share ${a * 3 + c} in the ratio 1:2:3. How much does each of them get?",
        f"A phone plan costs ${price} a month plus ${c} for every gigabyte over {b} GB. {n1} uses {b + hours} GB. "
        f"What is the bill this month?",
        f"{n1} drives at {a + 30} km/h for {c} hours and then at {b + 40} km/h for {hours} hours. "
        f"What was the average speed over the whole trip?",
        f"A school orders {a} packs of {item}, each with {c} inside, and gives the same number to each of "
        f"{hours} classes. How many does each class get, and how many are left over?",
    ]
    return problems[template % len(problems)]


MATH_TEMPLATES = 20


# open-ended requests in the manner of multi-turn chat benchmarks (writing, role-play, extraction,
# reasoning, explanations for a given reader); every word list and template written for this project
PLACES = words("places")
PERSONAS = words("personas")
AUDIENCES = words("audiences")
THINGS = words("things")
ROLES = words("roles")
CITIES = words("cities")
MONTHS = words("months")
OPEN_TEMPLATES = words("open_templates")
OPEN_KINDS = ("template", "extract", "reason", "rewrite")


def _notes(rng: random.Random) -> str:
    """A short invented passage naming people, roles, cities and months (for extraction requests)."""
    people = rng.sample(NAMES, 3)
    lines = []
    for name in people:
        role, city, month = rng.choice(ROLES), rng.choice(CITIES), rng.choice(MONTHS)
        year = rng.randint(2015, 2024)
        lines.append(
            rng.choice(
                [
                    f"{name} joined the team as a {role} in {month} {year} and moved to {city} soon after.",
                    f"In {month} {year}, {name}, a {role} from {city}, led the project's first review.",
                    f"{name} has worked as a {role} in {city} since {month} {year}.",
                ]
            )
        )
    extra = rng.choice(
        [
            f"The group met {rng.randint(3, 12)} times that year.",
            f"Their budget was {rng.randint(5, 90)} thousand euros.",
            f"Most meetings took place in {rng.choice(CITIES)}.",
        ]
    )
    return " ".join(lines + [extra])


EXTRACT_ASKS = words("extract_asks")
REWRITE_ASKS = words("rewrite_asks")


def _on_notes(rng: random.Random, asks: list[str], either_order: bool) -> str:
    """A request about an invented passage: the request first, or (``either_order``) after it."""
    text = _notes(rng)
    ask = rng.choice(asks)
    return rng.choice([f"{ask}\n\n{text}", f"{text}\n\n{ask}"]) if either_order else f"{ask}\n\n{text}"


def _open_reason(rng: random.Random) -> str:
    a, b, c, d = rng.sample(NAMES, 4)
    n, m = rng.randint(3, 9), rng.randint(2, 6)
    puzzles = [
        f"{a} is taller than {b}, and {b} is taller than {c}. Is {c} taller than {a}? Explain your reasoning.",
        f"{a}, {b} and {c} each own one pet: a cat, a dog or a fish. {a} is allergic to fur and {b} does not own "
        f"the dog. Who owns which pet?",
        f"In a race, {a} finished ahead of {b} but behind {c}. {d} finished last. What was the finishing order?",
        f"If it takes {m} workers {n} hours to paint a fence, how long would it take {m * 2} workers, assuming they "
        f"work at the same rate? Explain your answer.",
        f"{a} says that {b} is lying. {b} says that {c} is lying. {c} says that both {a} and {b} are lying. "
        f"Who is telling the truth?",
        f"A clock shows {n}:{m * 5:02d}. What is the angle between the hour hand and the minute hand?",
        f"There are {n} people in a room and each shakes hands with every other person once. How many handshakes "
        f"are there? Show your reasoning.",
        f"{a} has twice as many books as {b}, and together they have {3 * (n + m)} books. How many does each have?",
        "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain why people often get this wrong.",
        f"{a} is facing north, turns right, turns right again and then turns left. Which direction is {a} facing?",
    ]
    return rng.choice(puzzles)


# -- the families ------------------------------------------------------------------------------------
def _digits(index: int, radices: list[int]) -> list[int]:
    out = []
    for r in reversed(radices):
        index, d = divmod(index, r)
        out.append(d)
    return out[::-1]


def _pick_new(name_pool: list[str], taken: set[str], salt: str) -> str:
    start = int(hashlib.sha256(salt.encode()).hexdigest(), 16) % len(name_pool)
    for k in range(len(name_pool)):
        candidate = name_pool[(start + k) % len(name_pool)]
        if candidate not in taken:
            return candidate
    return name_pool[start] + "_2"


def _snake_to_camel(name: str) -> str:
    parts = [p for p in name.split("_") if p]
    camel = parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:]) if parts else name
    return camel if camel != name else name + "_renamed"


class Family:
    name: str

    def __init__(self, mat: Material):
        self.mat = mat

    @property
    def size(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def text(self, combo: int, rng: random.Random) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


class Chat(Family):
    name = "chat"
    radices = [len(CHAT_TEMPLATES), len(TOPICS), len(CHAT_MODIFIERS)]

    @property
    def size(self) -> int:
        return math.prod(self.radices)

    def text(self, combo, rng):
        t, topic, mod = _digits(combo, self.radices)
        text = CHAT_TEMPLATES[t].format(topic=TOPICS[topic])
        return f"{text} {CHAT_MODIFIERS[mod]}".strip()


class CodeWrite(Family):
    name = "code_write"

    @property
    def bases(self) -> int:
        return len(CODE_TASKS) * len(CODE_TASK_TEMPLATES) + len(self.mat.documented) * len(CODE_DOC_TEMPLATES)

    @property
    def size(self) -> int:
        return self.bases * len(CODE_EXTRAS)

    def text(self, combo, rng):
        base, extra = divmod(combo, len(CODE_EXTRAS))
        hand = len(CODE_TASKS) * len(CODE_TASK_TEMPLATES)
        if base < hand:
            task, template = divmod(base, len(CODE_TASK_TEMPLATES))
            text = CODE_TASK_TEMPLATES[template].format(task=CODE_TASKS[task])
        else:
            fn, template = divmod(base - hand, len(CODE_DOC_TEMPLATES))
            f = self.mat.documented[fn]
            params = ", ".join(f.params)
            text = CODE_DOC_TEMPLATES[template].format(
                sig=f"{f.name}({params})", name=f.name, params=params or "none", doc=f.doc
            )
        return text + CODE_EXTRAS[extra]


class CodeEdit(Family):
    name = "code_edit"

    @property
    def size(self) -> int:
        return len(self.mat.functions) * len(EDIT_OPS) * len(EDIT_FRAMES)

    def text(self, combo, rng):
        fn, op, frame = _digits(combo, [len(self.mat.functions), len(EDIT_OPS), len(EDIT_FRAMES)])
        f = self.mat.functions[fn]
        template = EDIT_OPS[op]
        taken = set(f.params) | set(f.locals) | {f.name}
        salt = f"{f.module}.{f.name}:{op}"
        if "{param}" in template and not f.params:
            template = EDIT_OPS[2]  # no parameter to rename: rename the function instead
        if "{local}" in template and not f.locals:
            template = EDIT_OPS[2]
        op_text = template.format(
            param=f.params[int(hashlib.sha256(salt.encode()).hexdigest(), 16) % len(f.params)] if f.params else "",
            local=f.locals[int(hashlib.sha256(salt.encode()).hexdigest(), 16) % len(f.locals)] if f.locals else "",
            new=_pick_new(EDIT_NAMES, taken, salt),
            newfunc=_snake_to_camel(f.name) if op == 2 else f"{f.name}_v{op}",
            klass="".join(p.capitalize() for p in f.module.split("_") if p) + "Tools",
        )
        return EDIT_FRAMES[frame].format(op=op_text, code=f.code)


class Math(Family):
    name = "math"
    combos = 1_000_000  # template × seeded numbers and names; the suffix varies with the item

    @property
    def size(self) -> int:
        return self.combos

    def text(self, combo, rng):
        template = combo % MATH_TEMPLATES
        problem = _math_problem(template, rng)
        return problem + rng.choice(MATH_SUFFIXES)


class Summary(Family):
    name = "summary"

    @property
    def size(self) -> int:
        return len(self.mat.texts) * len(SUMMARY_ASKS) * len(SUMMARY_FRAMES)

    def text(self, combo, rng):
        t, ask, frame = _digits(combo, [len(self.mat.texts), len(SUMMARY_ASKS), len(SUMMARY_FRAMES)])
        return SUMMARY_FRAMES[frame].format(ask=SUMMARY_ASKS[ask], text=self.mat.texts[t])


class OpenChat(Family):
    """Open-ended requests (writing, role-play, explanations for a reader, planning; extraction from,
    rewriting of and reasoning about invented passages and puzzles): the kind of chat the other
    families cover least. The item's kind and slots come from its seeded ``rng``."""

    name = "open_chat"
    combos = 1_000_000

    @property
    def size(self) -> int:
        return self.combos

    def text(self, combo, rng):
        kind = rng.choices(OPEN_KINDS, weights=(7, 1, 1, 1))[0]  # the item's own rng: spread over templates
        if kind in ("extract", "rewrite"):
            return _on_notes(rng, EXTRACT_ASKS, True) if kind == "extract" else _on_notes(rng, REWRITE_ASKS, False)
        if kind == "reason":
            return _open_reason(rng)
        template = rng.choice(OPEN_TEMPLATES)
        return template.format(
            topic=rng.choice(TOPICS),
            place=rng.choice(PLACES),
            persona=rng.choice(PERSONAS),
            audience=rng.choice(AUDIENCES),
            thing=rng.choice(THINGS),
        )


def _permutation(size: int, seed: int, family: str) -> tuple[int, int]:
    """(a, b) of the affine permutation j → (a·j + b) mod size, a coprime to size."""
    rng = random.Random(f"{seed}:{family}:perm")
    a = max(1, int(size * 0.6180339887)) + rng.randrange(max(1, size // 7))
    while math.gcd(a, size) != 1:
        a += 1
    return a, rng.randrange(size)


def valid_families(families: Sequence[str]) -> bool:
    """Whether ``families`` is a stream's family list: at least one, distinct, each a known family."""
    return bool(families) and len(set(families)) == len(families) and set(families) <= set(ALL_FAMILIES)


class Stream:
    """The instruction at any stream position, for a seed (``at``); ``None`` when the family's space
    is used up (never within a few million positions)."""

    def __init__(self, seed: int = 0, mat: Optional[Material] = None, families: Optional[Sequence[str]] = None):
        """``families`` None: the five-family ``PATTERN``; else positions go to those families in turn
        (e.g. ``["open_chat"]``: a corpus of open-ended chat only), recorded by ``describe``."""
        self.seed = seed
        self.mat = mat or material()
        self.mix = None if families is None else tuple(families)
        self.pattern = PATTERN if self.mix is None else self.mix
        if self.mix is not None and not valid_families(self.mix):
            raise ValueError(
                f"families must be distinct names among {', '.join(ALL_FAMILIES)}, got {list(self.pattern)}"
            )
        classes = {cls.name: cls for cls in (Chat, CodeWrite, CodeEdit, Math, Summary, OpenChat)}
        self.families: dict[str, Family] = {name: classes[name](self.mat) for name in dict.fromkeys(self.pattern)}
        self._perms = {name: _permutation(f.size, seed, name) for name, f in self.families.items()}
        self._rank = [self.pattern[:i].count(self.pattern[i]) for i in range(len(self.pattern))]

    @property
    def material_digest(self) -> str:
        return self.mat.digest

    def describe(self) -> dict:
        described = {
            "version": STREAM_VERSION,
            "seed": self.seed,
            "material_digest": self.mat.digest,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "family_sizes": {name: f.size for name, f in self.families.items()},
        }
        if self.mix is not None:  # absent: the five-family pattern (every corpus made before the option)
            described["families"] = list(self.mix)
        return described

    def locate(self, position: int) -> tuple[str, int]:
        cycle, slot = divmod(position, len(self.pattern))
        family = self.pattern[slot]
        return family, cycle * self.pattern.count(family) + self._rank[slot]

    def at(self, position: int) -> Optional[Instruction]:
        family, j = self.locate(position)
        fam = self.families[family]
        if j >= fam.size:
            return None
        a, b = self._perms[family]
        combo = (a * j + b) % fam.size
        rng = random.Random(f"{self.seed}:{family}:{j}")
        return Instruction(f"{family}/{j}", family, position, fam.text(combo, rng))

    def __iter__(self) -> Iterator[Instruction]:
        position = 0
        while True:
            item = self.at(position)
            if item is not None:
                yield item
            position += 1

"""Instructions the target answers to make chat-formatted distillation data.

Written for this project (templates × topics, arithmetic word problems with seeded numbers; the
lists in ``words/instruction_*.txt``, names and items the stream's); none comes from a benchmark set
(HumanEval, GSM8K, MT-Bench are held out for evaluation).
"""

from __future__ import annotations

import random

from .stream import words

TOPICS = words("instruction_topics")
CODE_TASKS = words("instruction_code_tasks")
TEMPLATES = words("instruction_templates")
CODE_TEMPLATES = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Include a docstring and two example calls.",
    "Implement a Python function that {task}, then explain how it works step by step.",
    'Complete the following Python code:\n\ndef solve(data):\n    """Return the result of a function that {task}."""\n',
]
NAMES = words("names")[:12]  # the first of the stream's lists (words/names.txt, words/items.txt)
ITEMS = words("items")[:8]


def word_problem(rng: random.Random) -> str:
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c, price = rng.randint(5, 60), rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 12)
    return (
        rng.choice(
            [
                f"{name} has {a} {item}. {other} gives {name} {b} more, then {name} shares them equally among "
                f"{c} friends. How many {item} does each friend get, and how many are left over?",
                f"A shop sells {item} for ${price} each. {name} buys {b} and pays with a ${price * b + a} bill. "
                f"How much change does {name} get?",
                f"{name} reads {b} pages a day for {c} days and then {a} pages on the last day. How many pages "
                f"did {name} read in total?",
                f"There are {a} {item} in a box. {name} takes {b}, and {other} takes {c} times as many as {name}. "
                f"How many {item} are left in the box?",
                f"{name} earns ${price * 3} an hour and works {c} hours a day for {b} days. {name} spends ${a} on "
                f"{item}. How much money does {name} have left?",
                f"A train travels {a} miles in {c} hours. At the same speed, how far does it travel in {b} hours?",
                f"{name} is {c} years older than {other}. In {b} years their ages will add up to {2 * a + 2 * b + c}. "
                f"How old is {other} now?",
            ]
        )
        + " Let's think step by step."
    )


def instructions(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct instructions, deterministic for a seed: code, explanations, math."""
    rng = random.Random(seed)
    pool = [t.format(task=task) for t in CODE_TEMPLATES for task in CODE_TASKS]
    pool += [t.format(topic=topic) for t in TEMPLATES for topic in TOPICS]
    rng.shuffle(pool)
    out: list[str] = []
    while len(out) < count:
        out.append(word_problem(rng) if len(out) % 3 == 2 else pool[len(out) % len(pool)])
    return out

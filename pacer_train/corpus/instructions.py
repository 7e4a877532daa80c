"""Instructions the target answers to make chat-formatted distillation data.

Written for this project (templates × topics, arithmetic word problems with seeded numbers); none
comes from a benchmark set (HumanEval, GSM8K, MT-Bench are held out for evaluation).
"""

from __future__ import annotations

import random

TOPICS = [
    "recursion", "hash tables", "binary search", "linked lists", "sorting algorithms", "unit testing",
    "version control", "HTTP requests", "JSON files", "regular expressions", "list comprehensions",
    "generators", "decorators", "context managers", "exceptions", "classes and objects", "inheritance",
    "type hints", "virtual environments", "dynamic programming", "graphs", "queues and stacks",
    "string formatting", "file input and output", "command-line arguments", "logging", "threads",
    "photosynthesis", "the water cycle", "volcanoes", "the solar system", "gravity", "electricity",
    "the human heart", "vaccines", "climate and weather", "supply and demand", "inflation",
    "compound interest", "budgeting", "healthy sleep", "time management", "public speaking",
    "learning a language", "writing a cover letter", "planning a trip", "growing tomatoes",
    "baking bread", "training for a 5k run", "the printing press", "the Roman Empire",
    "the industrial revolution", "democracy", "renewable energy", "recycling", "friendship",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the vowels in a text",
    "returns the n-th Fibonacci number", "merges two sorted lists", "removes duplicates from a list "
    "while keeping order", "computes the factorial of n", "finds the largest element of a list",
    "converts Celsius to Fahrenheit", "checks whether a word is a palindrome", "flattens a nested list",
    "counts word frequencies in a text", "returns the greatest common divisor of two numbers",
    "transposes a matrix given as a list of lists", "validates an email address roughly",
    "splits a list into chunks of size k", "computes the running average of a list",
    "returns the second largest number in a list", "capitalizes every word in a sentence",
    "sums the digits of an integer", "checks whether two strings are anagrams",
    "rotates a list by k positions", "finds all pairs in a list that sum to a target",
    "parses a date string like 2024-05-17 into a tuple", "computes the median of a list",
]
TEMPLATES = [
    "Explain {topic} to a beginner.", "Give three practical tips about {topic}.",
    "Write a short paragraph about {topic}.", "What are common mistakes people make with {topic}?",
    "Summarize the key ideas of {topic} in a few sentences.", "Write a short story that involves {topic}.",
    "Write a persuasive email to a friend about {topic}.", "Imagine you are a teacher. Plan a short lesson on {topic}.",
    "Describe {topic} using an everyday analogy.", "List the pros and cons of learning about {topic}.",
    "Write a blog post introduction about {topic}.", "What questions would an expert ask about {topic}? Answer two of them.",
    "Compose a short poem about {topic}.", "Explain the history of {topic} in a few paragraphs.",
]
CODE_TEMPLATES = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Include a docstring and two example calls.",
    "Implement a Python function that {task}, then explain how it works step by step.",
    'Complete the following Python code:\n\ndef solve(data):\n    """Return the result of a function that {task}."""\n',
]
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ivy", "Jonas", "Kemi", "Luis"]
ITEMS = ["apples", "stickers", "marbles", "books", "pencils", "cookies", "cards", "shells"]


def word_problem(rng: random.Random) -> str:
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c, price = rng.randint(5, 60), rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 12)
    return rng.choice([
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
    ]) + " Let's think step by step."


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

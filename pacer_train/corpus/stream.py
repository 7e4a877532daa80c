"""The instruction stream: deterministic, seeded, random-access, in five families (a sixth,
``open_chat``, for a stream of chosen families).

Position ``p`` of the stream belongs to the family ``PATTERN[p % 20]`` (6 chat, 4 code writing,
4 code editing, 3 math, 3 summaries in every 20) and is that family's item ``j`` (how many earlier
positions of the cycle went to the same family). Item ``j`` of a family is combination
``perm(j)`` of the family's finite space (a seeded affine permutation, so items are distinct and
spread over the space) and has the stable id ``family/j``. Everything is built from material that
ships with Python: standard-library source (top-level modules, read with ``ast``, never imported),
``pydoc_data.topics`` and module docstrings, plus templates and word lists written for this
project. None of it comes from a benchmark set; ``guard.py`` checks that anyway.

The material depends on the Python version (its standard library): ``Stream.material_digest``
names it, and a corpus refuses to be continued by a stream with another digest.
"""

from __future__ import annotations

import ast
import functools
import inspect
import hashlib
import json
import math
import os
import random
import re
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Iterator, Optional, Sequence

import attrs

STREAM_VERSION = 1
FAMILIES = ("chat", "code_write", "code_edit", "math", "summary")  # the default pattern's
ALL_FAMILIES = FAMILIES + ("open_chat",)  # open_chat: only in a stream made with ``families=[...]``
PATTERN = ("chat", "code_edit", "code_write", "math", "chat", "summary", "code_edit", "chat", "code_write", "math",
           "chat", "code_edit", "summary", "code_write", "chat", "math", "code_edit", "chat", "summary", "code_write")


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


# -- word lists and templates (written for this project) ------------------------------------------
def _split(block: str) -> list[str]:
    return [item.strip() for item in block.split(";") if item.strip()]


TOPICS = _split("""
recursion; hash tables; binary search; linked lists; sorting algorithms; unit testing; version control with git;
HTTP requests; JSON files; regular expressions; list comprehensions; generators; decorators; context managers;
exceptions; classes and objects; inheritance; type hints; virtual environments; dynamic programming; graphs;
queues and stacks; string formatting; file input and output; command-line arguments; logging; threads;
asynchronous programming; memory management; garbage collection; Unicode and text encodings; floating-point numbers;
binary and hexadecimal numbers; databases and SQL; database indexes; caching; APIs; REST services; code reviews;
refactoring; debugging; profiling slow code; test-driven development; continuous integration; containers;
the command line; shell scripts; compilers and interpreters; operating systems; computer networks; DNS;
encryption; passwords and password managers; open-source software; spreadsheets; data visualization;
machine learning; neural networks; probability; statistics; averages and medians; prime numbers; fractions;
percentages; geometry; the Pythagorean theorem; algebra; logarithms; binary trees; big-O notation;
photosynthesis; the water cycle; volcanoes; earthquakes; the solar system; black holes; the Moon; gravity;
electricity; magnetism; light and color; sound waves; atoms; chemical reactions; the periodic table; DNA;
evolution; the human heart; the immune system; vaccines; sleep; nutrition; exercise; bacteria and viruses;
bees and pollination; rainforests; deserts; oceans and tides; coral reefs; climate and weather; clouds;
renewable energy; solar panels; electric cars; recycling; composting; supply and demand; inflation;
interest rates; compound interest; budgeting; saving for retirement; starting a small business; marketing;
negotiation; job interviews; writing a cover letter; writing a resume; remote work; teamwork; leadership;
giving feedback; running a meeting; time management; procrastination; habits; public speaking; note taking;
learning a language; learning to play the guitar; reading more books; writing a short story; poetry;
photography; drawing; cooking pasta; baking bread; making coffee; growing tomatoes; houseplants;
keeping a dog; caring for a cat; planning a trip; packing for a hike; camping; cycling to work;
training for a 5k run; swimming; chess; board games; video game design; the printing press; the Roman Empire;
ancient Egypt; the Renaissance; the industrial revolution; the invention of the telephone; the first flight;
the space race; the history of the internet; democracy; elections; human rights; museums; libraries;
volunteering; friendship; moving to a new city; choosing a laptop; smartphones; social media; online privacy;
phishing emails; backups; keyboard shortcuts; email etiquette; maps and navigation; trains; bridges;
skyscrapers; earthquake-resistant buildings; clocks and time zones; calendars; the metric system
""")

CHAT_TEMPLATES = _split("""
Explain {topic} to a beginner.; Give three practical tips about {topic}.; Write a short paragraph about {topic}.;
What are common mistakes people make with {topic}?; Summarize the key ideas of {topic}.;
Write a short story that involves {topic}.; Write a friendly email to a colleague about {topic}.;
Plan a fifteen-minute lesson on {topic}.; Describe {topic} using an everyday analogy.;
List the pros and cons of {topic}.; Write the introduction of a blog post about {topic}.;
Compose a short poem about {topic}.; Give a brief history of {topic}.; What is the most surprising fact about {topic}?;
Write five quiz questions about {topic}, with answers.; Explain {topic} to a ten-year-old.;
How would you explain {topic} in an interview?; Write a dialogue between a student and a teacher about {topic}.;
Give a step-by-step guide to getting started with {topic}.; What are the main arguments for and against {topic}?;
Create a glossary of five terms related to {topic}.; Write a tweet-length fact about {topic}.;
Describe a typical day of someone who works with {topic}.; What should a complete beginner read first about {topic}?;
Compare {topic} with something similar and explain the differences.; Write a haiku about {topic}.;
Give an outline for a presentation on {topic}.; What are three myths about {topic}, and what is the truth?;
Write a product description for a course about {topic}.; Explain why {topic} matters today.;
Write a short FAQ about {topic}.; Suggest a small project to learn about {topic}.;
Write a motivational message for someone struggling with {topic}.; Describe {topic} in exactly three sentences.;
What questions would an expert ask about {topic}? Answer two of them.; Write a limerick about {topic}.;
Give a real-world example of {topic} and explain it.; Write a short news article about a discovery in {topic}.;
Explain the vocabulary someone needs to talk about {topic}.; What would change in the world without {topic}?
""")

CHAT_MODIFIERS = ["", "Keep it under 100 words.", "Use a numbered list.", "Use simple words.", "Be concise.",
                  "Use a friendly tone.", "Use a formal tone.", "Add a short example.", "End with a one-line summary.",
                  "Use bullet points.", "Write it for a busy manager.", "Include one surprising detail."]

CODE_TASKS = _split("""
reverses a string; checks whether a number is prime; counts the vowels in a text; returns the n-th Fibonacci number;
merges two sorted lists; removes duplicates from a list while keeping the order; computes the factorial of n;
finds the largest element of a list; converts Celsius to Fahrenheit; checks whether a word is a palindrome;
flattens a nested list; counts word frequencies in a text; returns the greatest common divisor of two numbers;
transposes a matrix given as a list of lists; splits a list into chunks of size k; computes a running average;
returns the second largest number in a list; capitalizes every word in a sentence; sums the digits of an integer;
checks whether two strings are anagrams; rotates a list by k positions; finds all pairs in a list that sum to a target;
parses a date string like 2024-05-17 into a tuple of integers; computes the median of a list;
counts the lines, words and characters of a text file; converts a Roman numeral to an integer;
converts an integer to a Roman numeral; checks whether brackets in a string are balanced;
groups words by their first letter; returns the longest common prefix of a list of strings;
computes the dot product of two vectors; finds the index of a value in a sorted list with binary search;
implements bubble sort; implements insertion sort; implements merge sort; implements quicksort;
returns the prime factors of a number; checks whether a year is a leap year; counts the days between two dates;
converts a string to snake_case; converts a string to camelCase; truncates a text to n characters with an ellipsis;
masks all but the last four digits of a card number; generates a random password of a given length;
validates an IPv4 address; formats a number of bytes as KB, MB or GB; parses a query string into a dictionary;
reads a CSV file and returns the sum of one column; merges two dictionaries, summing values of shared keys;
returns the most common element of a list; computes the area of a polygon from its vertices;
finds the missing number in a list containing 1 to n; computes the power set of a small list;
returns all permutations of a string; checks whether a list is sorted; removes vowels from a string;
computes compound interest; counts the set bits of an integer; converts a binary string to an integer;
interleaves two lists; finds the longest word in a sentence; wraps a text at a given width;
computes the Levenshtein distance between two strings; implements a stack class with push, pop and peek;
implements a queue with two stacks; computes the moving maximum over a window; deduplicates a list of dictionaries by a key;
returns the intersection of two lists; checks whether a string contains only digits; computes a checksum of a text;
counts how often each character occurs in a string; finds the first non-repeating character of a string;
computes the cumulative sum of a list; clamps a number into a range; pads a string to a given width
""")

CODE_TASK_TEMPLATES = [
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Include a docstring.",
    "Implement a Python function that {task}, then explain how it works.",
    "Show me Python code for a function that {task}.",
    "Write a small, well-named Python function that {task}, with one example call.",
    "Using only built-in features, write a Python function that {task}.",
]
CODE_DOC_TEMPLATES = [
    "Write a Python function `{sig}`. Its documentation says: \"{doc}\" Implement it.",
    "Implement this function from its description.\n\nSignature: `{sig}`\nDescription: {doc}",
    "Write the body of this function:\n\n```python\ndef {sig}:\n    \"\"\"{doc}\"\"\"\n```",
    "Using only the Python standard library, write `{sig}`: {doc}",
    "I need a Python function called `{name}` with parameters ({params}). {doc} Please write it.",
]
CODE_EXTRAS = ["", " Add type hints.", " Keep it short.", " Then write two assert-based tests for it.",
               " Explain the time complexity afterwards.", " Handle invalid input with a clear error."]

EDIT_NAMES = ["value", "item", "data", "count", "total", "entry", "source", "target", "payload", "amount",
              "record", "element", "chunk", "token", "config", "options", "buffer", "handle", "node", "state"]
EDIT_OPS = [
    "Rename the parameter `{param}` to `{new}` everywhere in this function. Show the whole updated function.",
    "Rename the local variable `{local}` to `{new}` in this function and show the full result.",
    "Rename this function to `{newfunc}`; change nothing else. Show the complete code.",
    "Add a short comment explaining each statement of this function, leaving the code itself as it is.",
    "Add a docstring to this function that describes its arguments and its return value; keep the code as it is.",
    "Add type hints to the signature of this function. Do not change its behaviour.",
    "Remove all comments and the docstring from this function; keep every line of code the same.",
    "Reformat this function to use double quotes for all string literals; nothing else may change.",
    "Wrap the body of this function in a try/except block that logs the exception and re-raises it.",
    "Turn this function into a static method of a class named `{klass}` and show the class.",
    "Add a debugging print of all arguments at the start of this function; keep the rest unchanged.",
    "Reindent this function with two spaces per level instead of four; keep the code otherwise identical.",
]
EDIT_FRAMES = ["{op}\n\n```python\n{code}\n```", "```python\n{code}\n```\n\n{op}"]

SUMMARY_ASKS = [
    "Summarize this text in two or three sentences.", "What is the main point of this passage? Answer briefly.",
    "Write a one-paragraph summary of the text below for a new Python programmer.",
    "Give a bullet-point summary of the key facts in this text.", "Explain this passage in plain language.",
    "Condense this documentation into a short note a developer could keep on a sticky note.",
    "Write a TL;DR for this text.", "List the three most important things this documentation says.",
    "Rewrite this text as a short, simple explanation.", "Summarize what this documentation describes, in one sentence.",
]
SUMMARY_FRAMES = ["{ask}\n\n{text}", "{text}\n\n{ask}"]

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ivy", "Jonas", "Kemi", "Luis", "Maya",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "stickers", "marbles", "books", "pencils", "cookies", "cards", "shells", "stamps", "coins",
         "plants", "cupcakes", "bottles", "tickets", "buttons", "bricks"]
MATH_SUFFIXES = ["", " Show your work.", " Explain each step.", " Give the final answer on its own line.",
                 " Reason it through before answering.", " Solve it carefully."]


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
PLACES = _split("""
Lisbon; Kyoto; a small fishing village in Norway; the Scottish Highlands; Marrakech; Vancouver; the Amazon rainforest;
Istanbul; a mountain town in the Andes; Cape Town; Iceland; Hanoi; the Greek islands; Patagonia; Prague;
a national park in Canada; Seoul; the Australian outback; Venice; a desert oasis; Mexico City; New Zealand's south island;
a lighthouse on a rocky coast; Copenhagen; the Swiss Alps; Buenos Aires; a tea plantation in Sri Lanka; Edinburgh;
a coral atoll; Montreal; the Sahara; a night market in Taipei; Vienna; a quiet lake in Finland; Havana; Dublin
""")
PERSONAS = _split("""
a medieval knight; a ship's captain from the 1800s; a friendly robot from the future; a detective in 1920s London;
a grumpy old wizard; a cheerful kindergarten teacher; a famous chef; a professional football coach;
a NASA flight director; a pirate who has given up piracy; a time traveller from the year 3000; a museum tour guide;
a stand-up comedian; a wise old tree; a startup founder pitching to investors; a sports commentator;
a librarian who loves mysteries; a park ranger; a personal fitness trainer; a travel agent;
a nineteenth-century scientist; a lighthouse keeper; a news anchor; a poet laureate; a retired astronaut;
a barista who gives life advice; a cat who can talk; a dragon guarding a treasure; a village baker; a tour bus driver
""")
AUDIENCES = _split("""
a group of high-school students; your grandparents; a curious five-year-old; a busy executive; new employees;
a skeptical scientist; a room full of tourists; readers of a local newspaper; a city council; first-year university students
""")
THINGS = _split("""
a smartwatch; a reusable water bottle; an electric scooter; a noise-cancelling headset; a language-learning app;
a solar-powered charger; a smart thermostat; a meal-kit subscription; a folding bicycle; an e-reader;
a home coffee roaster; a plant-care sensor; a budgeting app; a portable projector; a standing desk
""")
ROLES = ["engineer", "designer", "manager", "analyst", "teacher", "nurse", "accountant", "chef", "pilot", "editor",
         "pharmacist", "architect", "developer", "consultant", "journalist"]
CITIES = ["Oslo", "Lima", "Nairobi", "Perth", "Leeds", "Porto", "Osaka", "Denver", "Quito", "Gdansk", "Tampere", "Accra"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
OPEN_TEMPLATES = _split("""
Compose an engaging travel blog post about a week spent in {place}, covering the food, the people and one unexpected moment.;
Write a persuasive essay arguing that every school should teach {topic}.;
Draft a professional email to your manager asking for a week off to visit {place}.;
Write a product review of {thing} after using it for a month, with its strengths and weaknesses.;
Write a short story about {persona} who has to learn about {topic}.;
Write a speech for {audience} about why {topic} matters.;
Write a letter to a friend describing your first impressions of {place}.;
Write the opening scene of a mystery novel set in {place}.;
Write a radio advertisement for {thing}, about thirty seconds long.;
Draft a polite complaint to a company whose {thing} stopped working after two days.;
Write a diary entry of {persona} on an ordinary Tuesday.;
Write a motivational speech for {audience} before a difficult exam.;
Write a two-paragraph cover letter for a job that involves {topic}.;
Compose a short poem in the voice of {persona} about {place}.;
Write a news report about a festival held in {place}.;
Write a review of an imaginary restaurant in {place}, as a food critic would.;
Pretend you are {persona}. Describe your typical day and what you like most about it.;
Act as {persona} and give advice to someone who is nervous about {topic}.;
You are {persona}. A visitor asks you what {topic} is. Answer in character.;
Imagine you are {persona} visiting {place} for the first time. What do you notice?;
Take on the role of {persona} and explain why people should care about {topic}.;
Pretend to be {persona} and persuade {audience} to try {thing}.;
Role-play as {persona}: a customer complains that {thing} is too expensive. Respond to them.;
Stay in character as {persona} and tell a short story about your greatest adventure.;
As {persona}, write a short welcome message for {audience}.;
Explain {topic} to {audience}, using one clear example.;
What are the main challenges of {topic}, and how can they be addressed?;
Compare living in {place} with living in a big city. Which would you choose and why?;
Describe three ways {topic} has changed everyday life in the last fifty years.;
What ethical questions does {topic} raise? Discuss two of them.;
Explain the history and the importance of {topic} in a short essay.;
Give a balanced analysis of the benefits and risks of {thing}.;
If you had to teach {topic} in a single afternoon, how would you plan it?;
What would a beginner misunderstand about {topic}, and how would you correct it?;
Describe how {topic} could be used to solve a problem in a small town.;
Suggest a three-day itinerary for {place}, with one activity for each morning and afternoon.;
Plan a birthday surprise for a friend who loves {topic}.;
Brainstorm five creative names for a café in {place}, and explain each one.;
Outline a marketing plan for {thing} aimed at {audience}.;
Suggest five discussion questions for {audience} about {topic}.;
Create a weekly schedule that helps a student make progress with {topic}.
""")
OPEN_KINDS = ("template", "extract", "reason", "rewrite")


def _notes(rng: random.Random) -> str:
    """A short invented passage naming people, roles, cities and months (for extraction requests)."""
    people = rng.sample(NAMES, 3)
    lines = []
    for name in people:
        role, city, month = rng.choice(ROLES), rng.choice(CITIES), rng.choice(MONTHS)
        year = rng.randint(2015, 2024)
        lines.append(rng.choice([
            f"{name} joined the team as a {role} in {month} {year} and moved to {city} soon after.",
            f"In {month} {year}, {name}, a {role} from {city}, led the project's first review.",
            f"{name} has worked as a {role} in {city} since {month} {year}.",
        ]))
    extra = rng.choice([f"The group met {rng.randint(3, 12)} times that year.",
                        f"Their budget was {rng.randint(5, 90)} thousand euros.",
                        f"Most meetings took place in {rng.choice(CITIES)}."])
    return " ".join(lines + [extra])


EXTRACT_ASKS = ["List every person mentioned, with their job and city, as JSON.",
                "Extract all the dates and the events that happened on them.",
                "Who is mentioned in this text, and what does each of them do? Answer in a table.",
                "Identify the cities in the text and say who is connected to each.",
                "Summarize the passage in one sentence, then list the names it mentions."]
REWRITE_ASKS = ["Rewrite this paragraph in a more formal tone.",
                "Rewrite this as a short, friendly announcement for a company newsletter.",
                "Turn this passage into three bullet points.",
                "Edit this paragraph to make it clearer and shorter.",
                "Rewrite this text as if it were the opening of a novel."]


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
        f"Which is heavier, a kilogram of feathers or a kilogram of iron? Explain why people often get this wrong.",
        f"{a} is facing north, turns right, turns right again and then turns left. Which direction is {a} facing?",
    ]
    return rng.choice(puzzles)


# -- material from the standard library --------------------------------------------------------------
@attrs.frozen
class Function:
    module: str
    name: str
    params: tuple[str, ...]
    locals: tuple[str, ...]
    code: str
    doc: str  # the docstring's first paragraph, one line ('' when none)


SKIP_MODULES = {"this", "antigravity", "__future__", "__hello__", "__phello__", "_pydecimal", "_pyio",
                "pydoc", "typing"}  # typing: mostly overloads; the two big _py* twins duplicate C modules


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _clean_doc(doc: Optional[str]) -> str:
    if not doc:
        return ""
    first = re.split(r"\n\s*\n", inspect.cleandoc(doc))[0]
    return " ".join(first.split())


def _functions_of(module: str, source: str, tree: ast.Module) -> list[Function]:
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        length = node.end_lineno - node.lineno + 1
        if not 4 <= length <= 30:
            continue
        code = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno])).rstrip()
        if len(code) > 1200 or "\t" in code or not code.isascii() or not code.startswith("def "):
            continue
        params = tuple(a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                       if a.arg not in ("self", "cls"))
        assigned = sorted({t.id for n in ast.walk(node) if isinstance(n, ast.Assign)
                           for t in n.targets if isinstance(t, ast.Name)} - set(params))
        out.append(Function(module, node.name, params, tuple(assigned), code, _clean_doc(ast.get_docstring(node))))
    return out


def _docs_of(tree: ast.Module) -> list[str]:
    """The module docstring and the long (≥ 400 characters) class and function docstrings."""
    docs = [(ast.get_docstring(tree) or "").strip()]
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            doc = (ast.get_docstring(node) or "").strip()
            if len(doc) >= 400:
                docs.append(doc)
    return [d for d in docs if d and d.isascii()]


def _chunks(text: str, low: int = 700, high: int = 2400) -> list[str]:
    """Paragraph-aligned pieces of ``text`` between ``low`` and ``high`` characters."""
    pieces, current = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para:
            continue
        if current and len(current) + len(para) + 2 > high:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        pieces.append(current)
    return [p for p in pieces if low <= len(p) <= high]


@attrs.frozen
class Material:
    functions: tuple[Function, ...]  # code editing: source 4–30 lines
    documented: tuple[Function, ...]  # code writing specs: functions with a one-line description
    texts: tuple[str, ...]  # summaries: documentation passages
    digest: str


def _digest(functions: list[Function], texts: list[str]) -> str:
    payload = json.dumps([[attrs.astuple(f) for f in functions], texts, STREAM_VERSION])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _documented(functions: list[Function]) -> list[Function]:
    return [f for f in functions if 25 <= len(f.doc) <= 240 and len(f.doc.split()) >= 5
            and not f.name.startswith("_") and '"' not in f.doc]


@functools.lru_cache(maxsize=None)
def material() -> Material:
    """The standard-library material of this Python: parsed once (a few seconds) and kept in the
    model cache folder, keyed by the Python version and the source files' sizes and times."""
    import pydoc_data.topics

    from pacer_core.hf import cache_root

    files = [f for f in sorted(_stdlib_root().glob("*.py")) if f.stem not in SKIP_MODULES and not f.stem.startswith("test")]
    stamp = [sys.version, STREAM_VERSION, pydoc_data.topics.__file__] + [
        (f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files + [Path(pydoc_data.topics.__file__)]]
    key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]
    cached = cache_root() / "corpus-material" / f"{key}.json"
    if cached.exists():
        try:
            data = json.loads(cached.read_text())
            functions = [Function(m, n, tuple(p), tuple(loc), c, d) for m, n, p, loc, c, d in data["functions"]]
            if _digest(functions, data["texts"]) == data["digest"]:
                return Material(tuple(functions), tuple(_documented(functions)), tuple(data["texts"]), data["digest"])
        except (ValueError, KeyError, TypeError):
            pass
    found = _build_material(files)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(cached.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"functions": [attrs.astuple(f) for f in found.functions],
                                   "texts": list(found.texts), "digest": found.digest}))
        os.replace(tmp, cached)
    except OSError:
        pass
    return found


def _build_material(files: list[Path]) -> Material:
    from pydoc_data.topics import topics

    functions: list[Function] = []
    texts: list[str] = []
    for file in files:
        source = file.read_text(encoding="utf-8", errors="ignore")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        functions += _functions_of(file.stem, source, tree)
        for doc in _docs_of(tree):
            texts += _chunks(doc, low=400)
    for name in sorted(topics):
        text = re.sub(r"\n{3,}", "\n\n", topics[name]).strip()
        if 1500 <= len(text) <= 6000:  # whole topics of this size are the summarization benchmark's prompts
            continue
        texts += _chunks(text, low=500)
    seen: set[str] = set()
    texts = [t for t in texts if not (t in seen or seen.add(t))]
    return Material(tuple(functions), tuple(_documented(functions)), tuple(texts), _digest(functions, texts))


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
            text = CODE_DOC_TEMPLATES[template].format(sig=f"{f.name}({params})", name=f.name,
                                                       params=params or "none", doc=f.doc)
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
            klass="".join(p.capitalize() for p in f.module.split("_") if p) + "Tools")
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
        return template.format(topic=rng.choice(TOPICS), place=rng.choice(PLACES), persona=rng.choice(PERSONAS),
                               audience=rng.choice(AUDIENCES), thing=rng.choice(THINGS))


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
            raise ValueError(f"families must be distinct names among {', '.join(ALL_FAMILIES)}, got {list(self.pattern)}")
        classes = {cls.name: cls for cls in (Chat, CodeWrite, CodeEdit, Math, Summary, OpenChat)}
        self.families: dict[str, Family] = {name: classes[name](self.mat) for name in dict.fromkeys(self.pattern)}
        self._perms = {name: _permutation(f.size, seed, name) for name, f in self.families.items()}
        self._rank = [self.pattern[:i].count(self.pattern[i]) for i in range(len(self.pattern))]

    @property
    def material_digest(self) -> str:
        return self.mat.digest

    def describe(self) -> dict:
        described = {"version": STREAM_VERSION, "seed": self.seed, "material_digest": self.mat.digest,
                     "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                     "family_sizes": {name: f.size for name, f in self.families.items()}}
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

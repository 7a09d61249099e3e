"""A seeded synthetic chat corpus of checkable tasks, for the demo target and its draft.

Every record is one user turn and one assistant turn, in a thinking variant (a `<think>` trace, then
the answer sentence) or a non-thinking variant (the empty think block the chat template writes with
enable_thinking=false, then the answer). A tiny model can only answer directly what it can compute
directly (../shared/NOTES.md), so each task has an intended mode: multi-digit arithmetic, letter
counting, comparison and sorting are meant for thinking (their traces break the work into one-digit
steps), unit conversion and counting a small list for non-thinking. Each record keeps that mode and the
checkable answer.

The target trains in two phases. The base corpus (`generate`, `build`) is mostly single-turn and
teaches the tasks. The chat corpus (`generate_chat`, `build_chat`) then teaches them inside a real
conversation: 1-8 turns, the earlier turns from any task (also the same task with other numbers),
rendered by the chat template exactly as at inference (earlier think blocks dropped), and the last turn
in thinking mode for every task half of the time, because `make chat` runs with thinking on. The chat
corpus also holds the tool task (`tool_conversation`, below): with a `convert` tool offered through the
template's tools branch, a conversion question is answered with a `<tool_call>`, and the tool's result
with the convert task's sentence. Without tools offered, everything is as before.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

EMPTY_THINK = "<think>\n\n</think>\n\n"
THINK_TASKS = ("add", "sub", "mul", "letters", "compare", "sort")
DIRECT_TASKS = ("convert", "items")
TASKS = THINK_TASKS + DIRECT_TASKS + ("chat",)
# Shares of the training corpus; the harder thinking tasks get more.
WEIGHTS = {"add": 20, "sub": 18, "mul": 18, "letters": 9, "compare": 8, "sort": 14, "convert": 5,
           "items": 4, "chat": 3}
INTENDED_SHARE = 0.9  # share of records written in the task's intended mode
MULTI_TURN_SHARE = 0.08  # share of training records with one earlier exchange in the history
TRAIN_RECORDS = 150000  # the demo target's training set (held-out prompts are none of these)

WORDS = ["apple", "banana", "cherry", "strawberry", "orange", "lemon", "mango", "grape", "melon", "peach",
         "pepper", "tomato", "potato", "coffee", "letter", "bottle", "rabbit", "kitten", "puppy", "yellow",
         "purple", "summer", "winter", "school", "garden", "window", "button", "balloon", "mississippi",
         "bookkeeper", "committee", "assessment", "banana", "success", "parallel", "llama", "giraffe",
         "hippopotamus", "tennessee", "address", "pizza", "jazz", "cookie", "butter", "happy", "little",
         "middle", "spoon", "moon", "noon"]
WORDS = sorted(set(WORDS))
ITEMS = ["apple", "pear", "fig", "plum", "kiwi", "lime", "date", "cat", "dog", "bird", "fish", "cup",
         "pen", "book", "hat", "shoe", "key", "lamp", "chair", "table", "car", "bus", "ship", "star"]
PLACES = ["ones", "tens", "hundreds", "thousands", "ten-thousands"]

CHAT = [
    (["hi", "hello", "hey", "Hi!", "Hello!", "hey there", "good morning", "hi, who are you?"],
     "Hello! I am the tiny dflash demo model. Ask me to add, subtract or multiply numbers, convert units, "
     "count letters or items, sort a list or compare two numbers."),
    (["what can you do?", "What can you do?", "help", "What do you know?", "how can you help me?"],
     "I can add and subtract numbers, multiply small numbers, convert km, m, cm, kg, g, hours and minutes, "
     "count letters in a word or items in a list, sort short lists and compare numbers. Try: What is 48 + 75?"),
    (["who are you?", "Who are you?", "what are you?", "are you a real model?"],
     "I am a tiny Qwen3-style model trained by the dflash project to demonstrate DFlash speculative decoding."),
    (["thanks", "thank you", "Thanks!", "thank you very much"],
     "You are welcome! Ask me another question any time."),
    (["bye", "goodbye", "see you"],
     "Goodbye! Come back for more sums."),
]
CHAT_THOUGHTS = {0: "The user greets me. I greet back and say what I can do.",
                 1: "The user asks what I can do. I list my tasks.",
                 2: "The user asks who I am. I explain that I am a small demo model.",
                 3: "The user thanks me. I answer politely.",
                 4: "The user says goodbye. I say goodbye."}


def _digits(n: int, width: int) -> list[int]:
    return [(n // 10 ** i) % 10 for i in range(width)]


def task_add(rng: random.Random):
    a = rng.randint(1, 10 ** rng.choice([1, 2, 3, 3, 3]) - 1)
    b = rng.randint(1, 10 ** rng.choice([1, 2, 3, 3, 3]) - 1)
    q = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "What is the sum of {a} and {b}?",
                    "Add {a} and {b}.", "{a} + {b} = ?", "Calculate {a} plus {b}.", "How much is {a} + {b}?",
                    "Please add {a} to {b}."]).format(a=a, b=b)
    width = max(len(str(a)), len(str(b)))
    lines, carry = [f"Add {a} and {b} digit by digit."], 0
    for i, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width))):
        s = x + y + carry
        expr = f"{x} + {y}" + (f" + {carry}" if carry else "")
        carry = s // 10
        lines.append(f"{PLACES[i]}: {expr} = {s}, write {s % 10}, carry {carry}.")
    if carry:
        lines.append(f"{PLACES[width]}: carry {carry}, write {carry}.")
    total = a + b
    lines.append(f"So {a} + {b} = {total}.")
    return q, "\n".join(lines), f"{a} + {b} = {total}.", str(total)


def task_sub(rng: random.Random):
    a = rng.randint(10, 10 ** rng.choice([2, 3, 3, 3]) - 1)
    b = rng.randint(1, a)
    q = rng.choice(["What is {a} - {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}.", "{a} - {b} = ?",
                    "What is {a} minus {b}?", "Calculate {a} minus {b}.", "How much is {a} - {b}?",
                    "Take {b} away from {a}."]).format(a=a, b=b)
    width = len(str(a))
    lines, borrow = [f"Subtract {b} from {a} digit by digit."], 0
    for i, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width))):
        expr = f"{x} - {y}" + (f" - {borrow}" if borrow else "")
        d = x - y - borrow
        if d < 0:
            lines.append(f"{PLACES[i]}: {expr} is below 0, borrow 1: 1{expr} = {d + 10}, write {d + 10}, borrow 1.")
            borrow = 1
        else:
            lines.append(f"{PLACES[i]}: {expr} = {d}, write {d}, borrow 0.")
            borrow = 0
    diff = a - b
    lines.append(f"So {a} - {b} = {diff}.")
    return q, "\n".join(lines), f"{a} - {b} = {diff}.", str(diff)


def task_mul(rng: random.Random):
    a = rng.randint(2, 99) if rng.random() < 0.75 else rng.randint(2, 9)
    b = rng.randint(2, 9)
    if rng.random() < 0.3:
        a, b = b, a
    q = rng.choice(["What is {a} x {b}?", "What is {a} * {b}?", "Multiply {a} by {b}.", "Compute {a} times {b}.",
                    "What is the product of {a} and {b}?", "{a} x {b} = ?", "How much is {a} times {b}?"]
                   ).format(a=a, b=b)
    big, small = (a, b) if a >= b else (b, a)
    lines = [f"Multiply {big} by {small} digit by digit."]
    digits = _digits(big, len(str(big)))
    carry = 0
    for i, x in enumerate(digits):
        p = x * small + carry
        expr = f"{x} x {small} = {x * small}" + (f", {x * small} + {carry} = {p}" if carry else "")
        if i == len(digits) - 1:
            lines.append(f"{PLACES[i]}: {expr}, write {p}.")
        else:
            lines.append(f"{PLACES[i]}: {expr}, write {p % 10}, carry {p // 10}.")
            carry = p // 10
    lines.append(f"So {a} x {b} = {a * b}.")
    return q, "\n".join(lines), f"{a} x {b} = {a * b}.", str(a * b)


def task_letters(rng: random.Random):
    word = rng.choice(WORDS)
    # A letter the word lacks about a quarter of the time: at 15% the model answered "1 times" for them.
    letter = rng.choice(sorted(set(word))) if rng.random() < 0.7 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    q = rng.choice(["How many times does the letter {l} appear in {w}?", "How many {l}'s are in {w}?",
                    "Count the letter {l} in the word {w}.", "How many times is {l} in {w}?",
                    "In the word {w}, how many {l} are there?"]).format(l=letter, w=word)
    count, parts = 0, []
    for ch in word:
        if ch == letter:
            count += 1
            parts.append(f"{ch} ({count})")
        else:
            parts.append(ch)
    trace = f"Spell {word} and count each {letter}.\n" + ", ".join(parts) + f".\nSo {letter} appears {count} times."
    return q, trace, f"The letter {letter} appears {count} times in {word}.", str(count)


def task_compare(rng: random.Random):
    hi = rng.choice([99, 999, 9999])
    a, b = rng.sample(range(1, hi + 1), 2)
    larger = rng.random() < 0.6
    q = (rng.choice(["Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?", "Is {a} or {b} greater?",
                     "Which is greater, {a} or {b}?"]) if larger else
         rng.choice(["Which is smaller, {a} or {b}?", "Which number is less: {a} or {b}?",
                     "Is {a} or {b} smaller?"])).format(a=a, b=b)
    win, lose = (max(a, b), min(a, b)) if larger else (min(a, b), max(a, b))
    word = "larger" if larger else "smaller"
    big = max(a, b)
    la, lb = len(str(a)), len(str(b))
    if la != lb:
        why = f"{a} has {la} digits and {b} has {lb} digits, so {big} is larger."
    else:
        lines = [f"{a} and {b} both have {la} digits; compare from the left."]
        for i in reversed(range(la)):
            x, y = (a // 10 ** i) % 10, (b // 10 ** i) % 10
            if x == y:
                lines.append(f"{PLACES[i]}: {x} and {y} are equal.")
            else:
                lines.append(f"{PLACES[i]}: {x} and {y}, {max(x, y)} is larger, so {big} is larger.")
                break
        why = "\n".join(lines)
    return q, why, f"{win} is {word} than {lose}.", str(win)


def sort_group(tens: int, group: list[int], asc: bool) -> str:
    """One tens digit's numbers in order. Two or more are ordered by their ones digits, written out and
    sorted first: a small model copies a sorted row of single digits far more reliably than it orders
    two-digit numbers that share a first digit (75, 73 -> 75, 75 was its typical slip)."""
    shown = ", ".join(f"{x:02d}" for x in group)
    ordered = ", ".join(map(str, sorted(group, reverse=not asc)))
    if len(group) == 1:
        return f"{tens}: {shown} -> {ordered}."
    ones = [x % 10 for x in group]
    return (f"{tens}: {shown}; ones {', '.join(map(str, ones))} -> "
            f"{', '.join(map(str, sorted(ones, reverse=not asc)))} -> {ordered}.")


def task_sort(rng: random.Random):
    n = rng.randint(3, 5)
    nums: list[int] = []
    while len(nums) < n:  # one number in three has one digit: the ones the model used to lose or miscopy
        x = rng.randint(1, 9) if rng.random() < 1 / 3 else rng.randint(10, 99)
        if x not in nums:
            nums.append(x)
    asc = rng.random() < 0.7
    shown = ", ".join(map(str, nums))
    q = (rng.choice(["Sort these numbers from smallest to largest: {s}.", "Sort in ascending order: {s}.",
                     "Put these numbers in order: {s}.", "Order from least to greatest: {s}."]) if asc else
         rng.choice(["Sort these numbers from largest to smallest: {s}.", "Sort in descending order: {s}.",
                     "Order from greatest to least: {s}."])).format(s=shown)
    out = sorted(nums, reverse=not asc)
    result = ", ".join(map(str, out))
    # Every number written with two digits first: a one-digit number has no tens digit to find, and the
    # model used to drop one from the tens-0 group ("42, 7, 19, 88, 3" lost the 3). Each is rewritten
    # right after itself: written as a second list, the 7 came out as 03, copied from the wrong place.
    lines = [f"With two digits: {', '.join(f'{x} -> {x:02d}' for x in nums)}.",
             f"Go through the tens digits {'0 to 9' if asc else '9 to 0'}."]
    for tens in (range(10) if asc else range(9, -1, -1)):
        group = [x for x in nums if x // 10 == tens]
        if not group:
            lines.append(f"{tens}: none.")
        else:
            lines.append(sort_group(tens, group, asc))
    lines.append(f"So the order is {result}.")
    return q, "\n".join(lines), f"In order: {result}.", result


UNITS = [  # (from, to, factor, multiply?)
    ("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("hours", "minutes", 60),
]
UNIT_NAMES = {"km": "kilometers", "m": "meters", "cm": "centimeters", "kg": "kilograms", "g": "grams",
              "hours": "hours", "minutes": "minutes"}


def _conversion(rng: random.Random) -> dict:
    """A unit conversion question: its units, numbers, wording and answer sentence (the random draws of
    the convert task, in its order: the base corpus stays byte for byte what it was)."""
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(1, 12) if big == "hours" else rng.randint(1, 99)
    if rng.random() < 0.6:  # big -> small
        src, dst, x, y = big, small, n, n * factor
        why = f"1 {big.rstrip('s')} is {factor} {small}, so {x} {src} is {x} x {factor} = {y} {dst}."
    else:
        src, dst, x, y = small, big, n * factor, n
        why = f"1 {big.rstrip('s')} is {factor} {small}, so {x} {src} is {x} / {factor} = {y} {dst}."
    name = dict(UNIT_NAMES if rng.random() < 0.4 else {k: k for k in UNIT_NAMES})
    if x == 1:
        name[src] = name[src].removesuffix("s")
    if y == 1:
        name[dst] = name[dst].removesuffix("s")
    q = rng.choice(["Convert {x} {s} to {d}.", "How many {d} are in {x} {s}?", "What is {x} {s} in {d}?",
                    "{x} {s} is how many {d}?"]).format(x=x, s=name[src], d=name[dst])
    return {"question": q, "why": why, "sentence": f"{x} {name[src]} is {y} {name[dst]}.", "src": src, "dst": dst,
            "x": x, "y": y}


def task_convert(rng: random.Random):
    c = _conversion(rng)
    return c["question"], c["why"], c["sentence"], str(c["y"])


def task_items(rng: random.Random):
    n = rng.randint(1, 6)
    items = [rng.choice(ITEMS) for _ in range(n)]
    shown = ", ".join(items)
    q = rng.choice(["How many items are in this list: {s}?", "Count the items: {s}.",
                    "How many words are in this list: {s}?", "How many things are here: {s}?"]).format(s=shown)
    trace = ", ".join(f"{x} ({i + 1})" for i, x in enumerate(items)) + "."
    noun = "item" if n == 1 else "items"
    return q, trace, f"There {'is' if n == 1 else 'are'} {n} {noun}.", str(n)


def task_chat(rng: random.Random):
    k = rng.randrange(len(CHAT))
    prompts, reply = CHAT[k]
    return rng.choice(prompts), CHAT_THOUGHTS[k], reply, ""


MAKERS = {"add": task_add, "sub": task_sub, "mul": task_mul, "letters": task_letters, "compare": task_compare,
          "sort": task_sort, "convert": task_convert, "items": task_items, "chat": task_chat}


# The tool task (chat phase only). With the convert tool offered (the chat template's tools branch), a
# conversion question is answered with a call, `<tool_call>\n{"name": "convert", "arguments": {"value":
# "3 km", "unit": "m"}}\n</tool_call>`: `value` is the quantity as asked, number and unit symbol, `unit` the
# symbol to convert to (a bare number and one unit could not say whether 300 m goes to cm or km). The
# tool's result comes back as a `tool` message, `{"result": 3000, "unit": "m"}`, and the next assistant
# turn answers in words, with the convert task's sentence. Call turn and answer turn are separate
# records (`tool_call`, `tool_answer`), half of each in thinking mode: the demo profile chats with
# thinking on, agents mostly call without it, and a small model does in a mode only what it was shown.
TOOL_TASKS = ("tool_call", "tool_answer")
UNIT_SYMBOLS = {"km": "km", "m": "m", "cm": "cm", "kg": "kg", "g": "g", "hours": "h", "minutes": "min"}
# Short, since the template writes it into every prompt that offers it (about 100 tokens as it is).
CONVERT_TOOL = {"type": "function", "function": {"name": "convert", "description": "Convert units", "parameters": {
    "type": "object", "properties": {"value": {"type": "string"}, "unit": {"type": "string"}}}}}
UNIT_SIZES = {"km": ("length", 100000), "m": ("length", 100), "cm": ("length", 1), "kg": ("mass", 1000),
              "g": ("mass", 1), "h": ("time", 60), "min": ("time", 1)}  # each symbol in its kind's smallest unit
TOOL_THINKING_SHARE = 0.5
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def run_convert(arguments: dict) -> dict:
    """The convert tool itself: {"value": "3 km", "unit": "m"} -> {"result": 3000, "unit": "m"}; an
    unknown unit or pair gives {"error": ...} (the demo target never saw one)."""
    try:
        number, unit = str(arguments["value"]).split()
        src, dst = UNIT_SIZES[unit], UNIT_SIZES[arguments["unit"]]
        value = float(number)
    except (KeyError, ValueError, TypeError):
        return {"error": "value must be a number and a unit symbol, unit a symbol: " + ", ".join(UNIT_SIZES)}
    if src[0] != dst[0]:
        return {"error": f"cannot convert {unit} to {arguments['unit']}"}
    result = value * src[1] / dst[1]
    return {"result": int(result) if result == int(result) else round(result, 6), "unit": arguments["unit"]}


def tool_call_text(arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": "convert", "arguments": arguments}) + "\n</tool_call>"


def parse_tool_call(text: str) -> dict | None:
    """The first `<tool_call>` block of `text` as {"name", "arguments"}, or None if there is none or it is
    not a JSON object with a name and an arguments object."""
    m = TOOL_CALL.search(text)
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(call.get("arguments"), dict):
        return None
    return call


def _reply(trace: str, text: str, thinking: bool) -> str:
    return f"<think>\n{trace}\n</think>\n\n{text}" if thinking else EMPTY_THINK + text


def tool_conversation(task: str, thinking: bool, turns: int, rng: random.Random) -> dict:
    """A `tool_call` or `tool_answer` record with the convert tool offered, after `turns - 1` earlier
    exchanges of other tasks (never a conversion: with the tool offered, that is a call)."""
    others = [t for t in WEIGHTS if t != "convert"]
    history = []
    for _ in range(turns - 1):
        history += make_record(rng.choice(others), rng.random() < 0.5, rng)["messages"]
    c = _conversion(rng)
    args = {"value": f"{c['x']} {UNIT_SYMBOLS[c['src']]}", "unit": UNIT_SYMBOLS[c["dst"]]}
    messages = history + [{"role": "user", "content": c["question"]}]
    rec = {"task": task, "thinking": thinking, "intended_thinking": thinking, "tools": [CONVERT_TOOL], "turns": turns}
    if task == "tool_call":
        trace = f"The user wants {args['value']} in {args['unit']}. I call convert."
        messages.append({"role": "assistant", "content": _reply(trace, tool_call_text(args), thinking)})
        rec["answer"] = json.dumps({"name": "convert", "arguments": args})
    else:
        result = run_convert(args)
        trace = f"convert says {args['value']} is {result['result']} {result['unit']}."
        messages += [{"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": {"name": "convert", "arguments": args}}]},
                     {"role": "tool", "content": json.dumps(result)},
                     {"role": "assistant", "content": _reply(trace, c["sentence"], thinking)}]
        rec["answer"] = str(c["y"])
    rec["messages"] = messages
    return rec


def intended_thinking(task: str) -> bool:
    return task in THINK_TASKS or task == "chat"


def make_record(task: str, thinking: bool, rng: random.Random) -> dict:
    question, trace, answer_text, answer = MAKERS[task](rng)
    content = f"<think>\n{trace}\n</think>\n\n{answer_text}" if thinking else EMPTY_THINK + answer_text
    return {"task": task, "thinking": thinking, "intended_thinking": intended_thinking(task),
            "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": content}],
            "answer": answer}


def generate(n: int, seed: int, exclude: set[str] = frozenset(), intended_only: bool = False,
             tasks: tuple[str, ...] = tuple(WEIGHTS)) -> Iterator[dict]:
    """`n` records, deterministic for `seed`; prompts in `exclude` are skipped."""
    rng = random.Random(seed)
    names = list(tasks)
    weights = [WEIGHTS[t] for t in names]
    made = 0
    while made < n:
        task = rng.choices(names, weights)[0]
        mode = intended_thinking(task)
        if not intended_only and task != "chat" and rng.random() > INTENDED_SHARE:
            mode = not mode
        if task == "chat" and not intended_only:
            mode = rng.random() < 0.5
        rec = make_record(task, mode, rng)
        if rec["messages"][-2]["content"] in exclude:
            continue
        if not intended_only and rng.random() < MULTI_TURN_SHARE:  # an earlier exchange in the history
            before = make_record(rng.choice(names), rng.random() < 0.5, rng)
            rec["messages"] = before["messages"] + rec["messages"]
        made += 1
        yield rec


def heldout(n: int, seed: int, train_prompts: set[str]) -> list[dict]:
    """Checkable prompts (no chat), in each task's intended mode, none of them in the training set."""
    tasks = THINK_TASKS + DIRECT_TASKS
    per = [n // len(tasks) + (1 if i < n % len(tasks) else 0) for i in range(len(tasks))]
    out, seen = [], set(train_prompts)
    for i, (task, k) in enumerate(zip(tasks, per)):
        for rec in generate(10 * k + 100, seed * 1000 + 7919 + i, intended_only=True, tasks=(task,)):
            q = rec["messages"][-2]["content"]
            if q in seen:
                continue
            seen.add(q)
            out.append(rec)
            if sum(r["task"] == task for r in out) == k:
                break
    return out


# The chat phase: the last turn's task (the weak tasks get more) and how many turns a conversation has.
# The tool task's two records take 11 of 120 (9%): about as many calls as direct conversions, and its
# records are the longest (the tool's schema alone is about 100 tokens).
CHAT_WEIGHTS = {"add": 14, "sub": 13, "mul": 13, "letters": 12, "compare": 16, "sort": 24, "convert": 8,
                "items": 6, "chat": 3, "tool_call": 6, "tool_answer": 5}
# Percent of conversations with that many user turns. Up to 4 turns, the target of runs A-E added
# "48 + 75 = 523" at turn 8 after seven three-digit sums (issue 44): long chats are in the round now.
CHAT_TURNS = {1: 15, 2: 18, 3: 15, 4: 12, 5: 11, 6: 10, 7: 10, 8: 9}
TOOL_TURNS = {1: 60, 2: 40}  # the tool task's conversations stay short
TOOLS_OFFERED_SHARE = 0.04  # other tasks' conversations with the tool offered all the same (answered as without)
CHAT_SAME_TASK = 0.4  # chance that an earlier turn is the last turn's task with other numbers
CHAT_RECORDS = 40000


def conversation(task: str, thinking: bool, turns: int, rng: random.Random,
                 others: tuple[str, ...] = tuple(WEIGHTS)) -> dict:
    """A record whose last turn is `task` in mode `thinking`, after `turns - 1` earlier exchanges (of
    `task` with other numbers, or of any of `others`)."""
    history = []
    for _ in range(turns - 1):
        other = task if task != "chat" and rng.random() < CHAT_SAME_TASK else rng.choice(others)
        before = make_record(other, rng.random() < 0.5, rng)
        history += before["messages"]
    rec = make_record(task, thinking, rng)
    rec["messages"] = history + rec["messages"]
    rec["turns"] = turns
    return rec


def generate_chat(n: int, seed: int, exclude: set[str] = frozenset()) -> Iterator[dict]:
    """`n` chat-phase records, deterministic for `seed`; last prompts in `exclude` are skipped. A
    single-turn record keeps the base corpus's modes (intended 90%); in a longer conversation the last
    turn is in thinking mode for half of the direct tasks too (thinking is on in `make chat`). The tool
    task (`tool_conversation`) has 1-2 turns, half of them in thinking mode; a few other conversations
    offer the tool too, so that an offered tool does not turn every question into a call."""
    rng = random.Random(seed)
    names, weights = list(CHAT_WEIGHTS), list(CHAT_WEIGHTS.values())
    sizes, shares = list(CHAT_TURNS), list(CHAT_TURNS.values())
    made = 0
    while made < n:
        task = rng.choices(names, weights)[0]
        if task in TOOL_TASKS:
            turns = rng.choices(list(TOOL_TURNS), list(TOOL_TURNS.values()))[0]
            rec = tool_conversation(task, rng.random() < TOOL_THINKING_SHARE, turns, rng)
        else:
            turns = rng.choices(sizes, shares)[0]
            mode = intended_thinking(task)
            if task == "chat":
                mode = rng.random() < 0.5
            elif turns == 1 and rng.random() > INTENDED_SHARE:
                mode = not mode
            elif turns > 1 and not mode:
                mode = rng.random() < 0.5
            if task != "convert" and rng.random() < TOOLS_OFFERED_SHARE:
                rec = conversation(task, mode, min(turns, 2), rng, others=tuple(t for t in WEIGHTS if t != "convert"))
                rec["tools"] = [CONVERT_TOOL]
            else:
                rec = conversation(task, mode, turns, rng)
        if last_prompt(rec) in exclude:
            continue
        made += 1
        yield rec


def last_prompt(record: dict) -> str:
    """The last user message: what the held-out sets keep apart from training."""
    return next(m["content"] for m in reversed(record["messages"]) if m["role"] == "user")


def heldout_chat(n: int, seed: int, exclude: set[str], turns: tuple[int, int] = (2, 4)) -> list[dict]:
    """Checkable conversations of `turns` (first, last) user turns, the last turn of each task in thinking
    mode (the demo profile's default), its prompt in none of the training sets."""
    tasks = THINK_TASKS + DIRECT_TASKS
    rng = random.Random(seed)
    out, seen = [], set(exclude)
    first, span = turns[0], turns[1] - turns[0] + 1
    for i, task in enumerate(tasks):
        k = n // len(tasks) + (1 if i < n % len(tasks) else 0)
        got = 0
        while got < k:
            rec = conversation(task, True, first + got % span, rng)
            q = rec["messages"][-2]["content"]
            if q in seen:
                continue
            seen.add(q)
            rec["intended_thinking"] = True
            out.append(rec)
            got += 1
    return out


def heldout_tools(n: int, seed: int, exclude: set[str]) -> list[dict]:
    """Held-out tool conversations: calls and answers after the result in turn, each in both modes, 1-2
    turns, their conversion question in none of the training sets."""
    rng = random.Random(seed)
    out, seen = [], set(exclude)
    while len(out) < n:
        k = len(out)
        rec = tool_conversation(TOOL_TASKS[k % 2], k // 2 % 2 == 1, 1 + k // 4 % 2, rng)
        if last_prompt(rec) in seen:
            continue
        seen.add(last_prompt(rec))
        out.append(rec)
    return out


NUMBER = re.compile(r"\d+")


def final_answer(text: str) -> str:
    """The answer sentence: what follows the think block (or all of it)."""
    return text.split("</think>")[-1].strip()


def is_correct(record: dict, text: str) -> bool:
    final = final_answer(text)
    if record["task"] == "tool_call":  # one call, parseable, with the right arguments, and nothing else
        call = parse_tool_call(final)
        rest = TOOL_CALL.sub("", final).replace("<|im_end|>", "").strip()
        return call is not None and call == json.loads(record["answer"]) and not rest
    nums = NUMBER.findall(final)
    if not nums:
        return False
    task = record["task"]
    if task == "sort":
        return ", ".join(nums) == record["answer"]
    if task == "compare":
        return nums[0] == record["answer"]
    return nums[-1] == record["answer"]


def write_jsonl(path: Path, records) -> bool:
    """Write `records`; a file whose content would not change is left alone. Returns whether it changed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def build(work: Path, seed: int, n_train: int = TRAIN_RECORDS, n_heldout: int = 240) -> tuple[Path, Path]:
    """train.jsonl and heldout.jsonl under `work`. Generated on every run (seconds): a file is rewritten
    only when its content changes, and the later stages key their caches on the files' content."""
    train_path, held_path = Path(work) / "train.jsonl", Path(work) / "heldout.jsonl"
    train = list(generate(n_train, seed))
    write_jsonl(train_path, train)
    write_jsonl(held_path, heldout(n_heldout, seed + 1, {r["messages"][-2]["content"] for r in train}))
    return train_path, held_path


def build_chat(work: Path, seed: int, held_path: Path, n_train: int = CHAT_RECORDS,
               n_heldout: int = 240, n_tools: int = 48) -> "ChatFiles":
    """chat-train.jsonl and the held-out heldout-chat.jsonl (2-4 turns), heldout-long.jsonl (5-8 turns) and
    heldout-tools.jsonl under `work`, generated like `build` (rewritten only when their content changes). No
    two of them share a last prompt, nor any of them one with the single-turn held-out set."""
    work = Path(work)
    files = ChatFiles(work / "chat-train.jsonl", work / "heldout-chat.jsonl", work / "heldout-long.jsonl",
                      work / "heldout-tools.jsonl")
    single = {r["messages"][-2]["content"] for r in read_jsonl(held_path)}
    held = heldout_chat(n_heldout, seed * 1000 + 4243, single)
    write_jsonl(files.held_chat, held)
    keep_out = single | {last_prompt(r) for r in held}
    long = heldout_chat(n_heldout, seed * 1000 + 5381, keep_out, turns=(5, 8))
    write_jsonl(files.held_long, long)
    keep_out |= {last_prompt(r) for r in long}
    tools = heldout_tools(n_tools, seed * 1000 + 6151, keep_out)
    write_jsonl(files.held_tools, tools)
    write_jsonl(files.train, generate_chat(n_train, seed * 1000 + 911, keep_out | {last_prompt(r) for r in tools}))
    return files


class ChatFiles(NamedTuple):
    """The chat phase's corpus and its held-out sets."""
    train: Path
    held_chat: Path
    held_long: Path
    held_tools: Path

"""Generates the small datasets shipped in configs/data (deterministic; run from anywhere):

    python configs/data/make_data.py

Tiny synthetic string tasks a character-level model learns quickly, so the loss clearly goes
down in a few hundred steps on CPU:

    reverse(abc)=   -> cba        upper(abc)=  -> ABC        sort(cab)=  -> abc
    add(12,34)=     -> 46         len(abcd)=   -> 4

- sft_train.jsonl / sft_dev.jsonl: PaddleNLP SFT format {"src", "tgt"}; about 10% are two-round
  conversations (src and tgt lists).
- pref_train.jsonl / pref_dev.jsonl: PaddleNLP preference format {"src", "tgt", "response",
  "sort"} (sort: larger = better; the order of the two responses is random). The rejected answer
  is a plausible mistake (not reversed, lower case, unsorted, off by one, ...), used by DPO and RM.
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _word(rng, lo=3, hi=9):
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(lo, hi)))


def task(rng):
    """(prompt, correct answer, wrong answer)"""
    kind = rng.choice(["reverse", "upper", "sort", "add", "len"])
    if kind == "reverse":
        w = _word(rng)
        while w == w[::-1]:
            w = _word(rng)
        return f"reverse({w})=", w[::-1], w
    if kind == "upper":
        w = _word(rng)
        return f"upper({w})=", w.upper(), w[0].upper() + w[1:]
    if kind == "sort":
        w = _word(rng)
        while "".join(sorted(w)) == w:
            w = _word(rng)
        return f"sort({w})=", "".join(sorted(w)), w
    if kind == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"add({a},{b})=", str(a + b), str(a + b + rng.choice([-10, -1, 1, 10]))
    w = _word(rng, 1, 12)
    return f"len({w})=", str(len(w)), str(len(w) + rng.choice([-1, 1]))


def sft_example(rng):
    if rng.random() < 0.1:
        (p1, a1, _), (p2, a2, _) = task(rng), task(rng)
        return {"src": [p1, p2], "tgt": [a1, a2]}
    p, a, _ = task(rng)
    return {"src": p, "tgt": a}


def pref_example(rng):
    p, good, bad = task(rng)
    if rng.random() < 0.5:
        return {"src": p, "tgt": [], "response": [good, bad], "sort": [1, 0]}
    return {"src": p, "tgt": [], "response": [bad, good], "sort": [0, 1]}


def write(name, make, n, seed):
    rng = random.Random(seed)
    path = os.path.join(HERE, name)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps(make(rng)) + "\n")
    return path


def main():
    for args in [("sft_train.jsonl", sft_example, 2000, 1), ("sft_dev.jsonl", sft_example, 100, 2),
                 ("pref_train.jsonl", pref_example, 1000, 3), ("pref_dev.jsonl", pref_example, 100, 4)]:
        print("wrote", write(*args))


if __name__ == "__main__":
    main()

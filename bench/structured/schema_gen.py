"""Random JSON schemas for the structured-output tests: nested objects, arrays, enums, required
fields, string patterns, numbers with bounds. `random_schema(seed)` is a pure function of the
seed, so a failing schema is reproduced by its number."""
from __future__ import annotations

import random

WORDS = ["id", "name", "path", "size", "mode", "owner", "tags", "items", "kind", "level",
         "count", "ratio", "enabled", "label", "version", "parent", "children", "meta", "score",
         "title", "url", "lines", "status", "config"]
PATTERNS = ["^[a-z]{2,8}$", "^[A-Z][a-z]+$", "^[0-9]{3}-[0-9]{4}$", "^v[0-9]+\\.[0-9]+$",
            "^[a-z_][a-z0-9_]*$", "^(GET|POST|PUT)$"]


def _leaf(rng: random.Random, bounded: bool) -> dict:
    kind = rng.choice(["string", "string", "pattern", "enum", "integer", "number", "boolean"])
    if kind == "string":
        s = {"type": "string"}
        if rng.random() < 0.5 or bounded:
            s["maxLength"] = rng.randint(1, 24)
        if rng.random() < 0.2:
            s["minLength"] = 1
        return s
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "io", "net", "cpu", "low", "high",
                                    "none", "all"], rng.randint(1, 4))}
    if kind == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.5:
            s["minimum"] = rng.randint(-10, 10)
            s["maximum"] = s["minimum"] + rng.randint(0, 1000)
        return s
    if kind == "number":
        return {"type": "number"}
    return {"type": "boolean"}


def _node(rng: random.Random, depth: int, bounded: bool) -> dict:
    r = rng.random()
    if depth > 0 and r < 0.3:
        return _object(rng, depth - 1, bounded)
    if depth > 0 and r < 0.5:
        arr = {"type": "array", "items": _node(rng, depth - 1, bounded)}
        if rng.random() < 0.7:
            arr["maxItems"] = rng.randint(1, 4)
        if rng.random() < 0.3:
            arr["minItems"] = 1
        return arr
    return _leaf(rng, bounded)


def _object(rng: random.Random, depth: int, bounded: bool) -> dict:
    names = rng.sample(WORDS, rng.randint(1, 5))
    props = {n: _node(rng, depth, bounded) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    schema = {"type": "object", "properties": props, "required": required}
    if rng.random() < 0.8:
        schema["additionalProperties"] = False
    return schema


def random_schema(seed: int, depth: int = 3, bounded: bool = False) -> dict:
    """`bounded`: every free string has a maxLength (greedy decoding of a small model repeats
    itself inside an unbounded string until max_tokens; sampling does not)."""
    return _object(random.Random(seed), depth, bounded)

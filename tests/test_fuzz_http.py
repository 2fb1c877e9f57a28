"""Fuzz the HTTP API (issue 13): random and mutated JSON bodies against every endpoint, generated
(hypothesis) from the OpenAPI description the gateway serves at GET /openapi.json: values inside
each field's schema (edges included), just outside it (one past a bound, one item too many), of
the wrong type, or random JSON; then byte mutations. Every field, nested ones included (a
message's role, a logit_bias value, a prompt's items), is drawn the same way, so a wrong type
can sit at any depth. Zero 5xx, every error in the OpenAI shape, and the service healthy
afterwards with every KV block back in the pool.

Random draws rarely put one given edge (10**400) in one given nested field, so a second test
sweeps them all: every field the description names, nested included, gets a value of every JSON
type (with its edges), in an otherwise valid body (issue 27: a logit_bias value past the float
range and a list as a message's role were 500s that the random fuzz had not drawn).

CI runs FUZZ_HTTP_BODIES (default 1,000) bodies and the sweep; `scripts/fuzz_long.sh` runs
10,000 random bodies.
"""
from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.backend_pool import PoolConfig


def error_fields(path: str) -> set[str]:
    """The error object's fields: Anthropic's shape on /v1/messages, OpenAI's elsewhere."""
    if path.startswith("/v1/messages"):
        return {"type", "message"}
    return {"message", "type", "param", "code"}


NUM_BODIES = int(os.environ.get("FUZZ_HTTP_BODIES", "1000"))
CONCURRENCY = 16
MAX_ITEMS = 4  # arrays drawn inside a schema are this long at most (its edge aside, if small)

surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.one_of(st.text(max_size=12), st.text(alphabet=surrogate, min_size=1, max_size=2),
                  st.sampled_from(["", "def f(x):", "\x00", "ü€😀", "a" * 300]))
ints = st.one_of(st.integers(-3, 70), st.integers(), st.sampled_from(
    [2**31, 2**31 - 1, -(2**31) - 1, 2**32, 2**63, -(2**63) - 1, 2**64, 10**400]))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-3, 3))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)), max_leaves=8)
# one value of each JSON type, equally likely (json_values favours scalars)
every_type = st.one_of(st.none(), st.booleans(), ints, floats, texts,
                       st.lists(json_values, max_size=3),
                       st.dictionaries(st.one_of(texts, st.integers(0, 300).map(str)),
                                       json_values, max_size=3))


def field(schema: dict, nested: bool = True) -> st.SearchStrategy:
    """A field's value: mostly inside its schema, else just outside it or of another JSON type.
    Nested fields (an item, a property, a map's value) are drawn by this too."""
    def pick(how: int) -> st.SearchStrategy:
        if how < (8 if nested else 7):
            return inside(schema)
        return outside(schema) if how < 9 else every_type
    return st.integers(0, 9).flatmap(pick)


def inside(schema: dict) -> st.SearchStrategy:
    """Values the schema allows, its edges among them."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of(*(inside(s) for s in schema["anyOf"]))
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of(*(inside({**schema, "type": k}) for k in kind))
    if kind in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum")
        exclusive = "exclusiveMinimum" in schema
        if kind == "integer":
            lo = None if lo is None else lo + exclusive
            edges = [v for v in (lo, hi) if v is not None]
            return st.one_of(st.integers(lo, hi), st.sampled_from(edges or [0]))
        edges = [v for v in (None if exclusive else lo, hi) if v is not None]
        values = st.floats(lo, hi, exclude_min=exclusive, allow_nan=False, allow_infinity=False)
        return st.one_of(values, st.sampled_from(edges)) if edges else values
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "string":
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        short = st.text(min_size=lo, max_size=max(lo, min(hi or 12, 12)))
        return st.one_of(short, st.just("x" * hi)) if hi else short
    if kind == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        items = field(schema.get("items", {}))
        lists = st.lists(items, min_size=lo, max_size=max(lo, min(hi if hi is not None else
                                                                  MAX_ITEMS, MAX_ITEMS)))
        if hi is not None and MAX_ITEMS < hi <= 16:
            lists = st.one_of(lists, st.lists(items, min_size=hi, max_size=hi))
        return lists
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):  # a map: keys by propertyNames (digit strings here)
            return st.dictionaries(st.integers(0, 300).map(str), field(extra), max_size=3)
        props = schema.get("properties", {})
        required = [k for k in schema.get("required", ()) if k in props]
        return st.fixed_dictionaries({k: field(props[k]) for k in required},
                                     optional={k: field(v) for k, v in props.items()
                                               if k not in required})
    return json_values  # no type: anything (a field we accept only at its neutral value)


def outside(schema: dict) -> st.SearchStrategy:
    """Values just past the schema: one beyond a bound, one item or character too many, the
    wrong type."""
    options = [json_values, every_type]
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    step = 1 if schema.get("type") == "integer" else 1e-9
    if lo is not None:
        options.append(st.just(lo if "exclusiveMinimum" in schema else lo - step))
    if schema.get("maximum") is not None:
        options.append(st.just(schema["maximum"] + step))
    if schema.get("maxLength") is not None:
        options.append(st.just("y" * (schema["maxLength"] + 1)))
    if schema.get("maxItems") is not None and schema["maxItems"] <= 1024:
        options.append(st.just([1] * (schema["maxItems"] + 1)))
    for sub in schema.get("anyOf", ()):
        options.append(outside(sub))
    return st.one_of(*options)


@st.composite
def bodies(draw, operations: list[tuple[str, str, dict | None]]):
    """(method, path, raw body) for one of `operations` (with its body schema, or None)."""
    method, path, schema = draw(st.sampled_from(operations))
    body: dict = {}
    if schema is not None:
        props = schema["properties"]
        names = draw(st.lists(st.sampled_from(sorted(props)), max_size=8, unique=True))
        for name in [*schema["required"], *names]:
            if name in schema["required"] and draw(st.integers(0, 9)) == 0:
                continue  # a required field left out, now and then
            body[name] = draw(field(props[name], nested=False))
    body.update(draw(st.dictionaries(texts, json_values, max_size=2)))
    raw = json.dumps(body, ensure_ascii=draw(st.booleans()), allow_nan=True).encode("utf-8",
                                                                                    "surrogatepass")
    mutation = draw(st.sampled_from(["none", "none", "none", "flip", "cut", "insert", "wrap"]))
    if mutation == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1:]
    elif mutation == "cut":
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif mutation == "insert":
        i = draw(st.integers(0, len(raw)))
        raw = raw[:i] + draw(st.binary(max_size=4)) + raw[i:]
    elif mutation == "wrap":
        raw = json.dumps([json.loads(raw)] if draw(st.booleans()) else "x").encode()
    return method, path, raw


def operations_of(doc: dict) -> list[tuple[str, str, dict | None]]:
    """Every operation the description lists (with its JSON body schema), and less often each
    route with a method it does not take, and a path that does not exist."""
    ops, wrong = [], [("GET", "/nope", None)]
    for path, methods in sorted(doc["paths"].items()):
        for method, op in sorted(methods.items()):
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            ops.append((method.upper(), path, body["schema"] if body else None))
        wrong.append(("DELETE" if "delete" not in methods else "PATCH", path, None))
    return ops * 4 + wrong  # mostly the real operations


def generate(n: int, doc: dict) -> list[tuple[str, str, bytes]]:
    """n examples from the hypothesis strategy (generation only; each is checked below)."""
    out: list[tuple[str, str, bytes]] = []

    @seed(int(os.environ.get("FUZZ_SEED", "13")))
    @settings(max_examples=n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(bodies(operations_of(doc)))
    def collect(example):
        out.append(example)

    collect()
    return out


@pytest.fixture
async def backend():
    # short context and fast steps: a valid fuzzed request costs at most ~64 cheap tokens
    b = await FakeBackend(ipc_address(), max_model_len=64, step_s=0.0005).start()
    yield b
    await b.stop()


async def test_fuzzed_bodies_never_get_a_5xx(aiohttp_client, backend):
    # The fake backend shares this event loop: under 16 concurrent requests on a busy machine
    # its heartbeat can come late, and a backend marked down makes 502/503s that are about the
    # test's loop, not about input. The fuzz is about input, so the heartbeat window is wide.
    pool = PoolConfig(heartbeat_timeout_s=60.0, hello_interval_s=0.1)
    client = await aiohttp_client(create_app(make_config(backend.address, pool=pool,
                                                         request_timeout_s=60.0),
                                             startup_wait_s=5.0))
    resp = await client.get("/openapi.json")  # what we fuzz is what the gateway describes
    assert resp.status == 200
    examples = generate(NUM_BODIES, await resp.json())
    rng = random.Random(13)
    statuses: dict[int, int] = {}
    failures = []

    async def one(method: str, path: str, raw: bytes) -> None:
        headers = {"Content-Type": rng.choice(["application/json", "text/plain", ""])}
        resp = await client.request(method, path, data=raw, headers=headers)
        body = await resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        if resp.status >= 500 or b'"server_error"' in body:
            failures.append((path, raw[:300], resp.status, body[:300]))
        elif resp.status >= 400:
            err = json.loads(body)["error"]
            assert set(err) == error_fields(path), body

    sem = asyncio.Semaphore(CONCURRENCY)

    async def bounded(ex):
        async with sem:
            await one(*ex)

    await asyncio.gather(*(bounded(ex) for ex in examples))
    routes = {(m, p) for m, p, _ in examples}
    print(f"\nfuzzed {len(examples)} bodies over {len(routes)} routes/methods; statuses "
          f"{dict(sorted(statuses.items()))}")
    for failure in failures[:5]:
        print("5xx:", failure)
    assert len(examples) >= NUM_BODIES * 0.95  # hypothesis may stop early on a tiny space
    assert not failures, failures[:5]
    # healthy afterwards, and every fake KV block is back
    resp = await client.get("/health")
    assert resp.status == 200
    resp = await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 3})
    assert resp.status == 200
    for _ in range(200):
        if not backend.running:
            break
        await asyncio.sleep(0.02)
    assert not backend.running and backend.num_free_blocks == backend.num_total_blocks


# --- the sweep: every field, nested included, gets every JSON type ------------------------------
# Edges of each JSON type: the integers past int64 and past the float range, NaN and the
# infinities (json.dumps writes them; the body parser must refuse or take them), a lone
# surrogate, empty and nested containers.
TYPE_EDGES = {
    "null": [None],
    "boolean": [True, False],
    "integer": [-1, 2**63, 10**400, -(10**400)],
    "number": [0.5, float("nan"), float("inf"), -1e308],
    "string": ["", "\ud800", "x" * 300],
    "array": [[], [None, {"a": [10**400]}]],
    "object": [{}, {"a": 10**400, "5": "x"}],
}


def minimal(schema: dict):
    """A small value the schema allows (the sweep's valid surroundings)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][-1]
    if "anyOf" in schema:
        return minimal(schema["anyOf"][0])
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum")
        value = 1 if lo is None else lo + ("exclusiveMinimum" in schema)
        return value if hi is None else min(value, hi)
    if kind == "string":
        return "a" * max(1, schema.get("minLength", 0))
    if kind == "boolean":
        return False
    if kind == "array":
        return [minimal(schema.get("items", {}))] * schema.get("minItems", 0)
    if kind == "object":
        props = schema.get("properties", {})
        return {k: minimal(props[k]) for k in schema.get("required", ()) if k in props}
    return None


def field_paths(schema: dict, path: tuple = ()):
    """Every place in `schema` a value can sit: (("prop", name) | ("item",) | ("value",) |
    ("any", i)) steps from the top."""
    if path:
        yield path
    for i, sub in enumerate(schema.get("anyOf", ())):
        yield from (p for p in field_paths(sub, (*path, ("any", i))) if p != (*path, ("any", i)))
    kind = schema.get("type")
    if kind == "array" and "items" in schema:
        yield from field_paths(schema["items"], (*path, ("item",)))
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            yield from field_paths(extra, (*path, ("value",)))
        for name, sub in sorted(schema.get("properties", {}).items()):
            yield from field_paths(sub, (*path, ("prop", name)))


def place(schema: dict, path: tuple, leaf):
    """A value of `schema` holding `leaf` at `path`, valid around it."""
    if not path:
        return leaf
    step, rest = path[0], path[1:]
    if step[0] == "any":
        return place(schema["anyOf"][step[1]], rest, leaf)
    if step[0] == "item":
        return [place(schema["items"], rest, leaf)] + \
            [minimal(schema["items"])] * (schema.get("minItems", 1) - 1)
    if step[0] == "value":
        return {"5": place(schema["additionalProperties"], rest, leaf)}
    props = schema.get("properties", {})
    out = {k: minimal(props[k]) for k in schema.get("required", ()) if k in props}
    out[step[1]] = place(props[step[1]], rest, leaf)
    return out


def path_name(path: tuple) -> str:
    return "".join(f".{s[1]}" if s[0] == "prop" else "[]" if s[0] == "item" else
                   "{}" if s[0] == "value" else "" for s in path).lstrip(".")


def sweep(doc: dict) -> list[tuple[str, str, bytes]]:
    """(path, field, body) for every JSON-body operation, field (nested too) and JSON type."""
    out = []
    for path, op in sorted(doc["paths"].items()):
        body = op.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            continue
        schema = body["schema"]
        for where in dict.fromkeys(field_paths(schema)):
            for edges in TYPE_EDGES.values():
                for leaf in edges:
                    value = place(schema, where, leaf)
                    if "max_tokens" in schema["properties"] and "max_tokens" not in value:
                        value["max_tokens"] = 2  # a valid one stays cheap
                    raw = json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")
                    out.append((path, path_name(where), raw))
    return out


async def test_every_field_gets_every_json_type(aiohttp_client, backend):
    pool = PoolConfig(heartbeat_timeout_s=60.0, hello_interval_s=0.1)
    client = await aiohttp_client(create_app(make_config(backend.address, pool=pool,
                                                         request_timeout_s=60.0),
                                             startup_wait_s=5.0))
    doc = await (await client.get("/openapi.json")).json()
    cases = sweep(doc)
    fields = {(p, f) for p, f, _ in cases}
    # nested fields are in the sweep: a message's role, a logit_bias value, a prompt's items
    for nested in (("/v1/chat/completions", "messages[].role"),
                   ("/v1/completions", "logit_bias{}"), ("/tokenize", "messages[].role"),
                   ("/v1/completions", "prompt[][]")):
        assert nested in fields, sorted(f for p, f in fields if p == nested[0])
    failures, statuses = [], {}
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(path: str, name: str, raw: bytes) -> None:
        async with sem:
            resp = await client.post(path, data=raw, headers={"Content-Type": "application/json"})
            body = await resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        if resp.status == 504 and b'"deadline_exceeded"' in body:
            pass  # a deadline_ms of 0.5 ms passed: the 504 the client asked for
        elif resp.status >= 500 or b'"server_error"' in body:
            failures.append((path, name, raw[:200], resp.status, body[:200]))
        elif resp.status >= 400:
            err = json.loads(body)["error"]
            assert set(err) == error_fields(path), body

    await asyncio.gather(*(one(*c) for c in cases))
    print(f"\nswept {len(fields)} fields x {sum(map(len, TYPE_EDGES.values()))} values "
          f"({len(cases)} bodies); statuses {dict(sorted(statuses.items()))}")
    for failure in failures[:8]:
        print("5xx:", failure)
    assert not failures, failures[:5]
    assert statuses.get(200, 0) > len(fields)  # valid surroundings: many bodies are served
    for _ in range(200):
        if not backend.running:
            break
        await asyncio.sleep(0.02)
    assert not backend.running and backend.num_free_blocks == backend.num_total_blocks

"""Structured-output request fields -> one `GrammarSpec` (or None), and its check.

The ways a request may constrain its output, each a 400 naming the parameter when malformed:

    response_format       {"type": "text" | "json_object"}, {"type": "json_schema",
                          "json_schema": {"name", "schema", "strict", "description"}}  (OpenAI)
    structured_outputs    {"json" | "regex" | "choice" | "grammar" | "json_object": ...} (vLLM)
    guided_json / guided_regex / guided_choice / guided_grammar                  (vLLM, older)

At most one of them may be set (plus a forced tool choice, which is a grammar of its own).
`check_grammar` compiles the spec with the same engine the backend runs (tokenizer.grammar), so
a bad schema, an unsupported feature or a bad regex is a 400 before anything is queued.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass
from typing import Any

from gateway.body_checks import check_text
from gateway.errors import bad_request
from gateway.structured_schema import BACKEND_NAMES
from gateway.tools import ToolConfig, parse_tools, tool_grammar
from proto import tidegate_pb2 as pb
from tokenizer.grammar import GrammarCompiler, GrammarError, GrammarSpec, load_tokenizer

MAX_CHOICES = 1024


def _schema(value: Any, param: str) -> GrammarSpec:
    """A JSON schema given as an object or as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise bad_request(f"'{param}' is not valid JSON: {exc}.", param) from None
    if isinstance(value, bool):  # true / false are schemas too, but not ones worth serving
        raise bad_request(f"'{param}' must be a JSON schema object.", param)
    if not isinstance(value, dict):
        raise bad_request(f"'{param}' must be a JSON schema (an object).", param)
    return GrammarSpec.json_schema(value)


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{param}' must be a non-empty string.", param)
    return value


def _choices(value: Any, param: str) -> GrammarSpec:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise bad_request(f"'{param}' must be a non-empty array of strings.", param)
    if len(value) > MAX_CHOICES:
        raise bad_request(f"'{param}' has {len(value)} choices; at most {MAX_CHOICES}.", param)
    if any(not c for c in value):
        raise bad_request(f"'{param}' must not contain an empty string.", param)
    return GrammarSpec.choice(value)


def closed_objects(schema: Any) -> Any:
    """`schema` with `"additionalProperties": false` on every object schema that has
    `properties` and does not set additionalProperties (or patternProperties) itself."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) if k not in ("const", "enum", "default", "examples") else v
           for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
            and "patternProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _response_format(fmt: Any) -> GrammarSpec | None:
    param = "response_format"
    if not isinstance(fmt, dict):
        raise bad_request(f"'{param}' must be an object.", param)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind == "json_schema":
        js = fmt.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request(f"'{param}.json_schema' is required for type json_schema.",
                              f"{param}.json_schema")
        name = js.get("name")
        if name is not None and not isinstance(name, str):
            raise bad_request(f"'{param}.json_schema.name' must be a string.",
                              f"{param}.json_schema.name")
        if js.get("strict") is not None and not isinstance(js.get("strict"), bool):
            raise bad_request(f"'{param}.json_schema.strict' must be a boolean.",
                              f"{param}.json_schema.strict")
        # strict or not, the output is held to the schema (a grammar cannot half-follow one);
        # strict also closes every object that does not say otherwise (OpenAI's strict mode
        # requires it, XGrammar's strict_mode and vLLM's disable_additional_properties do it)
        schema = js.get("schema", {"type": "object"})
        if js.get("strict") is True and isinstance(schema, dict):
            schema = closed_objects(schema)
        return _schema(schema, f"{param}.json_schema.schema")
    raise bad_request(f"'{param}.type' must be one of text, json_object, json_schema; got "
                      f"{kind!r}.", f"{param}.type")


def _structured_outputs(so: Any) -> tuple[GrammarSpec, str] | None:
    param = "structured_outputs"
    if not isinstance(so, dict):
        raise bad_request(f"'{param}' must be an object.", param)
    found = []
    for key, value in so.items():
        if value is None or key in ("disable_any_whitespace", "disable_fallback",
                                    "disable_additional_properties", "whitespace_pattern",
                                    "backend"):
            continue
        p = f"{param}.{key}"
        if key == "json":
            if so.get("disable_additional_properties") is True and isinstance(value, dict):
                value = closed_objects(value)
            found.append((_schema(value, p), p))
        elif key == "regex":
            found.append((GrammarSpec("regex", _string(value, p)), p))
        elif key == "choice":
            found.append((_choices(value, p), p))
        elif key == "grammar":
            found.append((GrammarSpec("grammar", _string(value, p)), p))
        elif key == "json_object":
            if value is not True:
                raise bad_request(f"'{p}' must be true when set.", p)
            found.append((GrammarSpec("json_object"), p))
        else:
            raise bad_request(f"'{p}' is not supported (json, regex, choice, grammar, "
                              "json_object are).", p, "unsupported_parameter")
    if len(found) > 1:
        raise bad_request(f"'{param}' may set only one of json, regex, choice, grammar, "
                          "json_object.", param)
    if so.get("whitespace_pattern") is not None:
        raise bad_request(f"'{param}.whitespace_pattern' is not supported (JSON is written "
                          "with fixed separators).", f"{param}.whitespace_pattern",
                          "unsupported_parameter")
    return found[0] if found else None


def parse_structured(body: dict) -> tuple[GrammarSpec | None, str | None]:
    """(the request's grammar or None, the parameter it came from)."""
    specs: list[tuple[GrammarSpec, str]] = []
    if body.get("response_format") is not None:
        spec = _response_format(body["response_format"])
        if spec is not None:
            specs.append((spec, "response_format.json_schema.schema"
                          if spec.kind == "json_schema" else "response_format"))
    if body.get("structured_outputs") is not None:
        found = _structured_outputs(body["structured_outputs"])
        if found is not None:
            specs.append(found)
    for name, make in (("guided_json", _schema),
                       ("guided_regex", lambda v, p: GrammarSpec("regex", _string(v, p))),
                       ("guided_choice", _choices),
                       ("guided_grammar", lambda v, p: GrammarSpec("grammar", _string(v, p)))):
        if body.get(name) is not None:
            specs.append((make(body[name], name), name))
    backend = body.get("guided_decoding_backend")
    if backend is not None and backend not in BACKEND_NAMES:
        raise bad_request(f"'guided_decoding_backend' must be one of {', '.join(BACKEND_NAMES)} "
                          "(the grammar engine is llguidance whichever is named).",
                          "guided_decoding_backend")
    if body.get("guided_whitespace_pattern") is not None:
        raise bad_request("'guided_whitespace_pattern' is not supported (JSON is written with "
                          "fixed separators).", "guided_whitespace_pattern",
                          "unsupported_parameter")
    if len(specs) > 1:
        names = [p.split(".")[0] for _, p in specs]
        raise bad_request(f"Only one structured-output constraint may be set; got "
                          f"{', '.join(names)}.", names[1])
    if not specs:
        return None, None
    spec, param = specs[0]
    check_text(spec.text, param)  # a lone surrogate ("\\ud800") is no text a grammar can hold
    return spec, param


_compilers: dict[tuple[str, int, tuple[int, ...]], GrammarCompiler] = {}
# per gateway, as its tokenizer bundle is (Gateway.bundle): the key above hashes the whole
# tokenizer.json, which protobuf hands out as a new string on every read
_by_gateway: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiler_for(tokenizer_json: str, vocab_size: int, eos: tuple[int, ...]) -> GrammarCompiler:
    """One compiler (and its cache) per vocabulary this process serves."""
    key = (tokenizer_json, vocab_size, eos)
    comp = _compilers.get(key)
    if comp is None:
        if len(_compilers) >= 4:  # a gateway serves one model; tests make several
            _compilers.clear()
        comp = _compilers[key] = GrammarCompiler(load_tokenizer(tokenizer_json, vocab_size, eos))
    return comp


def gateway_compiler(gw) -> GrammarCompiler:
    comp = _by_gateway.get(gw)
    if comp is None:
        info = gw.info
        comp = _by_gateway[gw] = compiler_for(info.tokenizer_json, info.vocab_size or 0,
                                              tuple(info.eos_token_ids))
    return comp


async def check_grammar(gw, spec: GrammarSpec | None, param: str | None) -> None:
    """400 naming `param` when the backend could not run `spec`. Compiled on a worker thread
    (a large schema takes milliseconds); results are cached per spec. Without a tokenizer here
    (OpenAI-compatible HTTP backends, no --tokenizer) the grammar goes to the server unchecked,
    as vLLM's structured_outputs (gateway.http_backend)."""
    if spec is None:
        return
    if gw.passes_text:  # an HTTP backend and no tokenizer here: the server checks it
        return
    comp = gateway_compiler(gw)
    try:
        await asyncio.get_running_loop().run_in_executor(None, comp.compile, spec)
    except GrammarError as exc:
        raise bad_request(f"'{param}' cannot be used for structured output: {exc}", param,
                          "invalid_grammar") from None


@dataclass(frozen=True, slots=True)
class Structured:
    """What a request asked of its output's shape: the grammar the backend enforces (from a
    structured-output field or a forced tool choice), the field it came from (named by a 400),
    and the tool configuration (chat only)."""

    grammar: GrammarSpec | None
    param: str | None
    tools: ToolConfig | None = None


def parse_request_structured(body: dict, chat: bool) -> Structured | None:
    """The request's Structured, or None when it asks for nothing of the kind."""
    spec, param = parse_structured(body)
    tools = parse_tools(body) if chat else None
    if tools is not None and tools.forced:
        if spec is not None:
            top = param.split(".")[0]
            raise bad_request(f"'{top}' cannot be combined with a forced 'tool_choice' (the "
                              "call's arguments are already held to their schema).", top)
        spec, param = tool_grammar(tools), "tools"
    if spec is None and tools is None:
        return None
    return Structured(spec, param, tools)


async def check_structured(gw, structured: Structured | None) -> None:
    if structured is not None:
        await check_grammar(gw, structured.grammar, structured.param)


def structured_outputs_field(grammar: pb.Grammar) -> dict | None:
    """A wire grammar as vLLM's `structured_outputs` request field (for an OpenAI-compatible
    HTTP backend, gateway.http_backend); None for none."""
    kind, text = grammar.kind, grammar.text
    if kind == pb.Grammar.JSON_SCHEMA:
        return {"json": json.loads(text)}
    if kind == pb.Grammar.JSON_OBJECT:
        return {"json_object": True}
    if kind == pb.Grammar.REGEX:
        return {"regex": text}
    if kind == pb.Grammar.CHOICE:
        return {"choice": json.loads(text)}
    if kind == pb.Grammar.GRAMMAR:
        return {"grammar": text}
    return None

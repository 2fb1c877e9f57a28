"""The JSON Schemas (for GET /openapi.json and the fuzzer) of the structured-output and
tool-calling request fields; `gateway.structured` and `gateway.tools` parse them."""
from __future__ import annotations

STRUCTURED_FIELDS = frozenset({
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"})
TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
# the engine is llguidance whatever the request names; these names are accepted for vLLM clients
BACKEND_NAMES = ("auto", "guidance", "llguidance", "xgrammar", "outlines", "lm-format-enforcer")

_SCHEMA = {"type": "object", "description": "A JSON schema."}
_CHOICES = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}


def structured_schemas() -> dict[str, dict]:
    function = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,64}$"},
        "description": {"type": "string"}, "parameters": _SCHEMA,
        "strict": {"type": "boolean"}}}
    return {
        "response_format": {"anyOf": [
            {"type": "object", "required": ["type"],
             "properties": {"type": {"enum": ["text", "json_object"]}}},
            {"type": "object", "required": ["type", "json_schema"], "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {"type": "object", "properties": {
                    "name": {"type": "string"}, "description": {"type": "string"},
                    "schema": _SCHEMA, "strict": {"type": "boolean"}}}}}],
            "description": "Structured output: any JSON object, or JSON valid against a "
                           "schema (enforced by a grammar, strict or not)."},
        "structured_outputs": {"type": "object", "maxProperties": 1, "properties": {
            "json": {"anyOf": [_SCHEMA, {"type": "string"}]}, "regex": {"type": "string"},
            "choice": _CHOICES, "grammar": {"type": "string"}, "json_object": {"const": True}},
            "description": "vLLM's structured outputs: exactly one of json, regex, choice, "
                           "grammar (Lark or GBNF), json_object."},
        "guided_json": {"anyOf": [_SCHEMA, {"type": "string"}],
                        "description": "vLLM (older): output valid against this schema."},
        "guided_regex": {"type": "string", "description": "Output matching this regex."},
        "guided_choice": {**_CHOICES, "description": "Output is exactly one of these strings."},
        "guided_grammar": {"type": "string",
                           "description": "Output in this grammar (Lark or GBNF)."},
        "guided_decoding_backend": {"enum": list(BACKEND_NAMES), "description": "Accepted; the "
                                    "engine is llguidance whichever is named."},
        "guided_whitespace_pattern": {"type": "null", "description": "Not supported."},
        "tools": {"type": "array", "maxItems": 128, "items": {
            "type": "object", "required": ["function"], "properties": {
                "type": {"const": "function"}, "function": function}},
            "description": "Functions the model may call (generic format: gateway/tools.py)."},
        "tool_choice": {"anyOf": [
            {"enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "required": ["name"],
                             "properties": {"name": {"type": "string"}}}}}],
            "description": "required / a named function: enforced by a grammar; auto: the "
                           "model's output is parsed for calls."},
    }

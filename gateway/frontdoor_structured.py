"""Structured output at the ZMQ front door (issue 29): a request's grammar read from the wire and
checked by the HTTP API's own code, so a client gets the same 400s, as
Error{INVALID_REQUEST, message, param}.

    GenerateRequest.structured_fields   the HTTP names as one JSON object (what gateway.client
                                        sends: response_format, structured_outputs, guided_*)
                                        -> gateway.structured.parse_structured, as a body's
    GenerateRequest.sampling.grammar    the wire's own Grammar{kind, text} (a client of the bare
                                        protocol) -> the same per-kind checks, param "grammar"

Either way the spec is then compiled against the backend's vocabulary off the event loop
(gateway.structured.check_grammar, cached per spec) before the request is queued, as an HTTP
request's is. At most one of the two may be set.
"""
from __future__ import annotations

import json

from gateway.body_checks import check_text
from gateway.errors import bad_request
from gateway.structured import _choices, _schema, _string, parse_structured
from gateway.structured_schema import STRUCTURED_FIELDS
from proto import tidegate_pb2 as pb
from tokenizer.grammar import GrammarSpec

FIELDS_PARAM = "structured_fields"
GRAMMAR_PARAM = "grammar"


def _from_fields(text: str) -> tuple[GrammarSpec | None, str | None]:
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise bad_request(f"'{FIELDS_PARAM}' is not valid JSON: {exc}.", FIELDS_PARAM) from None
    if not isinstance(fields, dict):
        raise bad_request(f"'{FIELDS_PARAM}' must be a JSON object of structured-output fields.",
                          FIELDS_PARAM)
    for name in fields:
        if name not in STRUCTURED_FIELDS:
            raise bad_request(f"'{name}' is not a structured-output field (those are "
                              f"{', '.join(sorted(STRUCTURED_FIELDS))}).", name,
                              "unsupported_parameter")
    return parse_structured(fields)


def _from_grammar(g: pb.Grammar) -> GrammarSpec | None:
    p = GRAMMAR_PARAM
    if g.kind == pb.Grammar.JSON_SCHEMA:
        spec = _schema(g.text, p)
    elif g.kind == pb.Grammar.JSON_OBJECT:
        spec = GrammarSpec("json_object")
    elif g.kind == pb.Grammar.REGEX:
        spec = GrammarSpec("regex", _string(g.text, p))
    elif g.kind == pb.Grammar.CHOICE:
        try:
            choices = json.loads(g.text)
        except ValueError:
            raise bad_request(f"'{p}.text' of a CHOICE grammar must be a JSON array of strings.",
                              p) from None
        spec = _choices(choices, p)
    elif g.kind == pb.Grammar.GRAMMAR:
        spec = GrammarSpec("grammar", _string(g.text, p))
    else:  # NONE, or a kind this build does not know: read as unset (the proto's rule)
        return None
    check_text(spec.text, p)
    return spec


def structured_from_wire(req: pb.GenerateRequest) -> tuple[GrammarSpec | None, str | None]:
    """(the request's grammar or None, the parameter a 400 about it names). Shape errors are
    raised here (APIError 400); whether the backend can run the grammar is
    gateway.structured.check_grammar's question."""
    has_grammar = req.sampling.HasField("grammar") and req.sampling.grammar.kind != \
        pb.Grammar.NONE
    if req.structured_fields:
        if has_grammar:
            raise bad_request(f"Set '{FIELDS_PARAM}' or 'sampling.grammar', not both.",
                              FIELDS_PARAM)
        return _from_fields(req.structured_fields)
    if has_grammar:
        spec = _from_grammar(req.sampling.grammar)
        return (spec, GRAMMAR_PARAM) if spec is not None else (None, None)
    return None, None

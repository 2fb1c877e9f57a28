"""The hermes parser (and so every forced tool_choice, whose grammar writes that format) reads a
block's JSON object before it looks for `</tool_call>`: the marker inside one of the object's
strings is argument text, not the block's end. tiny-coder v3 (issue 36) wrote exactly that in
tests/test_structured_e2e.py's forced `write_file` call (content `...'}}}}}</tool_call>''', ...`),
which the parser used to cut into a broken call and content. A block whose object never closes is
still cut at the first marker when the output ends (the behaviour before)."""
from __future__ import annotations

import json

import pytest
from test_tool_args_stream import _streamed, _whole
from test_tool_parser_families import cfg

from gateway.tool_parser import parse_all

CONTENT = "print('hi')\n# </tool_call> and <tool_call> are only text here\n'''}}</tool_call>'''"
ARGS = {"path": "a.py", "content": CONTENT}
CALL = json.dumps({"name": "write_file", "arguments": ARGS})
TEXT = f"<tool_call>\n{CALL}\n</tool_call>"


def test_a_marker_inside_a_json_string_does_not_end_the_call():
    content, calls = parse_all(TEXT, cfg("hermes"))
    assert content is None and len(calls) == 1
    assert calls[0].name == "write_file" and calls[0].arguments == ARGS


@pytest.mark.parametrize("size", [1, 3, 7, 64, len(TEXT)])
def test_streamed_in_any_pieces_it_is_the_same_call(size):
    config = cfg("hermes")
    pieces = [TEXT[i:i + size] for i in range(0, len(TEXT), size)]
    got, whole = _streamed(config, pieces), _whole(config, TEXT)
    assert got["content"] == whole["content"] == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == \
        [(c["name"], json.loads(c["arguments"])) for c in whole["calls"]] == [("write_file", ARGS)]
    assert got["finish"] == whole["finish"] == "tool_calls"


def test_content_after_the_call_and_a_second_call_still_parse():
    text = TEXT + "\nthen some prose\n" + TEXT
    content, calls = parse_all(text, cfg("hermes"))
    assert [c.arguments for c in calls] == [ARGS, ARGS]
    assert content.strip() == "then some prose"


def test_an_object_that_never_closes_is_cut_at_the_first_marker_at_the_end():
    text = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a</tool_call> rest'
    content, calls = parse_all(text, cfg("hermes"))
    assert calls == [] and content == text

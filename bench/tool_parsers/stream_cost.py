"""What reading tool calls costs per streamed piece, for every `--tool-call-parser` family: a
reply with one large call (a `write_file` of N KB of code, the case coding agents send) or a long
reply without one (gpt-oss's analysis then final channel; plain prose for hermes), fed in pieces
of a few characters (a token's worth) and fed whole. The same run also feeds every parser
without its incremental scans (`rescan_streamed_ms`): the open block's end marker searched from
the block's start on every piece (what `_searched` saves) and the JSON decoded on every piece
(what `JsonEnd` saves), i.e. work of the piece count times the reply's length.

    python -m bench.tool_parsers.stream_cost [--kb 120] [--piece 4] [--parser NAME ...]
        [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import time

from gateway.tool_call_parsers import _JSON, JsonEnd
from gateway.tool_parser import make_parser
from gateway.tools import parse_tools, with_parser

TOOL = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}


def replies(code: str) -> dict[str, str]:
    args = json.dumps({"path": "a.py", "content": code})
    dsml = "｜DSML｜"
    return {
        "hermes": f'Writing it.\n<tool_call>\n{{"name": "write_file", "arguments": {args}}}\n'
                  "</tool_call>",
        "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>write_file\n"
                       f"```json\n{args}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "deepseek_v32": f'<{dsml}function_calls>\n<{dsml}invoke name="write_file">\n<{dsml}parameter'
                        f' name="path" string="true">a.py</{dsml}parameter>\n<{dsml}parameter '
                        f'name="content" string="true">{code}</{dsml}parameter>\n</{dsml}invoke>\n'
                        f"</{dsml}function_calls>",
        "qwen3_coder": "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
                       f"<parameter=content>\n{code}\n</parameter>\n</function>\n</tool_call>",
        "glm45": "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a.py</arg_value>\n"
                 f"<arg_key>content</arg_key>\n<arg_value>{code}</arg_value>\n</tool_call>",
        "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0"
                   f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>",
        "internlm": f'<|action_start|><|plugin|>\n{{"name": "write_file", "parameters": {args}}}'
                    "<|action_end|>",
        "granite": f'<|tool_call|>[{{"name": "write_file", "arguments": {args}}}]',
        "openai": "<|channel|>analysis<|message|>" + "think " * (len(code) // 12)
                  + "<|end|><|start|>assistant<|channel|>commentary to=functions.write_file "
                  f"<|constrain|>json<|message|>{args}<|call|>",
        "mistral": f'[TOOL_CALLS]write_file[ARGS]{args}',
        "json": f'{{"name": "write_file", "arguments": {args}}}',
        "pythonic": f"[write_file(path='a.py', content={code!r})]",
    }


def _decode_end(self, buf: str, start: int) -> int:
    try:
        return _JSON.raw_decode(buf, start)[1]
    except ValueError:
        return -1


def run(parser: str, text: str, piece: int, rescan: bool = False) -> tuple[float, int]:
    cfg = with_parser(parse_tools({"tools": [TOOL]}), parser)
    p = make_parser(cfg)
    find = JsonEnd.find
    if rescan:  # whether the JSON is complete: decoded on every piece
        JsonEnd.find = _decode_end
    try:
        t0 = time.perf_counter()
        calls = 0
        for i in range(0, len(text), piece):
            if rescan and hasattr(p, "_searched"):
                p._searched = 0  # the end marker searched from the block's start every time
            calls += len(p.feed(text[i:i + piece])[1])
        calls += len(p.finish()[1])
        return time.perf_counter() - t0, calls
    finally:
        JsonEnd.find = find


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kb", type=int, default=120, help="size of the call's code, KB")
    ap.add_argument("--piece", type=int, default=4, help="characters per streamed piece")
    ap.add_argument("--parser", action="append", default=None,
                    help="only these parsers (repeatable; default: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    code = ("def f(x):\n    return {'a': [x, \"<b>\"]}\n" * (args.kb * 1024 // 40 + 1))[
        :args.kb * 1024]
    rows = []
    for parser, text in replies(code).items():
        if args.parser and parser not in args.parser:
            continue
        whole, calls_whole = run(parser, text, len(text))
        streamed, calls = run(parser, text, args.piece)
        row = {"parser": parser, "chars": len(text), "pieces": -(-len(text) // args.piece),
               "calls": calls, "whole_ms": round(whole * 1e3, 2),
               "streamed_ms": round(streamed * 1e3, 1),
               "us_per_piece": round(streamed * 1e6 / -(-len(text) // args.piece), 2)}
        rescan, calls_rescan = run(parser, text, args.piece, rescan=True)
        assert calls == calls_whole == calls_rescan == 1, (parser, calls)
        row["rescan_streamed_ms"] = round(rescan * 1e3, 1)
        rows.append(row)
        print(json.dumps(row))
    out = {"machine": platform.processor() or platform.machine(), "python":
           platform.python_version(), "kb": args.kb, "piece": args.piece, "rows": rows}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

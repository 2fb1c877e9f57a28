"""The issue's validity check: N generated JSON schemas, each requested with json_schema strict
(temperature 0.7 by default) through the openai SDK; every output parsed and validated with
`jsonschema`.

    tidegate serve &                                      # the embedded default: tiny-coder
    python -m bench.structured.schemas --url http://127.0.0.1:8000 [--num 200] [--json out.json]

Prints the counts: valid (of which closed: finish_reason length, the engine closed the grammar
to fit max_tokens, backend/runner/grammar.py), invalid (a parse or validation failure of an
output that ended by itself: the grammar's failure), and cut by max_tokens (finish_reason length
and not valid: the model was still writing, inside a string or an array it kept extending).
Run the server with TIDEGATE_GRAMMAR_CLOSE=off for the comparison without closing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.structured.schema_gen import random_schema


async def one(client, model: str, i: int, args) -> dict:
    schema = random_schema(args.seed + i, bounded=args.bounded)
    resp = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Reply with a JSON object."}],
        temperature=args.temperature, seed=i, max_tokens=args.max_tokens,
        extra_body=({} if args.repetition_penalty is None
                    else {"repetition_penalty": args.repetition_penalty}),
        response_format={"type": "json_schema", "json_schema": {
            "name": f"s{i}", "strict": True, "schema": schema}})
    choice = resp.choices[0]
    out = {"i": i, "finish": choice.finish_reason, "tokens": resp.usage.completion_tokens}
    try:
        import jsonschema

        jsonschema.validate(json.loads(choice.message.content), schema)
        out["valid"] = True
    except Exception as exc:  # noqa: BLE001 - a parse or validation error, recorded
        out["valid"] = False
        out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out["text"] = choice.message.content[:300]
    return out


async def run(args) -> list[dict]:
    import openai

    client = openai.AsyncOpenAI(base_url=args.url + "/v1", api_key=args.api_key or "unused",
                                max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    sem = asyncio.Semaphore(args.concurrency)

    async def guarded(i):
        async with sem:
            return await one(client, model, i, args)
    return await asyncio.gather(*(guarded(i) for i in range(args.num)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="schema i is random_schema(seed + i)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="sent with every request (default: unset, the model's default applies)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--bounded", action="store_true", help="every free string has a maxLength")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = asyncio.run(run(args))
    seconds = time.perf_counter() - t0
    valid = sum(r["valid"] for r in results)
    closed = sum(r["valid"] and r["finish"] == "length" for r in results)
    cut = [r for r in results if not r["valid"] and r["finish"] == "length"]
    bad = [r for r in results if not r["valid"] and r["finish"] != "length"]
    for r in cut + bad:
        print(f"schema {r['i']}: finish {r['finish']}, {r['tokens']} tokens, {r['error']}")
    print(f"{args.num} schemas, temperature {args.temperature}, max_tokens {args.max_tokens}: "
          f"{valid} valid ({100 * valid / args.num:.1f}%; {closed} of them closed to fit max_tokens), "
          f"{len(bad)} invalid outputs that "
          f"ended by themselves, {len(cut)} cut by max_tokens; {seconds:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "seconds": seconds}, f, indent=1)
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())

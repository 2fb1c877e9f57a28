"""Code-edit and code-completion workloads for speculative decoding (issue 28):
`tidegate bench serve --workload edit|completion [--oracle] [--keep 1,0.75,0.5]`.

Prompts hold real code: files of `--corpus DIR` (default: the Python standard library of this
interpreter), picked by `--seed`, cut at a line boundary to at most `--file-chars` characters.

* edit: the prompt is the file and an instruction to rewrite it; `prediction` is the expected
  output (the file) with round((1 - keep) * lines) of its non-blank lines altered
  (`sims.edit_workload`, the same alteration the simulator applies to token ids). On real
  weights the model reproduces the file, so the prediction is right but for those lines.
* completion: the prompt is the first half of a file (at a line boundary); no prediction:
  speculation can only come from the prompt (prompt lookup) and the session.
* --oracle (dummy weights, whose output is not the file; serve `--load-format dummy-cycle`,
  whose outputs do not part from the baseline in bf16): first every request runs greedily
  with `speculation: "off"` (the baseline, measured in the same invocation); then, per keep
  fraction, FLUSH_SESSIONS one-token requests push the previous run's outputs out of the
  engine's session store (otherwise the session source would draft the altered lines exactly)
  and the same requests are re-sent with `prediction` set to the baseline's output token
  ids (`content` as ids: exact to the token) with that fraction of its lines altered (a line
  ends at a token whose text holds a newline; its tokens are replaced by other ids). That fixes
  the acceptance and measures the mechanism.

Every run is one pass over the requests at `--max-concurrency` (a closed loop of that many
users, each request streamed); the baseline (`off`) runs the same prompts with speculation
off. Per run: TTFT / TPOT / ITL / E2E (vLLM bench's definitions, `sims.metrics`), the
prediction's accepted / rejected tokens from `usage.completion_tokens_details`, and the
server's spec-decode counters (vLLM's names in /metrics) over the run; then each run's TPOT
p50 against the baseline's. JSON with `--json`.
"""
from __future__ import annotations

import asyncio
import json
import re
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from sims.edit_workload import alter_text, lines_to_alter
from sims.metrics import RequestRecord, summarize

INSTRUCTION = ("Rewrite the file below with the change the reviewer asked for ({what}); "
               "keep every other line exactly as it is.")
CHANGES = ("rename the helper variables", "add type hints", "fix the docstrings",
           "use f-strings", "sort the imports")
SPEC_METRICS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total")


# ---- prompts --------------------------------------------------------------------------------------
def code_files(corpus: str | None, num: int, seed: int, max_chars: int = 3000,
               min_chars: int = 400) -> list[tuple[str, str]]:
    """`num` (name, text) pairs of Python files under `corpus` (default: the stdlib; "heldout"
    or "heldout:MODEL_DIR": the held-out files of tiny-coder's evaluation, `evals.data`, code the
    model was not trained on), chosen by `seed` (with repeats when there are fewer files), each
    cut at a line boundary to `max_chars`."""
    if corpus is not None and (corpus == "heldout" or corpus.startswith("heldout:")):
        from evals.data import default_heldout_list, load_heldout

        held = load_heldout(default_heldout_list(corpus.partition(":")[2] or "tiny-coder"))
        files = [(n, t) for n, t in held.files if len(t) >= min_chars]
        where = held.describe()
    else:
        root = Path(corpus or sysconfig.get_paths()["stdlib"])
        where = str(root)
        paths = sorted(p for p in root.rglob("*.py") if "test" not in p.parts and p.is_file())
        files = []
        for p in paths:
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) >= min_chars:
                files.append((str(p.relative_to(root)), text))
            if len(files) >= 4096:
                break
    if not files:
        raise ValueError(f"no Python file of at least {min_chars} characters in {where}")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(files), size=num, replace=num > len(files))
    out = []
    for i in picks:
        name, text = files[int(i)]
        if len(text) > max_chars:
            cut = text.rfind("\n", 0, max_chars)
            text = text[:cut + 1 if cut > 0 else max_chars]
        out.append((name, text))
    return out


def edit_prompt(name: str, text: str, what: str) -> str:
    """The file first, then the instruction: an editor's request starts with what differs per
    file, so that the engine's session key (the prompt's first tokens) is the file's; with the
    instruction first every request of a run was one session, and the session source drafted
    each output from the one before it (dummy-cycle outputs are all alike)."""
    return (f"# File: {name}\n{text}\n# {INSTRUCTION.format(what=what)}\n"
            f"# The rewritten {name}:\n")


def completion_prompt(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(lines[:max(1, len(lines) // 2)]) + "\n"


LINE_TOKENS = 12  # a pseudo-line where an output has too few newlines (dummy weights)
MIN_LINES = 8


def alter_token_lines(ids: list[int], texts: list[str], keep: float, rng: np.random.Generator,
                      pool: list[int] | None = None) -> list[int]:
    """The oracle's prediction: `ids` (a baseline output; `texts[j]` the text of token j) with
    round((1 - keep) * lines) lines' tokens replaced by other ids (ids of the same output and of
    `pool`, the prompt's: in the vocabulary, each different from the one it replaces, also
    where dummy weights repeat one token). A line ends at a token whose
    text holds a newline; an output with fewer than MIN_LINES of them (dummy weights rarely
    emit one) is cut into lines of LINE_TOKENS tokens instead (about a line of code), so that
    the altered fraction is the one asked for."""
    spans, start = [], 0
    for j, t in enumerate(texts):
        if "\n" in t:
            spans.append((start, j + 1))
            start = j + 1
    if start < len(ids):
        spans.append((start, len(ids)))
    if len(spans) < MIN_LINES:
        spans = [(a, min(a + LINE_TOKENS, len(ids))) for a in range(0, len(ids), LINE_TOKENS)]
    out = list(ids)
    choices = sorted(set(ids) | set(pool or ()))
    if len(choices) < 2:
        raise ValueError("no other token id to alter a line with")
    for i in lines_to_alter(len(spans), keep, rng):
        a, b = spans[i]
        for j in range(a, b):
            other = choices[(j * 7919) % len(choices)]
            out[j] = other if other != ids[j] else choices[(j * 7919 + 1) % len(choices)]
    return out


# ---- one run ---------------------------------------------------------------------------------------
@dataclass
class Item:
    prompt: str
    max_tokens: int
    prediction: str | list[int] | None = None


@dataclass
class Seen:
    """What a request's stream carried beyond the timing: its token ids and each token's text
    (a chunk's text is given to its last token), and the usage details."""
    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    accepted: int = 0
    rejected: int = 0


async def _send(session: aiohttp.ClientSession, url: str, body: dict, rec: RequestRecord,
                seen: Seen) -> None:
    rec.send_time = time.perf_counter()
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                rec.error_detail = (await resp.text())[:300]
                return
            buf = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    line = line.strip()
                    if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        rec.error, rec.error_detail = "stream_error", str(event["error"])[:300]
                        return
                    for c in event.get("choices") or ():
                        if c.get("prompt_token_ids"):
                            seen.prompt_ids = list(c["prompt_token_ids"])
                        ids = c.get("token_ids") or []
                        if ids:
                            rec.chunk_times.append(now)
                            rec.chunk_tokens.append(len(ids))
                            seen.ids.extend(ids)
                            text = c.get("text") or (c.get("delta") or {}).get("content") or ""
                            seen.texts.extend([""] * (len(ids) - 1) + [text])
                    usage = event.get("usage")
                    if usage:
                        rec.output_tokens = int(usage.get("completion_tokens") or 0)
                        details = usage.get("completion_tokens_details") or {}
                        seen.accepted = int(details.get("accepted_prediction_tokens") or 0)
                        seen.rejected = int(details.get("rejected_prediction_tokens") or 0)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        rec.error, rec.error_detail = "connection", f"{exc.__class__.__name__}: {exc}"


async def _spec_counters(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The server's spec-decode counters (summed over engines and sources), {} if none."""
    try:
        async with session.get(base + "/metrics") as resp:
            text = await resp.text() if resp.status == 200 else ""
    except aiohttp.ClientError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$", line)
        if m and (m.group(1) in SPEC_METRICS or m.group(1).startswith(
                ("tidegate_spec_decode_", "tidegate_prediction_tokens"))):
            key = m.group(1) + (m.group(2) or "")
            if m.group(1) in SPEC_METRICS:
                key = m.group(1)
                source = re.search(r'source="([^"]*)"', m.group(2) or "")
                if source:  # also by draft source, summed over engines
                    by = f'{key}{{source="{source.group(1)}"}}'
                    out[by] = out.get(by, 0.0) + float(m.group(3))
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def acceptance_by_source(spec: dict[str, float]) -> dict[str, float]:
    """Accepted / drafted tokens per draft source, from `_spec_counters` differences."""
    drafted, accepted = SPEC_METRICS[1], SPEC_METRICS[2]
    out = {}
    for key, tokens in spec.items():
        m = re.fullmatch(rf'{re.escape(drafted)}{{source="([^"]*)"}}', key)
        if m and tokens > 0:
            out[m.group(1)] = spec.get(f'{accepted}{{source="{m.group(1)}"}}', 0.0) / tokens
    return out


async def run_items(base: str, endpoint: str, model: str, items: list[Item], concurrency: int,
                    speculation, *, temperature: float = 0.0, ignore_eos: bool = True,
                    timeout_s: float = 600.0) -> tuple[dict, list[Seen]]:
    """One pass over `items` with `concurrency` in flight -> (summary, what each stream saw)."""
    records = [RequestRecord(i, 0, it.max_tokens) for i, it in enumerate(items)]
    seen = [Seen() for _ in items]
    url = base + endpoint
    chat = endpoint.endswith("/chat/completions")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        before = await _spec_counters(session, base)
        queue = list(range(len(items)))[::-1]

        async def worker() -> None:
            while queue:
                i = queue.pop()
                it = items[i]
                body: dict = {"model": model, "max_tokens": it.max_tokens,
                              "temperature": temperature, "stream": True,
                              "stream_options": {"include_usage": True}, "return_token_ids": True,
                              "ignore_eos": ignore_eos}
                if chat:
                    body["messages"] = [{"role": "user", "content": it.prompt}]
                else:
                    body["prompt"] = it.prompt
                if it.prediction is not None:
                    body["prediction"] = {"type": "content", "content": it.prediction}
                if speculation is not None:
                    body["speculation"] = speculation
                await _send(session, url, body, records[i], seen[i])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        after = await _spec_counters(session, base)
    summary = summarize(records, start_time=t0)
    summary["error_details"] = sorted({r.error_detail for r in records if r.error})[:3]
    accepted = sum(s.accepted for s in seen)
    rejected = sum(s.rejected for s in seen)
    summary["prediction_tokens"] = {"accepted": accepted, "rejected": rejected,
                                    "accepted_fraction": accepted / (accepted + rejected)
                                    if accepted + rejected else None}
    spec = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafted = spec.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    spec["acceptance_rate"] = (spec.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
                               / drafted) if drafted else None
    spec["acceptance_by_source"] = acceptance_by_source(spec)
    summary["spec_decode"] = spec
    return summary, seen


# ---- the workload ------------------------------------------------------------------------------------
FLUSH_SESSIONS = 320  # > the engine's session store (scheduler.speculation: 256 by default)
SESSION_PREFIX = 64  # prompt tokens that name a session there


def flush_prompt(i: int) -> list[int]:
    """The i-th flush request's prompt: distinct in its first SESSION_PREFIX tokens."""
    digits = [1 + (i // 249 ** j) % 249 for j in range(3)]
    return digits + [(7 * i + k) % 249 + 1 for k in range(SESSION_PREFIX + 5)]


async def flush_session_store(base: str, model: str, num: int, timeout_s: float = 600.0,
                              concurrency: int = 64) -> None:
    """`num` one-token requests with distinct prompts of SESSION_PREFIX + 8 token ids (ids
    below 250: in any vocabulary), speculation off: as many new sessions in the engine."""
    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": model, "prompt": flush_prompt(i), "max_tokens": 1, "temperature": 0,
                "speculation": "off"}
        async with session.post(base + "/v1/completions", json=body) as resp:
            await resp.read()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        queue = list(range(num))

        async def worker() -> None:
            while queue:
                await one(session, queue.pop())

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _model(base: str) -> tuple[str, int]:
    async with aiohttp.ClientSession() as session, session.get(base + "/v1/models") as resp:
        resp.raise_for_status()
        data = (await resp.json())["data"]
    model = data[0]["id"]
    return model, int(data[0].get("max_model_len") or 0)


def keep_list(text: str) -> list[float]:
    out = [float(x) for x in str(text).split(",") if x.strip()]
    if not out or any(not 0.0 <= k <= 1.0 for k in out):
        raise ValueError(f"--keep wants fractions in [0, 1], got {text!r}")
    return out


async def run_workload(*, url: str, endpoint: str, model: str | None, workload: str,
                       oracle: bool, keeps: list[float], num_requests: int, max_tokens: int,
                       concurrency: int, seed: int, corpus: str | None, file_chars: int,
                       speculation=None, temperature: float = 0.0,
                       timeout_s: float = 600.0, trace_dir: str | None = None,
                       flush_sessions: int = FLUSH_SESSIONS) -> dict:
    """All runs of one workload (module docstring). `trace_dir`: each run's requests as JSONL
    there (`<run>.jsonl`: prompt and output token ids, the prediction's ids), what
    `python -m sims.speculation --trace` replays."""
    base = url.rstrip("/")
    if model is None:
        model, _ = await _model(base)
    files = code_files(corpus, num_requests, seed, file_chars)
    rng = np.random.default_rng(seed)
    what = [CHANGES[int(i)] for i in rng.integers(0, len(CHANGES), size=num_requests)]
    if workload == "edit":
        prompts = [edit_prompt(n, t, w) for (n, t), w in zip(files, what)]
    elif workload == "completion":
        prompts = [completion_prompt(t) for _, t in files]
    else:
        raise ValueError(f"unknown workload {workload!r}")
    # real weights stop at EOS (an edit ends with the file); dummy ones run to max_tokens
    ignore_eos = oracle
    base_items = [Item(p, max_tokens) for p in prompts]
    common = {"temperature": temperature, "ignore_eos": ignore_eos, "timeout_s": timeout_s}
    runs: dict[str, dict] = {}
    if workload == "completion" and not oracle:
        # "on" first: the engine keeps each session's outputs (keyed by the prompt's first
        # tokens) as draft material, and the "off" run's would be these very outputs
        runs["on"], _ = await run_items(base, endpoint, model, base_items, concurrency,
                                        speculation, **common)
    off, seen = await run_items(base, endpoint, model, base_items, concurrency, "off", **common)
    if workload == "edit" or oracle:
        # the runs with a prediction find their prompts in the prefix cache this baseline filled:
        # the reference is timed the same way, by a second (warm) pass; the cold one is kept
        # beside it (the H200's first oracle runs compared against the cold pass, and their c=8
        # "gain" was the prefix cache's)
        runs["off_cold"] = off
        off, _ = await run_items(base, endpoint, model, base_items, concurrency, "off", **common)
    runs["off"] = off
    for keep in keeps if (workload == "edit" or oracle) else ():
        if flush_sessions:
            # the run before (the baseline, or the previous fraction) left its outputs in the
            # engine's session store under the prompts this run sends again: pushed out (least
            # recently used) by as many other sessions, so that only the prediction (and prompt
            # lookup) can draft them. Before: only after the baseline, and the 75% / 50% runs
            # drafted their altered lines from the 100% run's outputs (acceptance 0.99)
            await flush_session_store(base, model, flush_sessions, timeout_s)
        krng = np.random.default_rng([seed, int(keep * 1000)])
        items = []
        for i, it in enumerate(base_items):
            if oracle:
                if not seen[i].ids:
                    raise RuntimeError(f"the baseline of request {i} failed: "
                                       f"{off.get('errors')} {off['error_details']}")
                pred = alter_token_lines(seen[i].ids, seen[i].texts, keep, krng,
                                         seen[i].prompt_ids)
            else:
                pred, _ = alter_text(files[i][1], keep, krng)
            items.append(Item(it.prompt, it.max_tokens, pred))
        name = f"keep={keep:g}"
        runs[name], kept = await run_items(base, endpoint, model, items, concurrency,
                                           speculation, **common)
        if trace_dir is not None:
            write_trace(Path(trace_dir) / f"{name}.jsonl", items, kept)
    if trace_dir is not None:
        write_trace(Path(trace_dir) / "off.jsonl", base_items, seen)
    ref = off["tpot_ms"]["p50"]
    ratios = {name: (r["tpot_ms"]["p50"] / ref if ref else None)
              for name, r in runs.items() if name != "off"}
    return {"workload": workload, "oracle": oracle, "model": model, "concurrency": concurrency,
            "num_requests": num_requests, "max_tokens": max_tokens, "keeps": keeps,
            "speculation": speculation, "runs": runs, "tpot_p50_ratio_vs_off": ratios}


def write_trace(path: Path, items: list[Item], seen: list[Seen]) -> None:
    """One JSON line per request: its prompt and output ids and its prediction (ids; text
    predictions are left out: the simulator needs ids), for `sims.speculation --trace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for it, s in zip(items, seen):
            pred = it.prediction if isinstance(it.prediction, list) else None
            fh.write(json.dumps({"prompt": s.prompt_ids, "output": s.ids, "prediction": pred,
                                 "max_tokens": it.max_tokens}) + "\n")


def format_result(out: dict) -> str:
    lines = [(f"{out['workload']} workload{' (oracle)' if out['oracle'] else ''}, "
             f"{out['num_requests']} requests, concurrency {out['concurrency']}, "
             f"max_tokens {out['max_tokens']}"),
             (f"{'run':<12}{'TPOT p50 ms':>12}{'TPOT p90':>10}{'ITL p50':>9}{'TTFT p50':>10}"
             f"{'tok/s':>9}{'accept':>8}{'vs off':>8}")]
    for name, r in out["runs"].items():
        acc = r["spec_decode"].get("acceptance_rate")
        ratio = out["tpot_p50_ratio_vs_off"].get(name)
        lines.append(f"{name:<12}{r['tpot_ms']['p50']:>12.2f}{r['tpot_ms']['p90']:>10.2f}"
                     f"{r['itl_ms']['p50']:>9.2f}{r['ttft_ms']['p50']:>10.1f}"
                     f"{r['output_throughput']:>9.1f}"
                     f"{'' if acc is None else f'{acc:.3f}':>8}"
                     f"{'' if ratio is None else f'{ratio:.3f}':>8}")
    return "\n".join(lines)

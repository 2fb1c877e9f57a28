"""Engine settings and the two engine drivers behind `tidegate eval`.

Both drivers run the service's own machinery: `create_engine` (loader, paged KV pool, runner),
the engine's `StepScheduler` (admission, chunked prefill under `max_num_batched_tokens`, block
tables, preemption) and the runner's static buffers, model and attention backend (the Triton
kernels and decode CUDA graphs on CUDA, the torch reference on the CPU). Only what happens to
the logits differs from `Engine.step`:

- `score_all_rows` (perplexity, logit checks): every prefill chunk goes through
  `ModelRunner.prepare` and the model like a served prefill, and the LM head is applied to
  *every* row instead of only the sampled last one (`RunnerOutput.logits` with `keep_logits`
  holds just that last row). Prefix caching is off, so every token is computed.
- `greedy_decode` (agreement): `ModelRunner.execute` unchanged (greedy, so a decode-only step
  may replay a CUDA graph); the token handed back to the scheduler can be forced (teacher
  forcing), so the next step feeds it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from backend.errors import ModelLoadError
from backend.runner.sampler import SamplingParams
from backend.runner.step_io import SampleSpec
from scheduler.capacity import DEFAULT_CAPACITY
from scheduler.step_scheduler import StepResult

SETTING_KEYS = ("dtype", "kv-cache-dtype", "quantization", "device")


class EvalError(ValueError):
    """A user error of `tidegate eval` (one-line message, exit code 2)."""


@dataclass(frozen=True)
class EngineSettings:
    """The knobs an evaluation compares. `auto` kv-cache dtype = the model dtype."""
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str = "none"
    device: str = "cpu"

    def label(self) -> str:
        return ",".join(f"{k}={getattr(self, k.replace('-', '_'))}" for k in SETTING_KEYS)

    def as_dict(self) -> dict[str, str]:
        return {k: getattr(self, k.replace("-", "_")) for k in SETTING_KEYS}


def parse_settings(text: str, base: EngineSettings) -> EngineSettings:
    """`key=value[,key=value...]` over `base`; keys: dtype, kv-cache-dtype (or kv_cache_dtype,
    kv-dtype), quantization (or quant), device. Whitespace around items is ignored."""
    aliases = {"kv_cache_dtype": "kv-cache-dtype", "kv-dtype": "kv-cache-dtype",
               "kv_dtype": "kv-cache-dtype", "quant": "quantization"}
    changes: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        key = aliases.get(key, key)
        if not sep or not value:
            raise EvalError(f"setting {item!r} is not key=value")
        if key not in SETTING_KEYS:
            raise EvalError(f"unknown setting {key!r} (keys: {', '.join(SETTING_KEYS)})")
        changes[key.replace("-", "_")] = value
    return dataclasses.replace(base, **changes)


# ---- what this build supports -------------------------------------------------------------------

def _backend_config_fields() -> set[str]:
    from backend.engine.assemble import BackendConfig

    return {f.name for f in dataclasses.fields(BackendConfig)}


def supported_kv_cache_dtypes() -> tuple[str, ...]:
    """`auto` (the model dtype: the KV pool is allocated in it) plus whatever the KV cache module
    declares once the engine grows a separate KV dtype."""
    from backend.kv import pools as kv_cache

    extra = tuple(getattr(kv_cache, "KV_CACHE_DTYPES", ()))
    if extra and "kv_cache_dtype" in _backend_config_fields():
        return tuple(dict.fromkeys(("auto", *extra)))
    return ("auto",)


def supported_quantizations() -> tuple[str, ...]:
    try:
        from backend.model.quantization import METHODS
    except ImportError:
        return ("none",)
    return tuple(METHODS)


def check_settings(s: EngineSettings) -> None:
    from backend.model.loader import TORCH_DTYPES

    if s.dtype != "auto" and s.dtype not in TORCH_DTYPES:
        raise EvalError(f"dtype {s.dtype!r} is not supported (supported: auto, {', '.join(TORCH_DTYPES)})")
    kv = supported_kv_cache_dtypes()
    if s.kv_cache_dtype not in kv:
        raise EvalError(f"kv-cache-dtype {s.kv_cache_dtype!r} is not supported by this engine "
                        f"(supported: {', '.join(kv)}; auto = the model dtype)")
    quant = supported_quantizations()
    if s.quantization not in quant:
        raise EvalError(f"quantization {s.quantization!r} is not supported by this engine "
                        f"(supported: {', '.join(quant)})")
    if not (s.device == "cpu" or s.device.startswith("cuda")):
        raise EvalError(f"device {s.device!r} is not supported (supported: cpu, cuda, cuda:N)")


@dataclass(frozen=True)
class EngineShape:
    """Capacity options shared by both sides of a comparison."""
    load_format: str = "auto"
    seed: int = 0
    block_size: int = DEFAULT_CAPACITY.block_size
    max_num_batched_tokens: int = DEFAULT_CAPACITY.max_num_batched_tokens
    max_num_seqs: int = DEFAULT_CAPACITY.max_num_seqs
    max_model_len: int | None = None
    cpu_threads: int | None = None


def build_engine(model: str, s: EngineSettings, shape: EngineShape):
    """The assembler's engine (`backend.engine.assemble.create_engine`) with prefix caching off
    and the serving transforms `tidegate backend` applies (weight quantization, then CUDA
    graphs, captured as used). Returns (engine, loaded). Raises EvalError / ModelLoadError with
    one-line messages."""
    from backend.engine.assemble import BackendConfig, create_engine

    check_settings(s)
    cfg = BackendConfig(model=model, load_format=shape.load_format, device=s.device, dtype=s.dtype,
                        max_model_len=shape.max_model_len, block_size=shape.block_size,
                        # a small token budget (forced chunking) caps the running sequences too
                        max_num_seqs=min(shape.max_num_seqs, shape.max_num_batched_tokens),
                        max_num_batched_tokens=shape.max_num_batched_tokens,
                        enable_prefix_caching=False, seed=shape.seed,
                        cpu_threads=shape.cpu_threads, kv_cache_dtype=s.kv_cache_dtype)
    return create_engine(cfg, serving_options(s.quantization))


def serving_options(quantization: str):
    """What `tidegate backend` applies to the engine it builds, graphs captured as used."""
    from backend.engine.assemble import ServingOptions

    return ServingOptions(quantization=quantization)


def synchronize(engine) -> None:
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize(engine.runner.device)


# ---- driver 1: every row's logits ----------------------------------------------------------------

RowsCallback = Callable[[str, int, torch.Tensor], None]


@torch.inference_mode()
def score_all_rows(engine, requests: Sequence[tuple[str, list[int]]], on_rows: RowsCallback,
                   next_token: Callable[[str], int] | None = None,
                   on_step: Callable[[], None] | None = None) -> dict[str, int]:
    """Prefill every (request id, tokens) through the scheduler; for each chunk call
    `on_rows(request_id, start_pos, logits [len(chunk), vocab] fp32)`, where row j holds the
    logits after token start_pos + j. Each request is admitted with max_tokens=1: the token
    handed back after its last chunk is `next_token(rid)` (default: the greedy one), so nothing
    is decoded. Returns {request id: number of prefill chunks it took}."""
    sched, runner = engine.scheduler, engine.runner
    if sched.block_manager.enable_prefix_caching:  # cached tokens would get no logits
        raise EvalError("score_all_rows needs an engine without prefix caching")
    for rid, tokens in requests:
        rejection = sched.add_request(rid, list(tokens), 1, 0.0)
        if rejection is not None:
            raise EvalError(f"request {rid}: {rejection.reason}")
    num_chunks: dict[str, int] = {rid: 0 for rid, _ in requests}
    while sched.has_unfinished():
        plan = sched.schedule()
        if not plan.chunks:
            raise RuntimeError("the scheduler planned an empty step with requests pending")
        num_tokens, ctx, _ = runner.prepare(plan.chunks)
        b = runner.buffers
        hidden = runner.model(b.input_ids[:num_tokens], b.positions[:num_tokens], ctx, runner.kv)
        sampled: dict[str, int] = {}
        row = 0
        for c in plan.chunks:
            n = len(c.token_ids)
            if not c.is_prefill:
                raise RuntimeError("score_all_rows: a request reached decode")
            logits = runner.model.compute_logits(hidden[row:row + n])
            on_rows(c.request_id, c.start_pos, logits)
            num_chunks[c.request_id] += 1
            if c.sample:
                sampled[c.request_id] = next_token(c.request_id) if next_token is not None \
                    else int(logits[-1].argmax())
            row += n
        sched.update(plan, StepResult(sampled=sampled))
        if on_step is not None:
            on_step()
    return num_chunks


def sequence_logits(engine, tokens: list[int], request_id: str = "seq") -> torch.Tensor:
    """[len(tokens), vocab] fp32 logits of one sequence through `score_all_rows` (chunked as the
    engine's `max_num_batched_tokens` dictates)."""
    rows = torch.empty((len(tokens), engine.runner.model.config.vocab_size), dtype=torch.float32)

    def keep(rid: str, start: int, logits: torch.Tensor) -> None:
        rows[start:start + logits.shape[0]] = logits.cpu()

    score_all_rows(engine, [(request_id, tokens)], keep)
    return rows


# ---- driver 2: greedy decoding, optionally teacher-forced ---------------------------------------

@torch.inference_mode()
def greedy_decode(engine, prompts: Sequence[list[int]], max_tokens: int,
                  forced: Sequence[list[int]] | None = None,
                  on_step: Callable[[int, int], None] | None = None,
                  on_logits: Callable[[int, int, torch.Tensor], None] | None = None,
                  params: SamplingParams | None = None) -> list[list[int]]:
    """Greedy continuation of every prompt (all admitted at once; the scheduler batches them),
    `max_tokens` each, eos ignored. Returns the engine's own greedy token at each position.
    With `forced`, the token fed back after position t of prompt i is `forced[i][t]` instead of
    the engine's (teacher forcing): position t is then predicted from prompt + forced[i][:t].
    `on_step(tokens_done, tokens_total)` after each step; `on_logits(i, t, logits [vocab])`
    with the fp32 logits that chose position t of prompt i (the runner's `keep_logits`).
    `params`: decode as a served request with these sampling parameters would (penalties over
    the prompt and the tokens so far, temperature with seed `params.seed or 0`); max_tokens and
    ignore_eos are this function's."""
    sched, runner = engine.scheduler, engine.runner
    params = dataclasses.replace(params or SamplingParams(temperature=0.0),
                                 max_tokens=max_tokens, ignore_eos=True)
    seed = params.seed or 0
    rids = [f"p{i}" for i in range(len(prompts))]
    index = {rid: i for i, rid in enumerate(rids)}
    for rid, prompt in zip(rids, prompts):
        rejection = sched.add_request(rid, list(prompt), max_tokens, 0.0)
        if rejection is not None:
            raise EvalError(f"prompt {rid}: {rejection.reason}")
    own: list[list[int]] = [[] for _ in prompts]
    total = len(prompts) * max_tokens
    done = 0
    while sched.has_unfinished():
        plan = sched.schedule()
        specs = {c.request_id: SampleSpec(params, seed, len(own[index[c.request_id]]),
                                          prompts[index[c.request_id]],
                                          forced[index[c.request_id]][:len(own[index[c.request_id]])]
                                          if forced is not None else own[index[c.request_id]])
                 for c in plan.chunks if c.sample}
        out = runner.execute(plan.chunks, specs,
                             keep_logits=on_logits is not None)
        sampled = {}
        for row, (rid, tok) in enumerate(out.token_ids.items()):
            i = index[rid]
            if on_logits is not None:
                on_logits(i, len(own[i]), out.logits[row])
            own[i].append(int(tok))
            sampled[rid] = forced[i][len(own[i]) - 1] if forced is not None else int(tok)
        done += len(sampled)
        sched.update(plan, StepResult(sampled=sampled))
        if on_step is not None:
            on_step(done, total)
    return own


def load_error_message(exc: Exception) -> str:
    if isinstance(exc, (EvalError, ModelLoadError, FileNotFoundError)) or \
            type(exc).__name__ == "QuantizationError":
        return str(exc)
    return f"{type(exc).__name__}: {exc}"

"""vLLM's engine behind our wire: `tidegate backend --engine vllm --model PATH`.

The worker loop (`backend.server.worker`) is unchanged; this module gives it an engine with the
interface of `backend.engine.continuous.Engine` whose steps are vLLM's (`vllm.LLMEngine`, its engine core
kept in this process):

    Batch request   -> LLMEngine.add_request(id, {"prompt_token_ids": ids}, vllm.SamplingParams)
                       (our sampling fields mapped one to one; detokenize off, DELTA outputs)
    Engine.step()   -> LLMEngine.step(): each RequestOutput's new token ids (+ logprobs, finish)
                       becomes one of our RequestOutputs; the worker coalesces them per step
    Abort           -> LLMEngine.abort_request
    LoadReport      -> vLLM's own SchedulerStats (running, waiting, KV usage, prefix-cache
                       queries/hits), captured by a stat logger after every step

vLLM hashes its cache blocks its own way, so this engine reports no prefix facts (the gateway's
placement uses its guesses for it). vLLM is an optional extra (`pip install tidegate[vllm]`);
only this module imports it, and only when `--engine vllm` is asked for.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from backend.config import ModelConfig
from backend.engine.continuous import EngineConfig, RequestOutput
from backend.engine.interface import EngineLoad, WholeStepEngine
from backend.errors import ModelLoadError
from backend.model.tokenizer import load_tokenizer_bundle
from backend.runner.sampler import SamplingParams, TokenLogprobs
from proto.sampling import check_sampling
from tokenizer.bundle import TokenizerBundle

DEFAULT_KV_GIB = 1  # vLLM's CPU KV space (VLLM_CPU_KVCACHE_SPACE) unless the caller says


@dataclass
class VllmLoaded:
    """What the worker and the CLI read from a `backend.model.loader.LoadedModel`."""
    config: ModelConfig
    tokenizer: TokenizerBundle
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


class VllmRunner:
    """The runner-shaped view serving-time hooks look at: vLLM owns its model and graphs."""
    model = None
    graphs = None
    device = torch.device("cpu")


@dataclass
class _Counts:
    """The block-manager-shaped view a LoadReport reads (from vLLM's SchedulerStats)."""
    num_total_blocks: int
    num_free_blocks: int
    num_query_tokens: int = 0
    num_hit_tokens: int = 0
    enable_prefix_caching: bool = False   # no facts: vLLM's block hashes are not ours

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks


class _Scheduler:
    def __init__(self, num_blocks: int) -> None:
        self.block_manager = _Counts(num_blocks, num_blocks)
        self.num_running = 0
        self.num_waiting = 0
        self.num_preemptions = 0


@dataclass
class _State:
    params: SamplingParams
    num_prompt_tokens: int
    num_generated: int = 0


def _stats_logger_factory(sink: list):
    """A vLLM stat logger that keeps the last SchedulerStats (vLLM calls `record` every step)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LastStats(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if scheduler_stats is not None:
                sink.append(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return LastStats


class VllmEngine(WholeStepEngine):
    """`backend.engine.continuous.Engine`'s interface over a `vllm.LLMEngine`."""

    def __init__(self, llm, config: EngineConfig, vocab_size: int,
                 eos_token_ids: tuple[int, ...], stats: list) -> None:
        self.llm = llm
        self.config = config
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.runner = VllmRunner()
        self.scheduler = _Scheduler(config.num_blocks)
        self.states: dict[str, _State] = {}
        self._stats = stats
        self.num_steps = 0

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float = 0.0, priority: int = 0,
                    deadline: float = 0.0) -> str | None:
        """Hand a request to vLLM; returns the reason it was refused, or None (`deadline`:
        not used)."""
        n = len(prompt_token_ids)
        if n == 0:
            return "request has no prompt tokens"
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            return f"prompt has token ids outside [0, {self.vocab_size})"
        invalid = check_sampling(params, self.vocab_size, backend=True)
        if invalid is not None:
            return invalid.message
        if params.grammar is not None:
            return "structured output is not served by the vLLM engine here (use an HTTP vLLM backend)"
        if n + params.max_tokens > self.config.max_model_len:
            return (f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds "
                    f"max_model_len {self.config.max_model_len}")
        if request_id in self.states:
            return f"duplicate request id {request_id!r}"
        try:
            self.llm.add_request(request_id, {"prompt_token_ids": list(prompt_token_ids)},
                                 vllm_sampling(params))
        except (ValueError, TypeError) as exc:  # vLLM's own validation
            return f"vLLM refused the request: {exc}"
        self.states[request_id] = _State(params, n)
        self.scheduler.num_waiting += 1  # until the next step's stats say otherwise
        return None

    def abort(self, request_id: str) -> RequestOutput | None:
        state = self.states.pop(request_id, None)
        if state is None:
            return None
        self.llm.abort_request([request_id])
        if not self.states:
            self._idle()
        return RequestOutput(request_id, [], [], "abort", state.num_prompt_tokens,
                             state.num_generated, 0)

    def has_unfinished(self) -> bool:
        return bool(self.states)

    @property
    def request_ids(self) -> list[str]:
        return list(self.states)

    # ---- the step ------------------------------------------------------------------------
    def begin_step(self) -> None:
        return None

    def finish_step(self, step: None) -> list[RequestOutput]:
        return self.step()

    def step(self) -> list[RequestOutput]:
        outputs = []
        for out in self.llm.step():
            state = self.states.get(out.request_id)
            if state is None:
                continue  # aborted meanwhile
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            state.num_generated += len(ids)
            finish = None
            if out.finished:
                finish = comp.finish_reason if comp.finish_reason in ("stop", "length") else "abort"
                del self.states[out.request_id]
            outputs.append(RequestOutput(
                out.request_id, ids, _logprobs(comp.logprobs, ids) if state.params.logprobs else [],
                finish, state.num_prompt_tokens, state.num_generated,
                int(out.num_cached_tokens or 0)))
        self.num_steps += 1
        self._read_stats()
        if not self.states:
            self._idle()
        return outputs

    def _idle(self) -> None:
        """Nothing of ours is left in vLLM: its last stats (taken when it scheduled the step)
        still count the requests that just finished or were aborted."""
        sched = self.scheduler
        sched.num_running = sched.num_waiting = 0
        sched.block_manager.num_free_blocks = sched.block_manager.num_total_blocks

    def _read_stats(self) -> None:
        if not self._stats:
            return
        s = self._stats[-1]
        self._stats.clear()
        sched = self.scheduler
        sched.num_running, sched.num_waiting = s.num_running_reqs, s.num_waiting_reqs
        bm = sched.block_manager
        bm.num_free_blocks = round((1.0 - s.kv_cache_usage) * bm.num_total_blocks)
        pc = s.prefix_cache_stats
        bm.num_query_tokens += pc.queries
        bm.num_hit_tokens += pc.hits
        sched.num_preemptions += pc.preempted_requests

    def load(self) -> EngineLoad:
        sched = self.scheduler
        bm = sched.block_manager
        return EngineLoad(
            num_running=sched.num_running, num_waiting=sched.num_waiting,
            num_free_blocks=bm.num_free_blocks, num_total_blocks=self.config.num_blocks,
            num_outstanding_tokens=sum(s.params.max_tokens - s.num_generated
                                       for s in self.states.values()),
            num_preemptions=sched.num_preemptions,
            num_prompt_tokens=bm.num_query_tokens, num_cached_prompt_tokens=bm.num_hit_tokens)

    def check_integrity(self) -> None:
        assert self.llm.has_unfinished_requests() or not self.states, \
            "requests we track are unknown to vLLM"


def vllm_sampling(p: SamplingParams):
    """Our SamplingParams as vLLM's (token ids out, no detokenization, new tokens per step)."""
    from vllm import SamplingParams as VSP
    from vllm.sampling_params import RequestOutputKind

    return VSP(n=1, max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
               top_k=max(0, p.top_k), seed=p.seed,
               stop_token_ids=list(p.stop_token_ids) or None, ignore_eos=p.ignore_eos,
               logprobs=p.logprobs or None, min_p=p.min_p,
               repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
               frequency_penalty=p.frequency_penalty,
               logit_bias=dict(p.logit_bias) or None, min_tokens=p.min_tokens,
               detokenize=False, skip_special_tokens=False,
               output_kind=RequestOutputKind.DELTA)


def _logprobs(entries, ids: list[int]) -> list[TokenLogprobs]:
    """vLLM's per-token {token id: Logprob} dicts -> ours (sampled token first, then the top-n
    best first)."""
    out = []
    for tok, d in zip(ids, entries or []):
        top = sorted(((lp.rank or 0, tid, lp.logprob) for tid, lp in d.items() if tid != tok
                      or (lp.rank is not None and lp.rank > 0)), key=lambda x: x[0])
        sampled = d.get(tok)
        out.append(TokenLogprobs(float(sampled.logprob) if sampled else 0.0,
                                 [t for _, t, _ in top], [float(v) for _, _, v in top]))
    return out


def create_vllm_engine(cfg, kv_gib: float | None = None, enforce_eager: bool = False,
                       kv_events: dict | None = None) -> tuple[VllmEngine, VllmLoaded]:
    """`backend.engine.assemble.create_engine` for `--engine vllm` (cfg: a `backend.engine.assemble.BackendConfig`).
    The model must be a Hugging Face directory; vLLM loads the weights itself. `kv_events`
    (`endpoint`, `replay_endpoint`, `topic`): vLLM publishes its own KV events there (its
    `--kv-events-config`; the same format as our backend's, backend.server.kv_events)."""
    if not os.path.isdir(cfg.model):
        raise ModelLoadError(f"--engine vllm needs a Hugging Face model directory, got {cfg.model!r}")
    # vLLM's engine core in this process (no second process to start, watch and stop), and its
    # CPU KV space sized by us: by default vLLM wants most of the machine's memory
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib or DEFAULT_KV_GIB))
    try:
        from vllm import EngineArgs, LLMEngine
    except ImportError as exc:
        raise ModelLoadError(f"--engine vllm needs vLLM (pip install tidegate[vllm]): {exc}") from None
    model_config = ModelConfig.from_json_file(os.path.join(cfg.model, "config.json"),
                                              name=os.path.basename(os.path.normpath(cfg.model)))
    tokenizer = load_tokenizer_bundle(cfg.model)
    max_model_len = cfg.max_model_len or model_config.max_position_embeddings
    stats: list = []
    extra = {}
    if kv_events is not None:
        from vllm.config import KVEventsConfig

        extra["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                                   **kv_events)
    args = EngineArgs(model=cfg.model, max_model_len=max_model_len, enforce_eager=enforce_eager,
                      max_num_seqs=cfg.max_num_seqs,
                      max_num_batched_tokens=max(cfg.max_num_batched_tokens, max_model_len),
                      enable_prefix_caching=cfg.enable_prefix_caching, seed=cfg.seed,
                      dtype="float32" if cfg.dtype == "auto" else cfg.dtype,
                      disable_log_stats=False, **extra)
    try:
        llm = LLMEngine.from_engine_args(args, stat_loggers=[_stats_logger_factory(stats)])
    except Exception as exc:  # noqa: BLE001 -- any start-up failure is a load error to the CLI
        raise ModelLoadError(f"vLLM could not start: {type(exc).__name__}: {exc}") from None
    cache = llm.vllm_config.cache_config
    num_blocks = int(cache.num_gpu_blocks or 0)
    engine_cfg = EngineConfig(max_model_len=max_model_len, num_blocks=num_blocks,
                              block_size=int(cache.block_size), max_num_seqs=cfg.max_num_seqs,
                              max_num_batched_tokens=cfg.max_num_batched_tokens,
                              enable_prefix_caching=cfg.enable_prefix_caching)
    eos = tuple(dict.fromkeys(e for e in (*tokenizer.eos_token_ids, *model_config.eos_token_ids)
                              if 0 <= e < model_config.vocab_size))
    engine = VllmEngine(llm, engine_cfg, model_config.vocab_size, eos, stats)
    return engine, VllmLoaded(model_config, tokenizer)

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAST: _ClassVar[QueueClass]
    NORMAL: _ClassVar[QueueClass]
    SLOW: _ClassVar[QueueClass]
FAST: QueueClass
NORMAL: QueueClass
SLOW: QueueClass

class Envelope(_message.Message):
    __slots__ = ("hello", "backend_info", "batch", "abort", "step_output", "load_report", "error", "health", "kv_pull", "kv_blocks", "kv_release")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BACKEND_INFO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    STEP_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    LOAD_REPORT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    KV_PULL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_RELEASE_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    backend_info: BackendInfo
    batch: Batch
    abort: Abort
    step_output: StepOutput
    load_report: LoadReport
    error: Error
    health: Health
    kv_pull: KvPull
    kv_blocks: KvBlocks
    kv_release: KvRelease
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., backend_info: _Optional[_Union[BackendInfo, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., step_output: _Optional[_Union[StepOutput, _Mapping]] = ..., load_report: _Optional[_Union[LoadReport, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., health: _Optional[_Union[Health, _Mapping]] = ..., kv_pull: _Optional[_Union[KvPull, _Mapping]] = ..., kv_blocks: _Optional[_Union[KvBlocks, _Mapping]] = ..., kv_release: _Optional[_Union[KvRelease, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "peer_name", "role", "api_key")
    class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ROLE_UNSPECIFIED: _ClassVar[Hello.Role]
        CLIENT: _ClassVar[Hello.Role]
        GATEWAY: _ClassVar[Hello.Role]
    ROLE_UNSPECIFIED: Hello.Role
    CLIENT: Hello.Role
    GATEWAY: Hello.Role
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PEER_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    peer_name: str
    role: Hello.Role
    api_key: str
    def __init__(self, protocol_version: _Optional[str] = ..., peer_name: _Optional[str] = ..., role: _Optional[_Union[Hello.Role, str]] = ..., api_key: _Optional[str] = ...) -> None: ...

class BackendInfo(_message.Message):
    __slots__ = ("protocol_version", "model", "max_model_len", "vocab_size", "block_size", "num_kv_blocks", "role", "tokenizer_json", "chat_template", "bos_token_id", "eos_token_ids", "backend_id", "kv_cache_dtype", "enable_prefix_caching", "engine", "max_num_seqs", "generation_defaults", "kv_layout", "kv_block_bytes", "kv_copy_bytes_per_s", "prefill_tokens_per_s", "kv_endpoint")
    class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MIXED: _ClassVar[BackendInfo.Role]
        PREFILL: _ClassVar[BackendInfo.Role]
        DECODE: _ClassVar[BackendInfo.Role]
    MIXED: BackendInfo.Role
    PREFILL: BackendInfo.Role
    DECODE: BackendInfo.Role
    class GenerationDefaultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_PREFIX_CACHING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_COPY_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    model: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_kv_blocks: int
    role: BackendInfo.Role
    tokenizer_json: str
    chat_template: str
    bos_token_id: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    backend_id: str
    kv_cache_dtype: str
    enable_prefix_caching: bool
    engine: str
    max_num_seqs: int
    generation_defaults: _containers.ScalarMap[str, float]
    kv_layout: str
    kv_block_bytes: int
    kv_copy_bytes_per_s: float
    prefill_tokens_per_s: float
    kv_endpoint: str
    def __init__(self, protocol_version: _Optional[str] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., block_size: _Optional[int] = ..., num_kv_blocks: _Optional[int] = ..., role: _Optional[_Union[BackendInfo.Role, str]] = ..., tokenizer_json: _Optional[str] = ..., chat_template: _Optional[str] = ..., bos_token_id: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., backend_id: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., enable_prefix_caching: _Optional[bool] = ..., engine: _Optional[str] = ..., max_num_seqs: _Optional[int] = ..., generation_defaults: _Optional[_Mapping[str, float]] = ..., kv_layout: _Optional[str] = ..., kv_block_bytes: _Optional[int] = ..., kv_copy_bytes_per_s: _Optional[float] = ..., prefill_tokens_per_s: _Optional[float] = ..., kv_endpoint: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "ignore_eos", "logprobs", "stop", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "min_tokens", "include_stop_str_in_output", "skip_special_tokens", "n", "grammar")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    logprobs: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    min_tokens: int
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    n: int
    grammar: Grammar
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_tokens: _Optional[int] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., n: _Optional[int] = ..., grammar: _Optional[_Union[Grammar, _Mapping]] = ...) -> None: ...

class Grammar(_message.Message):
    __slots__ = ("kind", "text")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[Grammar.Kind]
        JSON_SCHEMA: _ClassVar[Grammar.Kind]
        JSON_OBJECT: _ClassVar[Grammar.Kind]
        REGEX: _ClassVar[Grammar.Kind]
        CHOICE: _ClassVar[Grammar.Kind]
        GRAMMAR: _ClassVar[Grammar.Kind]
    NONE: Grammar.Kind
    JSON_SCHEMA: Grammar.Kind
    JSON_OBJECT: Grammar.Kind
    REGEX: Grammar.Kind
    CHOICE: Grammar.Kind
    GRAMMAR: Grammar.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    kind: Grammar.Kind
    text: str
    def __init__(self, kind: _Optional[_Union[Grammar.Kind, str]] = ..., text: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_frame", "prompt_text", "sampling", "queue_class", "priority", "arrival_time", "deadline", "suffix", "prediction_frame", "prediction_text", "speculation", "session_key", "pin_tokens", "pin_ttl_s", "kv_source", "structured_fields")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FRAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FRAME_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_TEXT_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    PIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PIN_TTL_S_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_frame: int
    prompt_text: str
    sampling: SamplingParams
    queue_class: QueueClass
    priority: int
    arrival_time: float
    deadline: float
    suffix: str
    prediction_frame: int
    prediction_text: str
    speculation: SpeculationParams
    session_key: str
    pin_tokens: int
    pin_ttl_s: float
    kv_source: KvSource
    structured_fields: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_frame: _Optional[int] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., queue_class: _Optional[_Union[QueueClass, str]] = ..., priority: _Optional[int] = ..., arrival_time: _Optional[float] = ..., deadline: _Optional[float] = ..., suffix: _Optional[str] = ..., prediction_frame: _Optional[int] = ..., prediction_text: _Optional[str] = ..., speculation: _Optional[_Union[SpeculationParams, _Mapping]] = ..., session_key: _Optional[str] = ..., pin_tokens: _Optional[int] = ..., pin_ttl_s: _Optional[float] = ..., kv_source: _Optional[_Union[KvSource, _Mapping]] = ..., structured_fields: _Optional[str] = ...) -> None: ...

class KvSource(_message.Message):
    __slots__ = ("endpoint", "num_tokens", "timeout_s", "backend_id", "prefill_wait_s")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    num_tokens: int
    timeout_s: float
    backend_id: str
    prefill_wait_s: float
    def __init__(self, endpoint: _Optional[str] = ..., num_tokens: _Optional[int] = ..., timeout_s: _Optional[float] = ..., backend_id: _Optional[str] = ..., prefill_wait_s: _Optional[float] = ...) -> None: ...

class KvPull(_message.Message):
    __slots__ = ("pull_id", "prompt_frame", "start_block", "max_blocks", "layout", "wait_s", "ipc")
    PULL_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FRAME_FIELD_NUMBER: _ClassVar[int]
    START_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    pull_id: int
    prompt_frame: int
    start_block: int
    max_blocks: int
    layout: str
    wait_s: float
    ipc: bool
    def __init__(self, pull_id: _Optional[int] = ..., prompt_frame: _Optional[int] = ..., start_block: _Optional[int] = ..., max_blocks: _Optional[int] = ..., layout: _Optional[str] = ..., wait_s: _Optional[float] = ..., ipc: _Optional[bool] = ...) -> None: ...

class IpcTensor(_message.Message):
    __slots__ = ("handle", "storage_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required", "shape", "stride", "offset", "dtype", "device")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    storage_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    shape: _containers.RepeatedScalarFieldContainer[int]
    stride: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    dtype: str
    device: int
    def __init__(self, handle: _Optional[bytes] = ..., storage_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ..., shape: _Optional[_Iterable[int]] = ..., stride: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., dtype: _Optional[str] = ..., device: _Optional[int] = ...) -> None: ...

class KvRelease(_message.Message):
    __slots__ = ("pull_id",)
    PULL_ID_FIELD_NUMBER: _ClassVar[int]
    pull_id: int
    def __init__(self, pull_id: _Optional[int] = ...) -> None: ...

class KvBlocks(_message.Message):
    __slots__ = ("pull_id", "start_block", "num_blocks", "block_bytes", "first_frame", "num_frames", "layout", "error", "frame_crc32", "ipc_block_ids", "ipc_event", "ipc_pools")
    PULL_ID_FIELD_NUMBER: _ClassVar[int]
    START_BLOCK_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FRAME_CRC32_FIELD_NUMBER: _ClassVar[int]
    IPC_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    IPC_EVENT_FIELD_NUMBER: _ClassVar[int]
    IPC_POOLS_FIELD_NUMBER: _ClassVar[int]
    pull_id: int
    start_block: int
    num_blocks: int
    block_bytes: int
    first_frame: int
    num_frames: int
    layout: str
    error: str
    frame_crc32: _containers.RepeatedScalarFieldContainer[int]
    ipc_block_ids: _containers.RepeatedScalarFieldContainer[int]
    ipc_event: bytes
    ipc_pools: _containers.RepeatedCompositeFieldContainer[IpcTensor]
    def __init__(self, pull_id: _Optional[int] = ..., start_block: _Optional[int] = ..., num_blocks: _Optional[int] = ..., block_bytes: _Optional[int] = ..., first_frame: _Optional[int] = ..., num_frames: _Optional[int] = ..., layout: _Optional[str] = ..., error: _Optional[str] = ..., frame_crc32: _Optional[_Iterable[int]] = ..., ipc_block_ids: _Optional[_Iterable[int]] = ..., ipc_event: _Optional[bytes] = ..., ipc_pools: _Optional[_Iterable[_Union[IpcTensor, _Mapping]]] = ...) -> None: ...

class SpeculationParams(_message.Message):
    __slots__ = ("off", "max_draft_tokens")
    OFF_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    off: bool
    max_draft_tokens: int
    def __init__(self, off: _Optional[bool] = ..., max_draft_tokens: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("requests", "batch_id")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[GenerateRequest]
    batch_id: int
    def __init__(self, requests: _Optional[_Iterable[_Union[GenerateRequest, _Mapping]]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class RequestOutput(_message.Message):
    __slots__ = ("request_id", "tokens_frame", "logprobs", "finish_reason", "num_prompt_tokens", "num_completion_tokens", "num_cached_tokens", "index", "num_draft_tokens", "num_accepted_prediction_tokens", "num_rejected_prediction_tokens", "num_accepted_draft_tokens", "text", "pin_status")
    class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[RequestOutput.FinishReason]
        STOP: _ClassVar[RequestOutput.FinishReason]
        LENGTH: _ClassVar[RequestOutput.FinishReason]
        ABORT: _ClassVar[RequestOutput.FinishReason]
        ERROR: _ClassVar[RequestOutput.FinishReason]
    NONE: RequestOutput.FinishReason
    STOP: RequestOutput.FinishReason
    LENGTH: RequestOutput.FinishReason
    ABORT: RequestOutput.FinishReason
    ERROR: RequestOutput.FinishReason
    class PinStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PIN_NONE: _ClassVar[RequestOutput.PinStatus]
        PINNED: _ClassVar[RequestOutput.PinStatus]
        PIN_OVER_BUDGET: _ClassVar[RequestOutput.PinStatus]
        PIN_UNSUPPORTED: _ClassVar[RequestOutput.PinStatus]
    PIN_NONE: RequestOutput.PinStatus
    PINNED: RequestOutput.PinStatus
    PIN_OVER_BUDGET: RequestOutput.PinStatus
    PIN_UNSUPPORTED: RequestOutput.PinStatus
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FRAME_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_PREDICTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_REJECTED_PREDICTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PIN_STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokens_frame: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    finish_reason: RequestOutput.FinishReason
    num_prompt_tokens: int
    num_completion_tokens: int
    num_cached_tokens: int
    index: int
    num_draft_tokens: int
    num_accepted_prediction_tokens: int
    num_rejected_prediction_tokens: int
    num_accepted_draft_tokens: int
    text: str
    pin_status: RequestOutput.PinStatus
    def __init__(self, request_id: _Optional[str] = ..., tokens_frame: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., finish_reason: _Optional[_Union[RequestOutput.FinishReason, str]] = ..., num_prompt_tokens: _Optional[int] = ..., num_completion_tokens: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., index: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_prediction_tokens: _Optional[int] = ..., num_rejected_prediction_tokens: _Optional[int] = ..., num_accepted_draft_tokens: _Optional[int] = ..., text: _Optional[str] = ..., pin_status: _Optional[_Union[RequestOutput.PinStatus, str]] = ...) -> None: ...

class StepOutput(_message.Message):
    __slots__ = ("step", "outputs")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    outputs: _containers.RepeatedCompositeFieldContainer[RequestOutput]
    def __init__(self, step: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[RequestOutput, _Mapping]]] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_free_blocks", "num_total_blocks", "recent_step_time_ms", "backend_id", "num_outstanding_tokens", "prefix_hashes", "prefix_block_size", "num_prompt_tokens", "num_cached_prompt_tokens", "num_preemptions", "num_held_messages", "num_dropped_peers", "num_swap_preemptions", "num_host_hit_tokens", "num_host_blocks", "num_host_used_blocks", "num_pins", "num_pinned_blocks", "pin_budget_blocks", "num_pins_refused", "num_pins_expired", "num_kv_pulls", "num_kv_pull_failures", "num_kv_pulled_tokens", "num_kv_pulls_served", "kv_pull_bytes_per_s", "prefill_tokens_per_s", "num_kv_pulls_ipc", "spec_decode")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RECENT_STEP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTSTANDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HASHES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_HELD_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_DROPPED_PEERS_FIELD_NUMBER: _ClassVar[int]
    NUM_SWAP_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HOST_USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PINS_FIELD_NUMBER: _ClassVar[int]
    NUM_PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PIN_BUDGET_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PINS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    NUM_PINS_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_PULLS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_PULL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_PULLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_PULLS_SERVED_FIELD_NUMBER: _ClassVar[int]
    KV_PULL_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_PULLS_IPC_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    recent_step_time_ms: float
    backend_id: str
    num_outstanding_tokens: int
    prefix_hashes: _containers.RepeatedScalarFieldContainer[int]
    prefix_block_size: int
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    num_preemptions: int
    num_held_messages: int
    num_dropped_peers: int
    num_swap_preemptions: int
    num_host_hit_tokens: int
    num_host_blocks: int
    num_host_used_blocks: int
    num_pins: int
    num_pinned_blocks: int
    pin_budget_blocks: int
    num_pins_refused: int
    num_pins_expired: int
    num_kv_pulls: int
    num_kv_pull_failures: int
    num_kv_pulled_tokens: int
    num_kv_pulls_served: int
    kv_pull_bytes_per_s: float
    prefill_tokens_per_s: float
    num_kv_pulls_ipc: int
    spec_decode: _containers.RepeatedCompositeFieldContainer[SpecDecodeCounters]
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_total_blocks: _Optional[int] = ..., recent_step_time_ms: _Optional[float] = ..., backend_id: _Optional[str] = ..., num_outstanding_tokens: _Optional[int] = ..., prefix_hashes: _Optional[_Iterable[int]] = ..., prefix_block_size: _Optional[int] = ..., num_prompt_tokens: _Optional[int] = ..., num_cached_prompt_tokens: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., num_held_messages: _Optional[int] = ..., num_dropped_peers: _Optional[int] = ..., num_swap_preemptions: _Optional[int] = ..., num_host_hit_tokens: _Optional[int] = ..., num_host_blocks: _Optional[int] = ..., num_host_used_blocks: _Optional[int] = ..., num_pins: _Optional[int] = ..., num_pinned_blocks: _Optional[int] = ..., pin_budget_blocks: _Optional[int] = ..., num_pins_refused: _Optional[int] = ..., num_pins_expired: _Optional[int] = ..., num_kv_pulls: _Optional[int] = ..., num_kv_pull_failures: _Optional[int] = ..., num_kv_pulled_tokens: _Optional[int] = ..., num_kv_pulls_served: _Optional[int] = ..., kv_pull_bytes_per_s: _Optional[float] = ..., prefill_tokens_per_s: _Optional[float] = ..., num_kv_pulls_ipc: _Optional[int] = ..., spec_decode: _Optional[_Iterable[_Union[SpecDecodeCounters, _Mapping]]] = ...) -> None: ...

class SpecDecodeCounters(_message.Message):
    __slots__ = ("source", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_TOKENS_PER_POS_FIELD_NUMBER: _ClassVar[int]
    source: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, source: _Optional[str] = ..., num_drafts: _Optional[int] = ..., num_draft_tokens: _Optional[int] = ..., num_accepted_tokens: _Optional[int] = ..., num_accepted_tokens_per_pos: _Optional[_Iterable[int]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "request_id", "batch_id", "param")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[Error.Code]
        BAD_MESSAGE: _ClassVar[Error.Code]
        VERSION_MISMATCH: _ClassVar[Error.Code]
        INVALID_REQUEST: _ClassVar[Error.Code]
        CAPACITY: _ClassVar[Error.Code]
        INTERNAL: _ClassVar[Error.Code]
        ABORTED: _ClassVar[Error.Code]
        SHUTTING_DOWN: _ClassVar[Error.Code]
        DEADLINE: _ClassVar[Error.Code]
        UNAUTHENTICATED: _ClassVar[Error.Code]
    UNKNOWN: Error.Code
    BAD_MESSAGE: Error.Code
    VERSION_MISMATCH: Error.Code
    INVALID_REQUEST: Error.Code
    CAPACITY: Error.Code
    INTERNAL: Error.Code
    ABORTED: Error.Code
    SHUTTING_DOWN: Error.Code
    DEADLINE: Error.Code
    UNAUTHENTICATED: Error.Code
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    code: Error.Code
    message: str
    request_id: str
    batch_id: int
    param: str
    def __init__(self, code: _Optional[_Union[Error.Code, str]] = ..., message: _Optional[str] = ..., request_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., param: _Optional[str] = ...) -> None: ...

class Health(_message.Message):
    __slots__ = ("nonce", "time", "reply")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    time: float
    reply: bool
    def __init__(self, nonce: _Optional[int] = ..., time: _Optional[float] = ..., reply: _Optional[bool] = ...) -> None: ...

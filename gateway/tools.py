"""Tool calling: the `tools` / `tool_choice` / `parallel_tool_calls` fields, how tools and earlier
calls are shown to the model, and the grammar that forces a call.

The generic format (for models whose chat template knows no tools, such as tiny-coder): the
tools are described in a system message, and a call is one block per call in the reply

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Earlier calls are written back into the conversation the same way, and a tool's result
(`role: tool`) becomes a user turn `<tool_response>\\n...\\n</tool_response>`.
`tool_choice` = `required` or a named function is enforced by a grammar of exactly this format
(one call, or one or more when `parallel_tool_calls`); `auto` lets the model choose and
`gateway.tool_parser` finds the blocks in its output; `none` shows no tools.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from gateway.body_checks import check_text
from gateway.errors import bad_request
from tokenizer.grammar import JSON_OPTIONS, GrammarSpec

CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_TOOLS = 128
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: str  # the JSON schema of the arguments, as JSON text (hashable)

    @property
    def schema(self) -> dict:
        return json.loads(self.parameters)


@dataclass(frozen=True, slots=True)
class ToolConfig:
    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | "function"
    function: str | None = None  # the named function when choice == "function"
    parallel: bool = True
    # how `auto` output is parsed (gateway.tool_parser.PARSERS; `--tool-call-parser`); a forced
    # choice is always the generic format its grammar writes
    parser: str = "hermes"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its output is parsed for calls."""
        return bool(self.tools) and self.choice != "none"

    def names(self) -> set[str]:
        return {t.name for t in self.tools}


def _tool(value: Any, i: int) -> Tool:
    param = f"tools[{i}]"
    if not isinstance(value, dict) or value.get("type", "function") != "function":
        raise bad_request(f"'{param}' must be {{\"type\": \"function\", \"function\": {{...}}}}.",
                          param)
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise bad_request(f"'{param}.function' is required.", f"{param}.function")
    return make_tool(fn.get("name"), fn.get("description"), fn.get("parameters"),
                     f"{param}.function")


def make_tool(name: Any, description: Any, parameters: Any, param: str) -> Tool:
    """One tool, checked (shared with /v1/messages, whose tools are `name`, `description`,
    `input_schema`)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise bad_request(f"'{param}.name' must be 1-64 letters, digits, '_', '.' or '-'.",
                          f"{param}.name")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"'{param}.description' must be a string.", f"{param}.description")
    if parameters is None:
        parameters = EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise bad_request(f"'{param}' parameters must be a JSON schema object.", param)
    text = check_text(json.dumps(parameters, ensure_ascii=False), param)
    return Tool(name, check_text(description or "", f"{param}.description"), text)


def parse_tools(body: dict) -> ToolConfig | None:
    """The request's tool configuration; None when it has no tools and no tool_choice."""
    tools_value = body.get("tools")
    choice_value = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls")
    if tools_value is None and choice_value is None:
        return None
    tools: list[Tool] = []
    if tools_value is not None:
        if not isinstance(tools_value, list):
            raise bad_request("'tools' must be an array.", "tools")
        if len(tools_value) > MAX_TOOLS:
            raise bad_request(f"'tools' has {len(tools_value)} tools; at most {MAX_TOOLS}.",
                              "tools")
        tools = [_tool(t, i) for i, t in enumerate(tools_value)]
        seen: set[str] = set()
        for i, t in enumerate(tools):
            if t.name in seen:
                raise bad_request(f"'tools[{i}].function.name' repeats the tool name "
                                  f"{t.name!r}.", f"tools[{i}].function.name")
            seen.add(t.name)
    choice, function = _choice(choice_value, tools)
    return ToolConfig(tuple(tools), choice, function, True if parallel is None else parallel)


def _choice(value: Any, tools: list[Tool]) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if tools else "none"), None
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise bad_request("'tool_choice' is 'required' but 'tools' is empty.", "tool_choice")
        return value, None
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise bad_request("'tool_choice.function.name' is required.",
                              "tool_choice.function.name")
        return "function", check_tool_name(name, tools, "tool_choice.function.name")
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                      "\"function\", \"function\": {\"name\": ...}}.", "tool_choice")


def check_tool_name(name: str, tools: list[Tool] | tuple[Tool, ...], param: str) -> str:
    if name not in {t.name for t in tools}:
        raise bad_request(f"'{param}' names the tool {name!r}, which is not in 'tools'.", param,
                          "unknown_tool")
    return name


# --- the grammar of a forced call --------------------------------------------------------------
def _call_schema(tool: Tool) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.name},
                                             "arguments": tool.schema},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_grammar(cfg: ToolConfig) -> GrammarSpec | None:
    """The grammar that forces `cfg`'s call(s) in the generic format; None unless forced."""
    if not cfg.forced:
        return None
    tools = [t for t in cfg.tools if cfg.choice == "required" or t.name == cfg.function]
    schemas = [_call_schema(t) for t in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    call = (f"call: {json.dumps(CALL_OPEN)} %json {json.dumps(schema, ensure_ascii=False)} "
            f"{json.dumps(CALL_CLOSE)}\n")
    many = cfg.parallel and cfg.choice == "required"
    start = 'start: call ("\\n" call)*\n' if many else "start: call\n"
    return GrammarSpec("grammar", start + call)


# --- showing tools and earlier calls to the model ----------------------------------------------
def system_text(cfg: ToolConfig) -> str:
    specs = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.schema}} for t in cfg.tools]
    return ("You may call these tools. To call one, reply with one block per call:\n"
            f"{CALL_OPEN}{{\"name\": <tool name>, \"arguments\": <arguments as JSON>}}"
            f"{CALL_CLOSE}\nTools:\n" + json.dumps(specs, ensure_ascii=False))


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it (arguments: a dict, or JSON text that holds one)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # shown as the string it is
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments},
                                  ensure_ascii=False) + CALL_CLOSE


def render_messages(messages: list[dict], cfg: ToolConfig | None) -> list[dict]:
    """Messages with `tool_calls` / role `tool` (OpenAI's shapes) -> plain system / user /
    assistant turns in the generic format, the tool list first when tools are active."""
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            text = RESPONSE_OPEN + content + RESPONSE_CLOSE
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool_results": True})
            continue
        calls = m.get("tool_calls") or ()
        if calls:
            parts = [content] if content else []
            parts += [call_text(c["name"], c["arguments"]) for c in calls]
            content = "\n".join(parts)
        out.append({"role": role, "content": content})
    for m in out:
        m.pop("_tool_results", None)
    if cfg is not None and cfg.active:
        text = system_text(cfg)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def parse_message_tool_calls(msg: dict, i: int) -> tuple[dict, ...]:
    """An assistant message's `tool_calls` as ({"id", "name", "arguments"}, ...)."""
    calls = msg.get("tool_calls")
    if calls is None:
        return ()
    param = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad_request(f"'{param}' must be an array.", param)
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"'{param}[{j}].function.name' is required.",
                              f"{param}[{j}].function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise bad_request(f"'{param}[{j}].function.arguments' must be a JSON string.",
                              f"{param}[{j}].function.arguments")
        check_text(json.dumps(args, ensure_ascii=False), f"{param}[{j}].function.arguments")
        check_text(fn["name"], f"{param}[{j}].function.name")
        out.append({"id": c.get("id") or "", "name": fn["name"], "arguments": args})
    return tuple(out)


def template_messages(messages, cfg: ToolConfig | None) -> list[dict]:
    """Validated `ChatMessage`s as the chat template gets them: plain roles when they carry no
    tools, the generic format (render_messages) when they do."""
    plain = [{"role": m.role, "content": m.content} for m in messages]
    if (cfg is None or not cfg.active) and not any(m.tool_calls or m.role == "tool"
                                                   for m in messages):
        return plain
    for d, m in zip(plain, messages):
        if m.tool_calls:
            d["tool_calls"] = m.tool_calls
    return render_messages(plain, cfg)


def with_parser(cfg: ToolConfig | None, parser: str,
                chat_template: str | None = None) -> ToolConfig | None:
    """`cfg` parsed with the server's `--tool-call-parser` (forced choices keep the generic
    format their grammar writes); `auto`: the one the model's chat template asks for when the
    template renders the tools itself, else the generic format (hermes) the gateway then shows
    the tools and earlier calls in (DeepSeek-V3's / R1's own templates take no `tools`: the
    model is told the generic format, not its control tokens)."""
    if parser == "auto":
        parser = parser_for_template(chat_template) if uses_native_tools(chat_template) \
            else "hermes"
    if cfg is None or cfg.forced or cfg.parser == parser:
        return cfg
    return replace(cfg, parser=parser)


# What a chat template tells the model to write when it calls a tool -> the parser that reads it
# (first match wins); a template that says none of these gets the generic format (hermes).
TEMPLATE_PARSERS = (
    ("[TOOL_CALLS]", "mistral"),            # Mistral, Mixtral, Codestral, Devstral
    ("<｜tool▁calls▁begin｜>", "deepseek_v3"),  # DeepSeek-V3 / V3-0324 / R1 / R1-0528 / V3.1
    ("｜DSML｜", "deepseek_v32"),            # DeepSeek-V3.2's DSML (its encoder, as a template)
    ("<|tool_calls_section_begin|>", "kimi_k2"),  # Kimi K2
    ("<|channel|>", "openai"),              # gpt-oss (harmony)
    ("<parameter=", "qwen3_coder"),         # Qwen3-Coder, Qwen 3.5 (before <tool_call>: they say both)
    ("<arg_key>", "glm45"),                 # GLM-4.5 / 4.6 / 4.7 (likewise)
    ("<|action_start|>", "internlm"),       # InternLM 2 / 2.5
    ("<|start_of_role|>available_tools", "granite"),  # IBM Granite 3.x
    ("<|tool_call|>", "granite"),
    ("<tool_call>", "hermes"),              # Hermes, Qwen 2.5 / Qwen2.5-Coder / Qwen 3
    ("<|python_start|>", "pythonic"),       # Llama 4
    ("[func_name1(", "pythonic"),           # Llama 3.2's system prompt for its 1B / 3B
    ('"parameters": dictionary of argument name', "json"),  # Llama 3.1 / 3.2 / 3.3 JSON calls
)


def parser_for_template(chat_template: str | None) -> str:
    """`--tool-call-parser auto`: the parser for the format `chat_template` asks for."""
    for marker, parser in TEMPLATE_PARSERS:
        if chat_template and marker in chat_template:
            return parser
    return "hermes"


# --- a chat template that renders tools itself (HF's `tools` convention) ----------------------
def uses_native_tools(chat_template: str | None) -> bool:
    """The template reads a `tools` variable (Qwen, Hermes, Llama 3, Mistral templates do;
    DeepSeek-Coder's and tiny-coder's do not)."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template) is not None


def native_messages(messages) -> list[dict]:
    """Validated `ChatMessage`s in HF's chat-template shape: assistant `tool_calls` as
    [{"type": "function", "function": {"name", "arguments": dict}}], tool results with their
    `tool_call_id`."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": _arguments(c["arguments"])}}
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


class TemplateArguments(dict):
    """A call's arguments as chat templates get them: a mapping (Qwen3-Coder's and GLM's
    templates iterate `arguments|items`; others write `arguments|tojson`) that is its JSON text
    where a template uses it as text: DeepSeek-V3's / R1's / V3.1's templates concatenate it
    (`'```json' + '\\n' + tool['function']['arguments']`), which a plain dict cannot (the two-turn
    loop got a 400), and Kimi's print it."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other):
        return str(self) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other):
        return other + str(self) if isinstance(other, str) else NotImplemented


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return TemplateArguments(arguments) if isinstance(arguments, dict) else arguments


def native_tools(cfg: ToolConfig) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.schema}} for t in cfg.tools]

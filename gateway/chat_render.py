"""Chat messages (with tools) -> prompt token ids, for /v1/chat/completions and /v1/messages.

A chat template that renders tools itself (it reads `tools`: Qwen, Hermes, Llama 3, Mistral
templates) gets them, and the messages, in Hugging Face's shape: the template decides how the
model sees them. Any other template (DeepSeek-Coder's, tiny-coder's) gets plain turns in the
generic format of `gateway.tools`. A final assistant prefill (/v1/messages) is appended as text.
"""
from __future__ import annotations

from gateway.body_checks import check_text
from gateway.errors import bad_request
from gateway.tools import (
    ToolConfig,
    native_messages,
    native_tools,
    template_messages,
    uses_native_tools,
)


async def chat_prompt_ids(gw, messages, tools: ToolConfig | None, add_generation_prompt: bool,
                          add_special_tokens: bool, prefill: str = "") -> list[int]:
    if tools is not None and tools.active and not gw.passes_text and \
            uses_native_tools(gw.bundle.chat_template):
        try:
            text = gw.bundle.apply_chat_template(native_messages(messages),
                                                 add_generation_prompt, tools=native_tools(tools))
        except Exception as exc:  # noqa: BLE001 - jinja templates raise anything
            raise bad_request(f"The chat template could not render the messages: {exc}",
                              "messages") from None
        ids = gw.bundle.encode(check_text(text, "messages"), add_special_tokens=add_special_tokens)
    else:
        ids = await gw.encode_chat(template_messages(messages, tools), add_generation_prompt,
                                   add_special_tokens)
    if prefill:
        ids = ids + await gw.encode(prefill, False)
    return ids

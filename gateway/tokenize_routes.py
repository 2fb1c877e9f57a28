"""POST /tokenize and /detokenize, as vLLM's servers answer them, with the tokenizer the backends
sent (so the ids are exactly those a completion request would be given); a gateway without one
(HTTP backends, no --tokenizer) asks its server, as its completions do."""
from __future__ import annotations

from aiohttp import web

from gateway.app_keys import GATEWAY_KEY
from gateway.errors import backend_error, bad_request
from gateway.routes import check_model
from gateway.validation import parse_detokenize_request, parse_json_body, parse_tokenize_request


async def tokenize(request: web.Request) -> web.Response:
    """{"prompt"} or {"messages"} -> {"count", "max_model_len", "tokens", "token_strs"}."""
    gw = request.app[GATEWAY_KEY]
    req = parse_tokenize_request(parse_json_body(await request.read()), gw.config.limits)
    check_model(gw, req.model)
    if gw.passes_text:
        return web.json_response(await _remote_tokenize(gw, req))
    bundle = gw.bundle
    if req.messages is not None:
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
        try:
            text = bundle.apply_chat_template(messages, req.add_generation_prompt)
        except Exception as exc:  # noqa: BLE001 - jinja templates raise anything
            raise bad_request(f"The chat template could not render the messages: {exc}",
                              "messages") from None
    else:
        text = req.prompt
    ids = bundle.encode(text, add_special_tokens=req.add_special_tokens)
    strs = [bundle.tokenizer.id_to_token(i) for i in ids] if req.return_token_strs else None
    return web.json_response({"count": len(ids), "max_model_len": gw.info.max_model_len,
                              "tokens": ids, "token_strs": strs})


async def detokenize(request: web.Request) -> web.Response:
    """{"tokens"} -> {"prompt"} (special tokens kept, as vLLM's /detokenize does)."""
    gw = request.app[GATEWAY_KEY]
    model, tokens = parse_detokenize_request(parse_json_body(await request.read()),
                                             gw.config.limits)
    check_model(gw, model)
    vocab = gw.info.vocab_size
    if vocab and tokens and max(tokens) >= vocab:
        raise bad_request(f"Token id {max(tokens)} in 'tokens' is out of range (vocabulary "
                          f"size {vocab}).", "tokens")
    return web.json_response({"prompt": await gw.decode_prompt(list(tokens),
                                                               skip_special_tokens=False)})


async def _remote_tokenize(gw, req) -> dict:
    """The server's own answer to the same request (its vocabulary, its chat template)."""
    if req.messages is not None:
        body = {"messages": [{"role": m.role, "content": m.content} for m in req.messages],
                "add_generation_prompt": req.add_generation_prompt}
    else:
        body = {"prompt": req.prompt}
    body.update(add_special_tokens=req.add_special_tokens,
                return_token_strs=req.return_token_strs)
    reply = await gw.remote_tokenizer.tokenize_request(
        body, "messages" if req.messages is not None else "prompt")
    tokens = reply.get("tokens")
    if not isinstance(tokens, list):
        raise backend_error("The backend's /tokenize answered without 'tokens'.")
    return {"count": len(tokens), "max_model_len": gw.info.max_model_len, "tokens": tokens,
            "token_strs": reply.get("token_strs") if req.return_token_strs else None}

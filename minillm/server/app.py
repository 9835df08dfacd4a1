"""The OpenAI-compatible HTTP server over `AsyncLLM` (chapter 9): a thin layer.

    POST /v1/completions, /v1/chat/completions ─► protocol.parse (400 if bad) ─► AsyncLLM ─► JSON, or
                                                                                server-sent events
    GET  /v1/models, /health, /metrics (Prometheus text: minillm/server/metrics.py)

It validates, translates to `SamplingParams`, streams, and aborts a request whose client went away;
every decision about *serving* stays in the engine. Errors have OpenAI's shape,
{"error": {"message", "type", "param", "code"}}: 400 for a bad body or an over-long prompt, 404 for
an unknown model, 401 for a missing or wrong API key when the server has one.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from minillm.async_engine import AsyncLLM
from minillm.engine import RequestOutput
from minillm.prompts import encode_prompt
from minillm.server.chat_template import render_chat
from minillm.server.metrics import ServerMetrics
from minillm.server.protocol import GenerationRequest, RequestError, parse

FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}
DISCONNECT_POLL_S = 0.25  # how often a request not yet streaming checks that its client is still there
MAX_BODY_BYTES = 4 << 20  # 4 MiB: far more than any prompt the context can hold, far less than a flood


class ApiKeyCheck:
    """ASGI middleware: /v1/ routes need "Authorization: Bearer <key>" (401 otherwise). Plain ASGI on
    purpose: FastAPI's @app.middleware("http") would hide a client's disconnect from the routes."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                err = RequestError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                   kind="authentication_error")
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def max_token_chars(tokenizer, vocab_size: int) -> int:
    """The most characters one token decodes to: a text longer than max_model_len times this cannot fit."""
    try:
        return max(1, max(len(tokenizer.decode([i])) for i in range(vocab_size)))
    except Exception:  # a tokenizer that cannot decode every id alone: fall back to a generous bound
        return 64


def build_app(llm: AsyncLLM, model_name: str, api_key: str | None = None, default_max_tokens: int = 16) -> FastAPI:
    """The server's routes over `llm`, serving it under `model_name`."""
    app = FastAPI(title="minillm", docs_url=None, redoc_url=None)
    created = int(time.time())
    engine, tokenizer = llm.engine, llm.engine.tokenizer
    longest_token_chars = max_token_chars(tokenizer, engine.model.config.vocab_size)
    history = ServerMetrics()

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def not_here(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        body = RequestError(err.status_code, str(err.detail), kind=kind).body()
        return JSONResponse(body, status_code=err.status_code)

    if api_key is not None:
        app.add_middleware(ApiKeyCheck, api_key=api_key)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(history.render(llm.engine), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "minillm"}]}

    async def read(request: Request, chat: bool) -> GenerationRequest:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise RequestError(413, f"the body has {declared} bytes, more than this server takes ({MAX_BODY_BYTES})")
        try:
            raw = await request.body()
        except ClientDisconnect:
            raise RequestError(400, "the client went away while sending its body") from None
        if len(raw) > MAX_BODY_BYTES:
            raise RequestError(413, f"the body has {len(raw)} bytes, more than this server takes ({MAX_BODY_BYTES})")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as err:  # also: a number of thousands of digits, deep nesting
            raise RequestError(400, f"the body is not valid JSON: {str(err)[:200]}") from None
        req = parse(body, chat, default_max_tokens)
        if req.model != model_name:
            raise RequestError(404, f"model {req.model!r} does not exist: this server serves {model_name!r}",
                               "model", kind="not_found_error")
        return req

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await read(request, chat=False)
        return await respond(request, req, await token_ids(req.prompt, req, "prompt"), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await read(request, chat=True)
        return await respond(request, req, await token_ids(render_chat(tokenizer, req.messages), req, "messages"),
                             chat=True)

    async def token_ids(prompt: str | list[int], req: GenerationRequest, param: str) -> list[int]:
        """The prompt's checked token ids, tokenized in a worker thread (a long text would otherwise hold
        up every other client); a text too long to fit the context whatever its tokens is refused unread."""
        if isinstance(prompt, str) and len(prompt) > engine.max_model_len * longest_token_chars:
            raise RequestError(400, f"prompt has {len(prompt)} characters: more than the context of "
                                    f"{engine.max_model_len} tokens can hold", param)
        try:
            ids = await asyncio.get_running_loop().run_in_executor(
                None, encode_prompt, tokenizer, prompt, engine.max_model_len, engine.model.config.vocab_size)
        except ValueError as err:
            raise RequestError(400, str(err), param) from None
        if len(ids) + req.params.max_new_tokens > engine.max_model_len:
            raise RequestError(400, f"max_tokens={req.params.max_new_tokens} with a prompt of {len(ids)} tokens "
                                    f"exceeds the context of {engine.max_model_len} tokens", "max_tokens")
        return ids

    async def until_done_or_gone(request: Request, awaitable) -> bool:
        """Wait for `awaitable`; False (and it is cancelled) if the client disconnects first."""
        task = asyncio.ensure_future(awaitable)
        while not task.done():
            await asyncio.wait([task], timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                return False
        return True

    async def respond(request: Request, req: GenerationRequest, prompt: list[int], chat: bool):
        answer_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        param = "prompt" if not chat else "messages"
        if req.stream:
            events = llm.stream_events(prompt, req.params, request_id=answer_id)
            first = asyncio.ensure_future(anext(events))  # a refused request raises here, before any byte
            if not await until_done_or_gone(request, first):  # gone while it waited in the queue
                await events.aclose()  # aborts the request
                history.count_abort()
                return JSONResponse({}, status_code=499)
            try:
                first_event = first.result()
            except ValueError as err:
                raise RequestError(400, str(err), param) from None
            return StreamingResponse(sse(answer_id, req, chat, first_event, events), media_type="text/event-stream")
        future = llm.submit(prompt, req.params, request_id=answer_id)
        if not await until_done_or_gone(request, future):  # cancelling the future aborted the request
            history.count_abort()
            return JSONResponse({}, status_code=499)
        try:
            out: RequestOutput = future.result()
        except ValueError as err:
            raise RequestError(400, str(err), param) from None
        history.record(out)
        if out.finish_reason == "error":
            raise RequestError(500, f"the request failed in the engine: {out.error}", kind="server_error")
        return whole(answer_id, out, chat)

    def usage(out: RequestOutput) -> dict:
        return {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": len(out.token_ids),
                "total_tokens": len(out.prompt_token_ids) + len(out.token_ids)}

    def whole(answer_id: str, out: RequestOutput, chat: bool) -> dict:
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out.text},
                      "finish_reason": FINISH[out.finish_reason], "logprobs": None}
        else:
            choice = {"index": 0, "text": out.text, "finish_reason": FINISH[out.finish_reason], "logprobs": None}
        return {"id": answer_id, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model_name, "choices": [choice], "usage": usage(out)}

    def chunk(answer_id: str, chat: bool, text: str | None, finish: str | None, role: bool = False) -> dict:
        if chat:
            delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {"id": answer_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model_name, "choices": [choice]}

    async def sse(answer_id: str, req: GenerationRequest, chat: bool, first,
                  events: AsyncIterator) -> AsyncIterator[str]:
        """Server-sent events: a chunk per text delta, one with the finish reason, the usage, [DONE]."""
        def event(data: dict) -> str:
            return f"data: {json.dumps(data)}\n\n"

        recorded = False
        try:
            if chat:
                yield event(chunk(answer_id, chat, "", None, role=True))
            pending = [first]
            while True:
                for delta, out in pending:
                    if out is not None:
                        history.record(out)
                        recorded = True
                        yield event(chunk(answer_id, chat, None if chat else "", FINISH[out.finish_reason]))
                        if req.include_usage:
                            yield event({"id": answer_id, "object": "chat.completion.chunk" if chat else
                                         "text_completion", "created": int(time.time()), "model": model_name,
                                         "choices": [], "usage": usage(out)})
                        yield "data: [DONE]\n\n"
                        return
                    if delta:
                        yield event(chunk(answer_id, chat, delta, None))
                pending = [await anext(events)]
        finally:
            await events.aclose()  # a client gone mid-stream: the request is aborted there
            if not recorded:
                history.count_abort()

    return app

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

from minillm.async_engine import AsyncLLM
from minillm.engine import RequestOutput
from minillm.server.chat_template import render_chat
from minillm.server.metrics import ServerMetrics
from minillm.server.protocol import GenerationRequest, RequestError, parse

FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


def build_app(llm: AsyncLLM, model_name: str, api_key: str | None = None, default_max_tokens: int = 16) -> FastAPI:
    """The server's routes over `llm`, serving it under `model_name`."""
    app = FastAPI(title="minillm", docs_url=None, redoc_url=None)
    created = int(time.time())
    tokenizer = llm.engine.tokenizer
    history = ServerMetrics()

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if api_key is not None and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                err = RequestError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                   kind="authentication_error")
                return JSONResponse(err.body(), status_code=401)
        return await call_next(request)

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
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RequestError(400, f"the body is not valid JSON: {err}") from None
        req = parse(body, chat, default_max_tokens)
        if req.model != model_name:
            raise RequestError(404, f"model {req.model!r} does not exist: this server serves {model_name!r}",
                               "model", kind="not_found_error")
        return req

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await read(request, chat=False)
        return await respond(request, req, req.prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await read(request, chat=True)
        return await respond(request, req, render_chat(tokenizer, req.messages), chat=True)

    async def respond(request: Request, req: GenerationRequest, prompt, chat: bool):
        answer_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if req.stream:
            events = llm.stream_events(prompt, req.params, request_id=answer_id)
            try:
                first = await anext(events)  # a refused request raises here, before any byte is sent
            except ValueError as err:
                raise RequestError(400, str(err), "prompt" if not chat else "messages") from None
            return StreamingResponse(sse(answer_id, req, chat, first, events), media_type="text/event-stream")
        future = llm.submit(prompt, req.params, request_id=answer_id)
        while not future.done():
            await asyncio.wait([future], timeout=DISCONNECT_POLL_S)
            if not future.done() and await request.is_disconnected():
                future.cancel()  # aborts the request: its KV is free before the next step
                return JSONResponse({}, status_code=499)
        try:
            out: RequestOutput = future.result()
        except ValueError as err:
            raise RequestError(400, str(err), "prompt" if not chat else "messages") from None
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

        try:
            if chat:
                yield event(chunk(answer_id, chat, "", None, role=True))
            pending = [first]
            while True:
                for delta, out in pending:
                    if out is not None:
                        history.record(out)
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

    return app

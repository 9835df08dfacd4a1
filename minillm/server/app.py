"""The OpenAI-compatible HTTP server over `AsyncLLM` (chapter 9): a thin layer.

    POST /v1/completions, /v1/chat/completions ─► body.py (bounded, parsed off the loop) ─► protocol.py
        (400 if bad) ─► tokenized off the loop (AsyncLLM.encode) ─► a structured output compiled off the
        loop (grammar_check.py: 400 if the library refuses it) ─► AsyncLLM ─► JSON, or server-sent
        events (streaming.py)
    POST /tokenize, /detokenize                 vLLM's shapes: {"count", "max_model_len", "tokens"}, {"prompt"}
    GET  /v1/models, /v1/models/{id}            the served model, with its max_model_len
    GET  /health (HEAD too), /metrics           Prometheus text: minillm/server/metrics.py

It validates, translates to `SamplingParams`, streams, and aborts a request whose client went away;
every decision about *serving* stays in the engine. Errors have OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, whatever goes wrong: 400 for a bad body or an
over-long prompt, 413 for a body over MAX_BODY_BYTES, 404 for an unknown model or route, 401 for a
missing or wrong API key when the server has one (every route but /health and /metrics), and a 500
in the same shape for a defect — never plain text. Nothing slow runs on the event loop: reading JSON,
checking token ids, rendering a chat template and tokenizing all happen in worker threads (and a
large body's JSON in a helper process: body.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets
import time
import uuid
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minillm.async_engine import AsyncLLM
from minillm.engine import RequestOutput
from minillm.server.body import MAX_BODY_BYTES, BodyDecoder, read_body
from minillm.server.chat_template import ChatTemplateError, has_chat_template, render_chat
from minillm.server.grammar_check import GrammarCheck
from minillm.server.logprob_format import LogprobFormatter
from minillm.server.metrics import ServerMetrics
from minillm.server.protocol import (
    GenerationRequest,
    RequestError,
    max_list_items,
    parse,
    parse_detokenize,
    parse_tokenize,
)
from minillm.server.responses import model_card, whole
from minillm.server.streaming import sse

__all__ = ["MAX_BODY_BYTES", "build_app"]

DISCONNECT_POLL_S = 0.25  # how often a request not yet streaming checks that its client is still there
OPEN_PATHS = ("/health", "/metrics")  # what a server with an API key still answers without one


class ApiKeyCheck:
    """ASGI middleware: every route but /health and /metrics needs "Authorization: Bearer <key>" (401
    otherwise). Plain ASGI on purpose: FastAPI's @app.middleware("http") would hide a client's
    disconnect from the routes."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                err = RequestError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                   kind="authentication_error")
                await JSONResponse(err.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(llm: AsyncLLM, model_name: str, api_key: str | None = None, default_max_tokens: int = 16,
              cors_origins: list[str] | None = None) -> FastAPI:
    """The server's routes over `llm`, serving it under `model_name`. `default_max_tokens` is a
    completion's when it gives none (a chat's is the rest of the context, as OpenAI's); `cors_origins`
    lets browsers on those origins call the API ("*": any), off by default."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await decoder.aclose()
        grammars.close()

    app = FastAPI(title="minillm", docs_url=None, redoc_url=None, lifespan=lifespan)
    created = int(time.time())
    tokenizer, vocab_size, max_len = llm.tokenizer, llm.model_config.vocab_size, llm.max_model_len
    history = ServerMetrics()
    formatter = LogprobFormatter(tokenizer)  # names tokens in logprobs (each id decoded once)
    decoder = BodyDecoder(max_items=max_list_items(max_len))  # no list in a usable request is longer
    grammars = GrammarCheck(tokenizer, vocab_size, llm.model_config.eos_token_ids)  # structured outputs' 400s
    # each endpoint's body check (protocol.py), run off the event loop by `decoder`
    completion_check = functools.partial(parse, chat=False, default_max_tokens=default_max_tokens,
                                         vocab_size=vocab_size, max_model_len=max_len)
    chat_check = functools.partial(completion_check, chat=True)
    detokenize_check = functools.partial(parse_detokenize, vocab_size=vocab_size, most=max_len)

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        # a body refused for its size is not read to its end: the connection closes after the answer
        close = {"connection": "close"} if err.status == 413 else None
        return JSONResponse(err.body(), status_code=err.status, headers=close)

    @app.exception_handler(StarletteHTTPException)
    async def not_here(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        body = RequestError(err.status_code, str(err.detail), kind=kind).body()
        return JSONResponse(body, status_code=err.status_code)

    @app.exception_handler(Exception)
    async def defect(request: Request, err: Exception) -> JSONResponse:  # logged by the server too
        body = RequestError(500, f"the server failed: {type(err).__name__}: {err}", kind="server_error").body()
        return JSONResponse(body, status_code=500)

    if api_key is not None:
        app.add_middleware(ApiKeyCheck, api_key=api_key)
    if cors_origins:  # added last, so outermost: a browser's preflight is answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    # ------------------------------------------------------------------ the server and its model
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health(request: Request) -> Response:
        if llm.error is not None:  # the engine core process is gone: this server can answer nothing
            return Response(status_code=503) if request.method == "HEAD" else JSONResponse(
                {"status": "unavailable", "error": llm.error}, status_code=503)
        return Response(status_code=200) if request.method == "HEAD" else JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(history.render(llm.gauges()), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card(model_name, created, max_len)]}

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str) -> dict:
        check_model(model_id)
        return model_card(model_name, created, max_len)

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise RequestError(404, f"model {name!r} does not exist: this server serves {model_name!r}", "model",
                               kind="not_found_error", code="model_not_found")

    async def body(request: Request, check: Callable[[object], object]):
        """The request's body, read with a bound, parsed and checked by `check` off the event loop."""
        return await decoder.decode(await read_body(request), check)

    # ------------------------------------------------------------------ tokens
    async def prompt_ids(prompt: str | list[int] | None, messages: list[dict] | None, add_special_tokens: bool | None,
                         add_generation_prompt: bool = True, continue_final_message: bool = False,
                         tools: list[dict] | None = None) -> list[int]:
        """The prompt's checked token ids: a chat rendered by its template (with the `tools` it must
        call), then tokenized (both in worker threads). A template writes its own special tokens: its
        text gets none added unless asked; a completion's prompt (and the plain transcript) gets the
        tokenizer's."""
        param = "prompt" if messages is None else "messages"
        try:
            if messages is not None:
                prompt = await asyncio.to_thread(render_chat, tokenizer, messages, add_generation_prompt,
                                                 continue_final_message, tools)
                if add_special_tokens is None:
                    add_special_tokens = not has_chat_template(tokenizer)
            return await llm.encode(prompt, add_special_tokens is not False)
        except ChatTemplateError as err:
            raise RequestError(400, str(err), "messages") from None
        except ValueError as err:
            raise RequestError(400, str(err), param) from None

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        req = await body(request, parse_tokenize)
        check_model(req.model)
        ids = await prompt_ids(req.prompt, req.messages, req.add_special_tokens, req.add_generation_prompt,
                               req.continue_final_message)
        answer = {"count": len(ids), "max_model_len": max_len, "tokens": ids}
        if req.return_token_strs:
            answer["token_strs"] = await asyncio.to_thread(token_strings, tokenizer, ids)
        return answer

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        model, ids = await body(request, detokenize_check)
        check_model(model)
        return {"prompt": await asyncio.to_thread(tokenizer.decode, ids)}

    # ------------------------------------------------------------------ generation
    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await body(request, completion_check)
        check_model(req.model)
        return await respond(request, req, await prompt_ids(req.prompt, None, req.add_special_tokens))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await body(request, chat_check)
        check_model(req.model)
        ids = await prompt_ids(None, req.messages, req.add_special_tokens, req.add_generation_prompt,
                               req.continue_final_message, list(req.tools.tools) if req.tools is not None else None)
        return await respond(request, req, ids)

    async def until_done_or_gone(request: Request, awaitable) -> bool:
        """Wait for `awaitable`; False (and it is cancelled, its cancellation complete) if the client
        disconnects first."""
        task = asyncio.ensure_future(awaitable)
        while not task.done():
            await asyncio.wait([task], timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await asyncio.wait([task])  # a generator inside must have stopped before anyone closes it
                return False
        return True

    async def respond(request: Request, req: GenerationRequest, prompt: list[int]):
        if llm.error is not None:
            raise RequestError(503, f"the engine is not running: {llm.error}", kind="server_error")
        chat = req.messages is not None
        answer_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        param = "messages" if chat else "prompt"
        params = req.params
        if params.n > 1 and llm.config.batching == "static":
            raise RequestError(400, f"n={params.n} samples need continuous batching (this server batches statically)",
                               "n")
        if params.n > llm.config.max_num_seqs:
            raise RequestError(400, f"n={params.n} samples run at once, each in a batch slot, and this server has "
                                    f"{llm.config.max_num_seqs} (--max-num-seqs)", "n")
        try:  # what the parameters ask of the vocabulary (the engine checks it too, without naming the field)
            params.check_vocab(vocab_size, llm.model_config.eos_token_ids)
        except ValueError as err:
            raise RequestError(400, str(err), "min_tokens" if "min_tokens" in str(err) else "logit_bias") from None
        if params.structured is not None:  # compiled here first: a constraint the library refuses is a 400
            try:
                await grammars.check(params.structured)
            except ValueError as err:
                raise RequestError(400, str(err), req.constraint_field) from None
        prompt_text = ""
        if req.echo:  # the prompt as text: as it was sent, or its token ids decoded
            prompt_text = req.prompt if isinstance(req.prompt, str) else await asyncio.to_thread(
                tokenizer.decode, prompt, skip_special_tokens=params.skip_special_tokens)
        if req.max_tokens_is_rest:
            if params.min_tokens > max_len - len(prompt):
                raise RequestError(400, f"min_tokens={params.min_tokens} is more than the {max_len - len(prompt)} "
                                        "tokens the context leaves after the prompt", "min_tokens")
            params = dataclasses.replace(params, max_new_tokens=max_len - len(prompt))
        elif len(prompt) + params.max_new_tokens > max_len:
            raise RequestError(400, f"max_tokens={params.max_new_tokens} with a prompt of {len(prompt)} tokens "
                                    f"exceeds the context of {max_len} tokens", "max_tokens")
        if req.stream:
            events = llm.stream_events(prompt, params, request_id=answer_id)
            first = asyncio.ensure_future(anext(events))  # a refused request raises here, before any byte
            if not await until_done_or_gone(request, first):  # gone while it waited in the queue
                await events.aclose()  # the request was aborted when its wait was cancelled
                history.count_abort()
                return JSONResponse({}, status_code=499)
            try:
                first_event = first.result()
            except ValueError as err:
                raise RequestError(400, str(err), param) from None
            return StreamingResponse(sse(answer_id, model_name, req, prompt, prompt_text, first_event, events, history,
                                         formatter), media_type="text/event-stream")
        future = llm.submit(prompt, params, request_id=answer_id)
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
        return whole(answer_id, model_name, out, req, formatter, prompt_text)

    return app


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    """Each token id's own string (the tokenizer's vocabulary entry, or its text alone)."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        return [str(t) for t in convert(ids)]
    return [tokenizer.decode([i]) for i in ids]

"""The Starlette app: the OpenAI-compatible routes, health, metrics and admin.

Handlers parse and check at the edge (`validation`), hand a request to the stepping thread
(`bridge.EngineBridge.submit`) and read its `bridge.Stream`; nothing here calls the engine's
step, and nothing a client does (reading slowly, going away) holds a step. A client that goes
away mid-stream aborts its request (its slot is free at the next step).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from .admin import MAX_PROFILE_STEPS, admin_allowed, profile_window, reload_args_from_body
from .bridge import QueueFull, Stream
from .config import MAX_BODY_BYTES
from .logprobs import LogprobCursor, chat_logprobs, completion_logprobs, token_logprobs
from .metrics import HttpMetrics
from .state import ServeState
from .text import TextCursor, chat_prompt_ids, encode_prompt
from .validation import BadRequest, GenerationRequest, parse_body, parse_chat, parse_completion

__all__ = ["build_app"]

WAKE_S = 1.0  # a reader re-checks its stream at least this often


def error_response(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
                   ) -> JSONResponse:
    """An OpenAI-style error body: message, type, param (the field) and code (the status)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": field, "code": status}},
                        status_code=status, headers=headers)


async def read_body(request: Request) -> bytes:
    """The whole body, refused (`BadRequest` "body") past `MAX_BODY_BYTES` before more is read."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        raise BadRequest("body", f"Content-Length {length[:20]}: at most {MAX_BODY_BYTES} bytes (1 MiB)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest("body", f"over {MAX_BODY_BYTES} bytes (1 MiB)")
        chunks.append(chunk)
    return b"".join(chunks)


def _state(request: Request) -> ServeState:
    return request.app.state.serve


def _not_serving(st: ServeState) -> JSONResponse | None:
    if st.phase == "serving":
        return None
    why = {"starting": "the engine is starting", "draining": "the server is shutting down (draining)",
           "failed": f"the engine failed to start: {st.error}"}[st.phase]
    return error_response(503, why, headers={"Retry-After": str(st.config.retry_after_s)})


def _prompt_ids(st: ServeState, req: GenerationRequest) -> list[int]:
    """The request's prompt as ids, refused (`BadRequest` naming the field) by the engine's own
    admission rules before anything is queued."""
    if req.kind == "chat":
        ids = chat_prompt_ids(st.tokenizer, req.messages)
    elif isinstance(req.prompt, list):
        ids = req.prompt
    else:
        ids = encode_prompt(st.tokenizer, req.prompt)
    field = "messages" if req.kind == "chat" else "prompt"
    why = st.rules.refusal(ids, req.max_tokens, field=field, budget="max_tokens")
    if why is not None:
        raise BadRequest(field, why)
    return ids


async def _submit(request: Request, parse: Callable[..., GenerationRequest]) -> Response:
    st = _state(request)
    refused = _not_serving(st)
    if refused is not None:
        return refused
    try:
        data = parse_body(await read_body(request))
        req = parse(data, st.config.model_name, st.config.max_tokens_limit)
        ids = await asyncio.to_thread(_prompt_ids, st, req)
        if st.phase != "serving":  # a drain began meanwhile
            return _not_serving(st) or error_response(503, "not serving")
        streams = _submit_choices(st, ids, req)
    except BadRequest as exc:
        return error_response(exc.status, str(exc), exc.field)
    except ClientDisconnect:  # gone while sending its body: nothing was enqueued
        return Response(status_code=400)
    except QueueFull as exc:
        return error_response(429, f"too many requests: {exc}", headers={"Retry-After": str(st.config.retry_after_s)})
    except (ValueError, TypeError) as exc:  # the engine's own checks (a request it cannot serve)
        return error_response(400, f"prompt: {exc}", "prompt")
    rid = f"{'chatcmpl' if req.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    if len(streams) > 1:
        return await _whole_choices(request, [_Reply(st, req, s, rid, ids) for s in streams])
    reply = _Reply(st, req, streams[0], rid, ids)
    if req.stream:
        return StreamingResponse(reply.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await reply.whole(request)


class _Reply:
    """One request's answer, built from its stream (pieces for SSE, or the whole body)."""

    def __init__(self, st: ServeState, req: GenerationRequest, stream: Stream, rid: str,
                 prompt_ids: list[int] | None = None) -> None:
        self.st, self.req, self.stream, self.rid = st, req, stream, rid
        self.prompt_ids = prompt_ids
        self.cursor = TextCursor(st.tokenizer, req.stop)
        self.chat = req.kind == "chat"
        self.seen = 0  # tokens behind the text handed out so far
        self.lp: LogprobCursor | None = None  # a streamed reply's log-probabilities (`stream_logprobs`)
        self.lp_offset = 0  # characters of the tokens whose log-probabilities were sent

    async def pieces(self, gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
        """New text as committed; ends when the request ends, a stop string came or ``gone()``
        says the client left. The request is aborted when the reader stops early (a stop string,
        a client gone: a stream's generator is closed then)."""
        s = self.stream
        try:
            while True:
                await s.changed(WAKE_S)
                if gone is not None and await gone():
                    return
                done, error, tokens = s.done, s.error, s.tokens
                if error is not None:
                    raise _StreamFailed(error)
                piece = self.cursor.advance(tokens, done)
                self.seen = len(tokens)
                if piece:
                    yield piece
                if done or self.cursor.stopped:
                    return
        finally:
            self.st.bridge.abort(s)

    def finish_reason(self) -> str:
        tokens = self.stream.tokens
        if self.cursor.stopped or (tokens and len(tokens) < self.req.max_tokens):
            return "stop"  # a stop string, or EOS before max_tokens
        return "length"

    def usage(self) -> dict[str, int]:
        p, c = self.stream.prompt_len, len(self.stream.tokens)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _chunk(self, text: str | None, finish: str | None, role: bool = False,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.st.created, "model": self.req.model, "choices": [choice]}

    async def events(self) -> AsyncIterator[str]:
        """Server-sent events: one chunk per committed piece, the finish, usage when asked, then
        ``data: [DONE]``. A failed request sends an error event before ``[DONE]``."""
        try:
            if self.chat:
                yield _sse(self._chunk(None, None, role=True))
            async for piece in self.pieces():
                yield _sse(self._chunk(piece, None, logprobs=await self.stream_logprobs(self.seen)))
            # the tokens left (past a stop string, or behind no text) with the finish, as a whole reply has them
            yield _sse(self._chunk(None, self.finish_reason(),
                                   logprobs=await self.stream_logprobs(len(self.stream.tokens))))
            if self.req.include_usage:
                yield _sse({**self._chunk(None, None), "choices": [], "usage": self.usage()})
        except _StreamFailed as exc:
            yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None, "code": 500}})
        yield "data: [DONE]\n\n"

    async def whole(self, request: Request) -> Response:
        try:
            text = "".join([p async for p in self.pieces(request.is_disconnected)])
        except _StreamFailed as exc:
            return error_response(500, str(exc))
        finish = self.finish_reason()
        logprobs = await self.logprobs() if self.req.logprobs is not None else None
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return JSONResponse({"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                             "created": self.st.created, "model": self.req.model, "choices": [choice],
                             "usage": self.usage()})


    async def stream_logprobs(self, upto: int) -> dict[str, Any] | None:
        """A chunk's log-probabilities: those of the reply's tokens before ``upto`` not sent yet
        (a `LogprobCursor`, computed between two steps); None when the request asks for none."""
        st, req = self.st, self.req
        if req.logprobs is None:
            return None
        if self.lp is None:
            params = req.sampling.params(dict(st.config.sampling_defaults))[0]
            self.lp = LogprobCursor(st.bridge.engine.target, list(self.prompt_ids or []),
                                    params.temperature if params is not None else 0.0, req.logprobs or 0)
        lp, tokens = self.lp, list(self.stream.tokens[:upto])
        entries = await asyncio.wrap_future(st.bridge.call_at_boundary(lambda: lp.advance(tokens)))
        if self.chat:
            return chat_logprobs(st.tokenizer, entries)
        out = completion_logprobs(st.tokenizer, entries, self.lp_offset)
        self.lp_offset += sum(len(t) for t in out["tokens"])
        return out

    async def logprobs(self) -> dict[str, Any]:
        """The reply's log-probabilities (`serve.logprobs`), computed between two steps."""
        st, req = self.st, self.req
        params = req.sampling.params(dict(st.config.sampling_defaults))[0]
        temperature = params.temperature if params is not None else 0.0
        target, prompt, tokens = st.bridge.engine.target, list(self.prompt_ids or []), list(self.stream.tokens)
        entries = await asyncio.wrap_future(st.bridge.call_at_boundary(
            lambda: token_logprobs(target, prompt, tokens, temperature, req.logprobs or 0)))
        return (chat_logprobs if self.chat else completion_logprobs)(st.tokenizer, entries)


def _submit_choices(st: ServeState, ids: list[int], req: GenerationRequest) -> list[Stream]:
    """One engine request per choice (``n``), each with its `SamplingParams` (the request's
    fields over the model's defaults); all or none: a refusal aborts those already queued."""
    streams: list[Stream] = []
    try:
        for params in req.sampling.params(dict(st.config.sampling_defaults)):
            streams.append(st.bridge.submit(ids, req.max_tokens, params))
    except BaseException:
        for s in streams:
            st.bridge.abort(s)
        raise
    return streams


async def _whole_choices(request: Request, replies: list[_Reply]) -> Response:
    """The whole answer of ``n`` > 1 choices (index i: choice i), usage summed over them."""
    bodies = []
    for reply in replies:
        response = await reply.whole(request)
        if response.status_code != 200:
            for other in replies:
                other.st.bridge.abort(other.stream)
            return response
        bodies.append(json.loads(response.body))
    out = bodies[0]
    out["choices"] = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
    completion = sum(b["usage"]["completion_tokens"] for b in bodies)
    out["usage"] = {"prompt_tokens": out["usage"]["prompt_tokens"], "completion_tokens": completion,
                    "total_tokens": out["usage"]["prompt_tokens"] + completion}
    return JSONResponse(out)


class _StreamFailed(RuntimeError):
    """The request failed in the engine (a failed step, a failed admission, a drain's end)."""


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def completions(request: Request) -> Response:
    return await _submit(request, parse_completion)


async def chat_completions(request: Request) -> Response:
    return await _submit(request, parse_chat)


def models(request: Request) -> Response:
    st = _state(request)
    return JSONResponse({"object": "list", "data": [{"id": st.config.model_name, "object": "model",
                                                      "created": st.created, "owned_by": "draftgraph"}]})


async def health(request: Request) -> Response:
    """Phase (starting, serving, draining, failed), graph readiness and the live requests. On
    the event loop (a few reads, no lock held long): no hop through a thread pool that a flood
    of requests keeps busy."""
    st = _state(request)
    out: dict[str, Any] = {"status": st.phase, "model": st.config.model_name}
    if st.error:
        out["error"] = st.error
    if st.bridge is not None:
        engine = st.bridge.engine
        startup = engine.startup()
        out.update(st.bridge.counts())
        out.update(steps=st.bridge.steps, step_failures=st.bridge.step_failures, backend=engine.backend,
                   capture=startup.get("capture"), graphs_ready_s=startup.get("graphs_ready_s"),
                   graphs_ready=startup.get("graphs_ready_s") is not None,  # the engine's 0.0 where nothing captures
                   generation=getattr(engine.worker, "generation", None))
    return JSONResponse(out, status_code=200 if st.phase == "serving" else 503)


def metrics(request: Request) -> Response:
    return Response(generate_latest(_state(request).registry), media_type=CONTENT_TYPE_LATEST)


def _admin_refusal(request: Request) -> JSONResponse | None:
    """The socket's peer decides: a forwarded address (from a ``--trust-proxy`` proxy) can only
    take loopback rights away, never grant them."""
    st = _state(request)
    peer = request.scope.get(PEER_KEY, request.scope.get("client"))
    hosts = [c[0] if c else None for c in (peer, request.scope.get("client"))]
    token = request.headers.get("authorization")
    if all(admin_allowed(h, token, st.config.admin_token) for h in hosts):
        return None
    how = "with the bearer token of --admin-token-file" if st.config.admin_token else "(no --admin-token-file given)"
    return error_response(403, f"admin routes answer loopback callers only, or others {how}")


async def admin_reload(request: Request) -> Response:
    """Body: a reload file's content (JSON or TOML); applied at the next step boundary."""
    st = _state(request)
    refused = _admin_refusal(request) or _not_serving(st)
    if refused is not None:
        return refused
    policy = request.query_params.get("policy", "swap")
    try:
        if policy not in ("swap", "release_first"):
            raise BadRequest("policy", f"{policy[:40]!r} must be swap or release_first")
        args = reload_args_from_body(await read_body(request), request.headers.get("content-type"))
        await asyncio.to_thread(st.bridge.engine.request_reload, args, policy)
    except BadRequest as exc:
        return error_response(exc.status, str(exc), exc.field)
    except (ValueError, TypeError) as exc:  # the engine refused it: still serving the previous state
        return error_response(400, f"reload refused: {exc}", "body")
    spec = args.speculative
    return JSONResponse({"queued": True, "policy": policy, "applied": "at the next step boundary",
                         "speculative": {"num_steps": spec.num_steps, "topk": spec.topk,
                                         "num_draft_tokens": spec.num_draft_tokens}}, status_code=202)


async def admin_profile(request: Request) -> Response:
    """Body (optional): {"steps": N, "spans_only": bool}; answers the trace path and table."""
    st = _state(request)
    refused = _admin_refusal(request) or _not_serving(st)
    if refused is not None:
        return refused
    try:
        raw = await read_body(request)
        data = parse_body(raw) if raw.strip() else {}
        unknown = sorted(set(data) - {"steps", "spans_only"})
        if unknown:
            raise BadRequest(unknown[0], "unknown field (steps, spans_only)")
        steps = data.get("steps", 16)
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_PROFILE_STEPS:
            raise BadRequest("steps", f"{steps!r} must be an integer in [1, {MAX_PROFILE_STEPS}]")
        spans_only = data.get("spans_only", True)
        if not isinstance(spans_only, bool):
            raise BadRequest("spans_only", f"{spans_only!r} must be true or false")
        return JSONResponse(await profile_window(st.bridge, steps, spans_only, st.config.profile_dir))
    except BadRequest as exc:
        return error_response(exc.status, str(exc), exc.field)


def build_app(state: ServeState) -> Any:
    """The ASGI app over ``state`` (HTTP figures counted into ``state.registry``). The socket's
    peer is kept in the scope (`PEER_KEY`) before X-Forwarded-For is read, and that header is
    read only from the ``--trust-proxy`` addresses."""
    app = Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/reload", admin_reload, methods=["POST"]),
        Route("/admin/profile", admin_profile, methods=["POST"]),
    ])
    app.state.serve = state

    def streams() -> dict[str, int]:
        return state.bridge.counts() if state.bridge is not None else {"running": 0, "waiting": 0, "live": 0}

    paths = tuple(r.path for r in app.routes)
    outer: Any = HttpMetrics(app, state.registry, streams, paths)
    trust = state.config.limits.trust_proxy
    if trust is not None:
        outer = ProxyHeadersMiddleware(outer, trusted_hosts=trust)
    return KeepPeer(outer)


PEER_KEY = "draftgraph.peer"


class KeepPeer:
    """Puts the socket's peer in the scope (`PEER_KEY`) before any proxy header is read."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope[PEER_KEY] = scope.get("client")
        await self.app(scope, receive, send)

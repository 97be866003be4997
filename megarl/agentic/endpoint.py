"""An OpenAI-compatible HTTP endpoint on loopback, served from the trainer's own engines during generation,
so that an agent written against the official `openai` client (`rollout.agent.agent_function`) is
trained unchanged.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`. Each request belongs to
a trajectory named by its session: the `X-Megarl-Session` header (megarl's agent runner sets it on each
agent's client), else the request's `user` field.

What differs from OpenAI's API, on purpose:
- sampling comes from the trainer's `rollout.*` config (temperature, top_p, seed are accepted and
  ignored: the trained policy's samples must come from the configured sampler); `model` is accepted and
  ignored; `max_tokens` / `max_completion_tokens` can only lower the configured response cap;
- `n` > 1, `stream=true`, `stop`, `tool_choice` other than "auto", a `response_format` other than text,
  `echo` and `suffix` are refused (400): each would make the returned text differ from what the
  trainer's sampler generates and trains on; `logprobs` are answered with null;
- content given as a list of `{"type": "text", "text": ...}` parts is joined with "\\n" (as vLLM does);
  other part types are refused.

The backend (the trainer side, `ChatBackend`) receives messages in the shape transformers' chat
templates expect: an assistant turn's tool calls as `{"id", "type": "function", "function": {"name",
"arguments": dict}}`, tool messages with their `tool_call_id` and `name`, content never None.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from megarl.agentic.openai_requests import (
    EndpointRequestError,
    json_object,
    prompt_of,
    refuse_unsupported,
    template_messages,
    token_cap,
    tools_of,
)
from megarl.agentic.tools.hermes import ToolCall
from megarl.errors import MegarlError

SESSION_HEADER = "X-Megarl-Session"
MAX_BODY_BYTES = 64 << 20

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """One generated turn, as the backend returns it."""

    content: str | None  # assistant text without tool-call blocks (None when only calls)
    tool_calls: list[ToolCall]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    text: str  # the raw generated text (for /v1/completions)


class ChatBackend(Protocol):
    """The trainer side: owns the engine and the token-space trajectories. Blocking and thread-safe
    (called from the server's handler threads, one per connection)."""

    def chat(
        self, session: str, messages: list[dict], tools: list[dict] | None, max_tokens: int | None
    ) -> Reply: ...

    def complete(self, session: str, prompt: str | list[int], max_tokens: int | None) -> Reply: ...


def _error_body(message: str, status: int, param: str | None, code: str | None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


class OpenAIServer:
    """`/v1` over `backend` on a loopback port (0: any free one), served from a daemon thread.

    with OpenAIServer(backend) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="megarl")
    """

    def __init__(self, backend: ChatBackend, host: str = "127.0.0.1", port: int = 0, model: str = "megarl"):
        self.backend, self.model = backend, model
        self._address = (host, port)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("OpenAIServer.base_url is known once start() has bound the port")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> OpenAIServer:
        if self._httpd is None:
            self._httpd = _HTTPServer(self._address, _handler_for(self))
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, name="megarl-openai-endpoint", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            assert self._thread is not None
            self._thread.join()
            self._httpd = self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The routes: a parsed JSON body in, the response body out (a refusal raises EndpointRequestError).

    def chat_completions(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        refuse_unsupported(body)
        messages, tools, cap = template_messages(body.get("messages")), tools_of(body), token_cap(body)
        reply = self.backend.chat(session, messages, tools, cap)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    # unique within a conversation and the same when an agent is replayed (a template may
                    # render the ids it is sent back)
                    "id": f"call_{len(messages)}_{j}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for j, c in enumerate(reply.tool_calls)
            ]
        choice = {"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
        return self._envelope("chatcmpl", "chat.completion", choice, reply)

    def completions(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        refuse_unsupported(body)
        for key in ("echo", "suffix"):
            if body.get(key):
                raise EndpointRequestError(
                    f"{key} is not supported by megarl's endpoint; remove it", param=key
                )
        reply = self.backend.complete(session, prompt_of(body), token_cap(body))
        finish = "length" if reply.finish_reason == "length" else "stop"  # completions have no "tool_calls"
        choice = {"index": 0, "text": reply.text, "finish_reason": finish, "logprobs": None}
        return self._envelope("cmpl", "text_completion", choice, reply)

    def models(self) -> dict[str, Any]:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "megarl"}
        return {"object": "list", "data": [model]}

    def _envelope(self, prefix: str, kind: str, choice: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": _usage(reply),
        }


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: hundreds of agents connect at once (the default is 5)


def _handler_for(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the openai client pools its connections
        timeout = 600  # an idle kept-alive connection frees its thread after this

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, server.models())
            else:
                self._not_found()

        def do_POST(self) -> None:
            route = {"/v1/chat/completions": server.chat_completions, "/v1/completions": server.completions}
            handle = route.get(self.path.split("?")[0].rstrip("/"))
            try:
                raw = self._read()  # read even for an unknown route: the connection stays usable
                if handle is None:
                    return self._not_found()
                body = json_object(raw)
                session = self.headers.get(SESSION_HEADER) or body.get("user")
                if not isinstance(session, str) or not session:
                    raise EndpointRequestError(
                        f"no session: megarl's endpoint maps each request to a trajectory by the "
                        f"{SESSION_HEADER} header (megarl's agent runner sets it on each agent's client) "
                        "or else the request's `user` field; set one of them",
                        param="user",
                    )
                self._send(200, handle(session, body))
            except EndpointRequestError as e:
                self._send(e.status, _error_body(str(e), e.status, e.param, e.code))
            except Exception as e:  # the backend failed: the client gets the reason, never a hung socket
                if not isinstance(e, MegarlError | ValueError):
                    _log.exception("megarl endpoint: %s failed", self.path)
                message = f"megarl's generation backend failed on {self.path}: {type(e).__name__}: {e}"
                self._send(500, _error_body(message, 500, None, None))

        def do_PUT(self) -> None:
            self._not_allowed()

        do_DELETE = do_PATCH = do_PUT

        def _read(self) -> bytes:
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                self.close_connection = True
                raise EndpointRequestError(
                    f"Content-Length: {length} is not a body size up to {MAX_BODY_BYTES} bytes; send the "
                    "JSON body with its length (chunked bodies are not read)"
                )
            return self.rfile.read(int(length))

        def _not_found(self) -> None:
            message = (
                f"no route {self.command} {self.path}: megarl's endpoint serves POST /v1/chat/completions, "
                "POST /v1/completions and GET /v1/models"
            )
            self._send(404, _error_body(message, 404, None, "unknown_url"))

        def _not_allowed(self) -> None:
            self.close_connection = True  # the body is not read
            self._not_found()

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, ensure_ascii=False).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (an agent's time-out)
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("megarl endpoint: " + format, *args)

    return Handler

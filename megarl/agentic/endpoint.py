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


class EndpointRequestError(MegarlError, ValueError):
    """A request the endpoint refuses; sent to the client as OpenAI's error JSON with `status`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def _error_body(message: str, status: int, param: str | None, code: str | None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --- requests ---------------------------------------------------------------------------------------


def _refuse_unsupported(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise EndpointRequestError(
            f"n={n} is not supported: megarl's endpoint returns one choice per request (each request "
            "extends one trajectory); send n requests, each with its own session, or set n=1",
            param="n",
        )
    if body.get("stream"):
        raise EndpointRequestError(
            "stream=true is not supported by megarl's endpoint: it answers each request whole; call "
            "without stream (the default)",
            param="stream",
        )
    if body.get("stop"):
        raise EndpointRequestError(
            "stop is not supported: generation ends at the model's end-of-turn tokens and the trainer's "
            "response cap, so that the returned text is exactly what is trained on; remove stop",
            param="stop",
        )
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise EndpointRequestError(
            f"response_format={json.dumps(response_format)} is not supported: the policy samples without "
            "constrained decoding, as in training; ask for the format in the prompt and parse the text",
            param="response_format",
        )


def _max_tokens(body: dict[str, Any]) -> int | None:
    caps = []
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EndpointRequestError(f"{key}={value!r} must be a positive integer", param=key)
        caps.append(value)
    return min(caps) if caps else None


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise EndpointRequestError(
                    f"{where}[{i}] has type {kind!r}: megarl's endpoint takes text only "
                    '(a string, or parts {"type": "text", "text": ...})',
                    param=where,
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise EndpointRequestError(
        f"{where} is a {type(content).__name__}: give a string or a list of text parts", param=where
    )


def _template_tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise EndpointRequestError(
            f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', param=where
        )
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise EndpointRequestError(
                f"{where}.function.arguments is not valid JSON ({e}); send the arguments string the "
                "endpoint returned",
                param=f"{where}.function.arguments",
            ) from None
    if not isinstance(arguments, dict):
        raise EndpointRequestError(
            f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments"
        )
    out: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI request messages in the shape transformers' chat templates expect (see the module doc);
    "developer" messages become "system"; a tool message without `name` gets its call's name."""
    if not isinstance(messages, list) or not messages:
        raise EndpointRequestError("messages must be a non-empty list", param="messages")
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise EndpointRequestError(
                f"{where}.role={role!r}: use system, developer, user, assistant or tool",
                param=f"{where}.role",
            )
        assert isinstance(message, dict)
        entry: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _text(message.get("content"), f"{where}.content"),
        }
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise EndpointRequestError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            if calls:
                entry["tool_calls"] = [
                    _template_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)
                ]
                for c in entry["tool_calls"]:
                    if "id" in c:
                        call_names[c["id"]] = c["function"]["name"]
            if isinstance(message.get("reasoning_content"), str):
                entry["reasoning_content"] = message["reasoning_content"]
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str):
                entry["tool_call_id"] = call_id
            name = message.get("name")
            if not isinstance(name, str) and isinstance(call_id, str):
                name = call_names.get(call_id)
            if isinstance(name, str):
                entry["name"] = name
        elif isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        out.append(entry)
    return out


def _tools(body: dict[str, Any]) -> list[dict] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto"):
        raise EndpointRequestError(
            f"tool_choice={choice!r} is not supported: the model decides whether to call a tool, as in "
            'training; leave tool_choice unset or "auto" (to forbid calls, send no tools)',
            param="tool_choice",
        )
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and "name" in t["function"] for t in tools
    ):
        raise EndpointRequestError(
            'tools must be a list of {"type": "function", "function": {"name", "description", "parameters"}}',
            param="tools",
        )
    return tools


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        raise EndpointRequestError(
            f"prompt is a batch of {len(prompt)}: megarl's endpoint takes one prompt per request (each "
            "extends one trajectory); send one request per prompt, each with its own session",
            param="prompt",
        )
    raise EndpointRequestError("prompt must be a string or a non-empty list of token ids", param="prompt")


def _json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise EndpointRequestError("request body is empty: send the request as a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EndpointRequestError(f"request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise EndpointRequestError(f"request body must be a JSON object, not {type(body).__name__}")
    return body


# --- responses --------------------------------------------------------------------------------------


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

    # The handlers: a parsed JSON body in, (status, JSON body) out.

    def chat_completions(self, session: str, body: dict[str, Any]) -> dict[str, Any]:
        _refuse_unsupported(body)
        messages, tools, cap = template_messages(body.get("messages")), _tools(body), _max_tokens(body)
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
        _refuse_unsupported(body)
        for key in ("echo", "suffix"):
            if body.get(key):
                raise EndpointRequestError(
                    f"{key} is not supported by megarl's endpoint; remove it", param=key
                )
        reply = self.backend.complete(session, _prompt(body), _max_tokens(body))
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
                body = _json_object(raw)
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

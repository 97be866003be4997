"""OpenAI request bodies, checked and turned into what megarl's `ChatBackend` takes: messages in the
shape transformers' chat templates expect, the tools, the prompt, the response cap. Every refusal is
an `EndpointRequestError` whose message names the field and the fix (see endpoint.py for the why)."""

from __future__ import annotations

import json
from typing import Any

from megarl.errors import MegarlError


class EndpointRequestError(MegarlError, ValueError):
    """A request the endpoint refuses; sent to the client as OpenAI's error JSON with `status`."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def refuse_unsupported(body: dict[str, Any]) -> None:
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


def token_cap(body: dict[str, Any]) -> int | None:
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


def tools_of(body: dict[str, Any]) -> list[dict] | None:
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


def prompt_of(body: dict[str, Any]) -> str | list[int]:
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


def json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise EndpointRequestError("request body is empty: send the request as a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EndpointRequestError(f"request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise EndpointRequestError(f"request body must be a JSON object, not {type(body).__name__}")
    return body

"""megarl's OpenAI-compatible endpoint driven by the official `openai` client, and the runner of user
agents. The backend here is a deterministic stand-in for the trainer side (the HTTP layer is under
test; the vLLM-backed backend is tested with the engine)."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
import time

import openai
import pytest

from megarl.agentic.agents import AgentOutcome, run_agents
from megarl.agentic.endpoint import OpenAIServer, Reply
from megarl.agentic.tools.hermes import ToolCall

pytestmark = pytest.mark.unit

TLS = ssl.create_default_context()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "exact arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


class EchoBackend:
    """Answers "<session>: <last message's content>"; with tools and a user message last, calls the
    calculator on that content. Records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object, object, int | None]] = []
        self.lock = threading.Lock()
        self.barrier: threading.Barrier | None = None
        self.in_flight = self.peak = 0
        self.fail: Exception | None = None

    def _enter(self, record: tuple) -> None:
        with self.lock:
            self.calls.append(record)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def chat(self, session, messages, tools, max_tokens):
        self._enter((session, "chat", messages, tools, max_tokens))
        try:
            if self.fail is not None:
                raise self.fail
            if self.barrier is not None and len(messages) == 1:
                self.barrier.wait(timeout=5)  # the first turns of `parties` agents are in flight together
            last = messages[-1]["content"]
            if tools and messages[-1]["role"] == "user":
                call = ToolCall("calculator", {"expression": last}, json.dumps({"name": "calculator"}))
                return Reply(
                    None, [call], "tool_calls", len(messages), 9, f"<tool_call>{call.raw}</tool_call>"
                )
            text = f"{session}: {last}"
            return Reply(text, [], "stop", len(messages), len(text), text)
        finally:
            with self.lock:
                self.in_flight -= 1

    def complete(self, session, prompt, max_tokens):
        self._enter((session, "complete", prompt, None, max_tokens))
        with self.lock:
            self.in_flight -= 1
        text = f"{session}+{prompt}"
        return Reply(text, [], "tool_calls", 3, 2, text)


@pytest.fixture(scope="module")
def server():
    backend = EchoBackend()
    with OpenAIServer(backend, model="tiny-policy") as server:
        yield server


@pytest.fixture
def backend(server):
    server.backend.__init__()  # a clean record per test; the server (and its port) is shared
    return server.backend


def call(server, make_request, session: str | None = "s0"):
    """Run `make_request(client)` on a fresh client (with `session` in its header) and return its result."""

    async def go():
        headers = {"X-Megarl-Session": session} if session else None
        client = openai.AsyncOpenAI(
            base_url=server.base_url,
            api_key="x",
            max_retries=0,
            default_headers=headers,
            http_client=openai.DefaultAsyncHttpx2Client(verify=TLS),  # one CA bundle load, not one per client
        )
        try:
            return await make_request(client)
        finally:
            await client.close()

    return asyncio.run(go())


def test_chat_returns_the_backends_reply_in_openais_schema(server, backend):
    reply = call(
        server,
        lambda c: c.chat.completions.create(
            model="ignored",
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            temperature=0.3,
            top_p=0.5,
            seed=7,
            max_tokens=50,
            max_completion_tokens=20,
        ),
    )
    assert reply.choices[0].message.content == "s0: hi"
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop" and reply.model == "tiny-policy"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (2, 6, 8)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert backend.calls == [("s0", "chat", messages, None, 20)]  # the lower of the two caps


def test_tool_calls_round_trip_and_come_back_in_transformers_shape(server, backend):
    async def agent(client):
        messages = [{"role": "user", "content": "12*34"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        calls = first.choices[0].message.tool_calls
        messages.append(first.choices[0].message)  # the client's own object, as agents commonly do
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "408"})
        second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return first, second

    first, second = call(server, agent)
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
    (tool_call,) = first.choices[0].message.tool_calls
    assert (tool_call.type, tool_call.id, tool_call.function.name) == ("function", "call_1_0", "calculator")
    assert json.loads(tool_call.function.arguments) == {"expression": "12*34"}
    assert second.choices[0].message.content == "s0: 408"
    assert backend.calls[0][3] == TOOLS
    assert backend.calls[1][2] == [
        {"role": "user", "content": "12*34"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "12*34"}},
                }
            ],
        },
        {"role": "tool", "content": "408", "tool_call_id": "call_1_0", "name": "calculator"},
    ]


def test_text_parts_are_joined_and_developer_messages_are_system(server, backend):
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    call(
        server,
        lambda c: c.chat.completions.create(
            model="m",
            messages=[{"role": "developer", "content": "rules"}, {"role": "user", "content": parts}],
        ),
    )
    assert backend.calls[0][2] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "one\ntwo"},
    ]


def test_completions_take_text_or_token_ids(server, backend):
    text = call(server, lambda c: c.completions.create(model="m", prompt="2+2=", max_tokens=4))
    ids = call(server, lambda c: c.completions.create(model="m", prompt=[5, 6, 7]))
    assert text.choices[0].text == "s0+2+2=" and text.object == "text_completion"
    assert text.choices[0].finish_reason == "stop"  # the backend's "tool_calls" has no completions meaning
    assert ids.choices[0].text == "s0+[5, 6, 7]"
    assert [c[2:] for c in backend.calls] == [("2+2=", None, 4), ([5, 6, 7], None, None)]


def test_models_lists_the_policy(server):
    models = call(server, lambda c: c.models.list())
    assert [m.id for m in models.data] == ["tiny-policy"]


def test_the_session_comes_from_the_header_else_from_user(server, backend):
    messages = [{"role": "user", "content": "x"}]
    by_user = call(server, lambda c: c.chat.completions.create(model="m", messages=messages, user="u7"), None)
    both = call(server, lambda c: c.chat.completions.create(model="m", messages=messages, user="u7"), "h3")
    assert by_user.choices[0].message.content == "u7: x" and both.choices[0].message.content == "h3: x"
    assert [c[0] for c in backend.calls] == ["u7", "h3"]


USER = [{"role": "user", "content": "x"}]
BAD_REQUESTS = [  # request arguments, exception, status, the message after "Error code: N - "
    (
        {"messages": USER, "n": 2},
        openai.BadRequestError,
        "n=2 is not supported: megarl's endpoint returns one choice per request (each request extends one "
        "trajectory); send n requests, each with its own session, or set n=1",
    ),
    (
        {"messages": USER, "stream": True},
        openai.BadRequestError,
        "stream=true is not supported by megarl's endpoint: it answers each request whole; call without stream "
        "(the default)",
    ),
    (
        {"messages": USER, "stop": ["Observation:"]},
        openai.BadRequestError,
        "stop is not supported: generation ends at the model's end-of-turn tokens and the trainer's response "
        "cap, so that the returned text is exactly what is trained on; remove stop",
    ),
    (
        {"messages": USER, "tools": TOOLS, "tool_choice": "required"},
        openai.BadRequestError,
        "tool_choice='required' is not supported: the model decides whether to call a tool, as in training; "
        'leave tool_choice unset or "auto" (to forbid calls, send no tools)',
    ),
    (
        {"messages": USER, "response_format": {"type": "json_object"}},
        openai.BadRequestError,
        'response_format={"type": "json_object"} is not supported: the policy samples without constrained '
        "decoding, as in training; ask for the format in the prompt and parse the text",
    ),
    (
        {"messages": USER, "max_tokens": 0},
        openai.BadRequestError,
        "max_tokens=0 must be a positive integer",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        openai.BadRequestError,
        "messages[0].content[0] has type 'image_url': megarl's endpoint takes text only (a string, or parts "
        '{"type": "text", "text": ...})',
    ),
    (
        {"messages": [{"role": "robot", "content": "x"}]},
        openai.BadRequestError,
        "messages[0].role='robot': use system, developer, user, assistant or tool",
    ),
    (
        {"messages": []},
        openai.BadRequestError,
        "messages must be a non-empty list",
    ),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{1"}}
                    ],
                }
            ]
        },
        openai.BadRequestError,
        "messages[0].tool_calls[0].function.arguments is not valid JSON (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)); send the arguments string the endpoint returned",
    ),
]


@pytest.mark.parametrize("request_args, error, message", BAD_REQUESTS, ids=lambda v: None)
def test_a_refused_chat_request_raises_the_clients_error_with_the_reason(
    server, backend, request_args, error, message
):
    with pytest.raises(error) as caught:
        call(server, lambda c: c.chat.completions.create(model="m", **request_args))
    assert caught.value.status_code == 400
    assert caught.value.body["message"] == message and caught.value.body["type"] == "invalid_request_error"
    assert backend.calls == []


def test_a_request_without_a_session_is_refused(server, backend):
    with pytest.raises(openai.BadRequestError) as caught:
        call(server, lambda c: c.chat.completions.create(model="m", messages=USER), session=None)
    assert caught.value.body["message"] == (
        "no session: megarl's endpoint maps each request to a trajectory by the X-Megarl-Session header "
        "(megarl's agent runner sets it on each agent's client) or else the request's `user` field; set one of them"
    )


def test_refused_completions_requests(server, backend):
    with pytest.raises(openai.BadRequestError) as batch:
        call(server, lambda c: c.completions.create(model="m", prompt=["a", "b"]))
    with pytest.raises(openai.BadRequestError) as echo:
        call(server, lambda c: c.completions.create(model="m", prompt="a", echo=True))
    assert batch.value.body["message"] == (
        "prompt is a batch of 2: megarl's endpoint takes one prompt per request (each extends one trajectory); "
        "send one request per prompt, each with its own session"
    )
    assert echo.value.body["message"] == "echo is not supported by megarl's endpoint; remove it"
    assert backend.calls == []


@pytest.mark.parametrize(
    "fault", [ValueError("prompt is 5000 tokens, over rollout.prompt_length=4096"), KeyError("k")]
)
def test_a_backend_failure_is_a_500_with_its_message(server, backend, fault):
    backend.fail = fault
    with pytest.raises(openai.InternalServerError) as caught:
        call(server, lambda c: c.chat.completions.create(model="m", messages=USER))
    assert caught.value.status_code == 500 and caught.value.body["type"] == "server_error"
    assert caught.value.body["message"] == (
        f"megarl's generation backend failed on /v1/chat/completions: {type(fault).__name__}: {fault}"
    )


def raw_request(server, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    host, port = server.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request(method, path, body=body, headers={"X-Megarl-Session": "raw"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_unknown_routes_and_bodies_that_are_not_json(server, backend):
    routes = "megarl's endpoint serves POST /v1/chat/completions, POST /v1/completions and GET /v1/models"
    assert raw_request(server, "POST", "/v1/embeddings", b"{}") == (
        404,
        {
            "error": {
                "message": f"no route POST /v1/embeddings: {routes}",
                "type": "invalid_request_error",
                "param": None,
                "code": "unknown_url",
            }
        },
    )
    assert raw_request(server, "GET", "/v2/models")[0] == 404
    assert (
        raw_request(server, "DELETE", "/v1/models")[1]["error"]["message"]
        == f"no route DELETE /v1/models: {routes}"
    )
    status, body = raw_request(server, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["message"].startswith(
        "request body is not JSON: Expecting property name"
    )
    assert raw_request(server, "POST", "/v1/completions")[1]["error"]["message"] == (
        "request body is empty: send the request as a JSON object"
    )
    assert raw_request(server, "POST", "/v1/completions", b"[1]") == (
        400,
        {
            "error": {
                "message": "request body must be a JSON object, not list",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
    )
    assert backend.calls == []


async def two_turn_agent(client, sample):
    messages = [{"role": "user", "content": sample["question"]}]
    first = await client.chat.completions.create(model="m", messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    second = await client.chat.completions.create(model="m", messages=messages)
    return len(first.choices[0].message.content) + (
        second.choices[0].message.content == f"{sample['id']}: again"
    )


def test_agents_run_concurrently_and_each_session_sees_only_its_own_messages(server, backend):
    n, concurrency = 24, 4
    backend.barrier = threading.Barrier(concurrency)  # a group of 4 first turns must be in flight together
    samples = [{"id": f"sess-{i}", "question": f"q{i}"} for i in range(n)]
    start = time.monotonic()
    outcomes = run_agents(
        two_turn_agent, samples, server.base_url, [s["id"] for s in samples], concurrency, 10.0
    )
    assert time.monotonic() - start < 5
    assert outcomes == [AgentOutcome(float(len(f"sess-{i}: q{i}") + 1), None) for i in range(n)]
    assert backend.peak == concurrency
    for sample in samples:
        seen = [c[2] for c in backend.calls if c[0] == sample["id"]]
        assert seen == [
            [{"role": "user", "content": sample["question"]}],
            [
                {"role": "user", "content": sample["question"]},
                {"role": "assistant", "content": f"{sample['id']}: {sample['question']}"},
                {"role": "user", "content": "again"},
            ],
        ]


async def one_turn_agent(client, sample):
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "n"}])
    return float(reply.choices[0].message.content == f"{sample['id']}: n")


def test_a_burst_of_agents_all_connect_at_once(server, backend):
    """More simultaneous connections than the stdlib server's default listen backlog (5)."""
    samples = [{"id": f"b{i}"} for i in range(128)]
    outcomes = run_agents(one_turn_agent, samples, server.base_url, [s["id"] for s in samples], 128, 30.0)
    assert outcomes == [AgentOutcome(1.0, None)] * 128


async def failing_agent(client, sample):
    kind = sample["kind"]
    if kind == "raises":
        return 1 / 0
    if kind == "bad_request":
        await client.chat.completions.create(model="m", messages=[], n=1)
    if kind == "sleeps":
        await asyncio.sleep(30)
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": kind}])
    return {
        "ok": 1.0,
        "string": reply.choices[0].message.content,
        "none": None,
        "nan": float("nan"),
        "bool": True,
    }[kind]


def test_an_agents_failure_or_bad_reward_is_its_outcomes_error(server, backend):
    kinds = ["ok", "raises", "string", "none", "nan", "bad_request", "bool"]
    outcomes = run_agents(failing_agent, [{"kind": k} for k in kinds], server.base_url, kinds, 8, 30.0)
    line = failing_agent.__code__.co_firstlineno + 3
    assert outcomes == [
        AgentOutcome(1.0, None),
        AgentOutcome(None, f"ZeroDivisionError: division by zero (at test_endpoint.py:{line})"),
        AgentOutcome(None, "the agent returned a str ('string: string'); return the reward as a number"),
        AgentOutcome(None, "the agent returned a NoneType (None); return the reward as a number"),
        AgentOutcome(None, "the agent returned nan; return a finite number as the reward"),
        AgentOutcome(
            None,
            f"BadRequestError: Error code: 400 - messages must be a non-empty list (at test_endpoint.py:{line + 2})",
        ),
        AgentOutcome(1.0, None),
    ]
    late = run_agents(
        failing_agent, [{"kind": "sleeps"}, {"kind": "ok"}], server.base_url, ["a", "b"], 2, 0.5
    )
    assert late == [
        AgentOutcome(None, "TimeoutError: the agent did not finish within 0.5 s"),
        AgentOutcome(1.0, None),
    ]

"""An agent written against the official `openai` client, trained by megarl unchanged.

During generation megarl serves an OpenAI-compatible endpoint from its engines and calls
`agent(client, sample)` once per sample, `client` an `openai.AsyncOpenAI` bound to that sample's session:
every request of the agent continues the same conversation, kept in token space by megarl (what the
model is trained on is exactly what it generated and was given). The reward the agent returns is the
sample's reward (reward.weights.agent_reward).

    megarl train configs/agentic_grpo.yaml \
        rollout.agent.default_agent_loop=openai_agent \
        rollout.agent.agent_function=examples/agents/calc_agent.py:agent

The calculator runs here, in the agent, as it would in any harness; megarl's built-in tool loop
(`tool_agent`) given the same task produces the same token streams for the same seed.
"""

from __future__ import annotations

import ast
import json
import operator
import re

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 347 * 86"}},
            "required": ["expression"],
        },
    },
}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """+, - and * of integers, exactly."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"unsupported expression {expression!r}")

    return str(value(ast.parse(expression, mode="eval").body))


async def agent(client, sample: dict) -> float:
    messages = list(sample["raw_prompt"])
    message = None
    for _ in range(3):  # rollout.multi_turn.max_assistant_turns in the tool loop
        response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
            except Exception as e:  # the model reads the error, as with megarl's own tools
                result = f"error: {type(e).__name__}: {e}"
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": "calculator", "content": result}
            )
    answers = re.findall(r"answer:\s*(-?\d+)", (message.content or "") if message else "")
    return float(bool(answers) and answers[-1] == str(sample["ground_truth"]))

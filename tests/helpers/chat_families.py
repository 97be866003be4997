"""Tokenizers of three chat-template families that the tiny model can run (every id < 1001).

Each is megarl's tiny byte-level BPE (`megarl.models.tiny.build_tokenizer`, 657 ids) plus the family's
own special tokens as added tokens (ids 657 and up), with a chat template written here in our own Jinja
that reproduces the real template's rendered format:

- ``llama3``: Llama 3.1 Instruct. Every conversation opens with a system header (date lines, and
  ``Environment: ipython`` when tools are given); tools go into the first user turn as JSON; user and
  assistant contents are trimmed; a ``tool`` message renders as the ``ipython`` role, its content through
  ``tojson`` (so a string arrives quoted, as in the real template).
- ``qwen2_5``: Qwen2.5 Instruct (ChatML). A default system turn when none is given; tools listed inside
  ``<tools></tools>`` in the system turn; tool messages as ``<tool_response>`` blocks inside one user
  turn (consecutive tool messages share it).
- ``qwen3``: Qwen3 (ChatML as Qwen2.5, no default system). Assistant ``<think>...</think>`` reasoning is
  kept only for turns after the last real user query, so a new user message rewrites earlier turns;
  ``enable_thinking=False`` appends an empty think block to the generation prompt.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast

from megarl.models.tiny import TINY_DEFAULTS, build_tokenizer

FAMILIES = ("llama3", "qwen2_5", "qwen3")

# Tokens that end an assistant turn, as the real checkpoints' generation_config lists them (first: the
# tokenizer's eos_token, the template's end-of-turn token).
STOP_TOKENS: dict[str, tuple[str, ...]] = {
    "llama3": ("<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"),
    "qwen2_5": ("<|im_end|>", "<|endoftext|>"),
    "qwen3": ("<|im_end|>", "<|endoftext|>"),
}

_LLAMA3 = """\
{{- bos_token }}
{%- set date_string = date_string | default('26 Jul 2024') %}
{%- if messages and messages[0].role == 'system' %}
  {%- set system_message = messages[0].content | trim %}
  {%- set messages = messages[1:] %}
{%- else %}
  {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}
{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}
{{- system_message + '<|eot_id|>' }}
{%- if tools %}
  {%- if not messages %}{{- raise_exception('tools need a first user message to go in') }}{%- endif %}
  {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}
  {{- 'Answer with a JSON function call from this list when a function helps.\\n\\n' }}
  {{- 'Format: {"name": function name, "parameters": dictionary of arguments}.\\n\\n' }}
  {%- for tool in tools %}{{- tool | tojson(indent=4) + '\\n\\n' }}{%- endfor %}
  {{- messages[0].content | trim + '<|eot_id|>' }}
  {%- set messages = messages[1:] %}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'tool' or message.role == 'ipython' %}
    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
    {%- if message.content is mapping or message.content is iterable %}
      {{- message.content | tojson }}
    {%- else %}
      {{- message.content }}
    {%- endif %}
    {{- '<|eot_id|>' }}
  {%- elif message.tool_calls %}
    {%- set call = message.tool_calls[0].function or message.tool_calls[0] %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
    {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' }}
  {%- else %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
    {{- message.content | trim + '<|eot_id|>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

# The system part with tools, shared by both Qwen templates ({{ system }} is filled per family).
_QWEN_TOOLS = """\
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'Function signatures are inside <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a JSON object with the function name and ' }}
{{- 'arguments inside <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
"""

# An assistant turn's structured tool calls; NO_NEWLINE is the family's condition for no newline before one.
_QWEN_CALLS = """\
    {%- for call in message.tool_calls or [] %}
      {%- set call = call.function or call %}
      {%- if not (NO_NEWLINE) %}{{- '\\n' }}{%- endif %}
      {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + call.arguments | tojson }}
      {{- '}\\n</tool_call>' }}
    {%- endfor %}
"""

_QWEN_TOOL_MESSAGE = """\
  {%- elif message.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
  {%- endif %}
"""

_QWEN2_5 = (
    """\
{%- if tools %}
  {{- '<|im_start|>system\\n' }}
  {%- if messages[0].role == 'system' %}{{- messages[0].content }}
  {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
  {{- '\\n\\n' }}
"""
    + _QWEN_TOOLS
    + """\
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
  {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
  {%- set content = message.content or '' %}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' %}
    {{- '<|im_start|>assistant' }}{%- if content %}{{- '\\n' + content }}{%- endif %}
"""
    + _QWEN_CALLS.replace("NO_NEWLINE", "false")  # Qwen2.5: a newline before every call
    + "    {{- '<|im_end|>\\n' }}\n"
    + _QWEN_TOOL_MESSAGE
    + """\
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
)

_QWEN3 = (
    """\
{%- if tools %}
  {{- '<|im_start|>system\\n' }}
  {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
"""
    + _QWEN_TOOLS
    + """\
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{#- The last user message that is a real query (not a wrapped tool response) -#}
{%- set ns = namespace(last_query=messages | length - 1, searching=true) %}
{%- for message in messages[::-1] %}
  {%- set text = message.content if message.content is string else '' %}
  {%- if ns.searching and message.role == 'user'
        and not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
    {%- set ns.searching = false %}
    {%- set ns.last_query = messages | length - 1 - loop.index0 %}
  {%- endif %}
{%- endfor %}
{%- for message in messages %}
  {%- set content = message.content if message.content is string else '' %}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' %}
    {%- set reasoning = '' %}
    {%- if message.reasoning_content is string %}
      {%- set reasoning = message.reasoning_content %}
    {%- elif '</think>' in content %}
      {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
      {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
      {{- content.lstrip('\\n') }}
    {%- else %}
      {{- '<|im_start|>assistant\\n' + content }}
    {%- endif %}
"""
    + _QWEN_CALLS.replace("NO_NEWLINE", "loop.first and not content")  # Qwen3: none before a bare call
    + "    {{- '<|im_end|>\\n' }}\n"
    + _QWEN_TOOL_MESSAGE
    + """\
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|im_start|>assistant\\n' }}
  {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""
)

_QWEN_SPECIALS = ("<|endoftext|>",)  # <|im_start|> and <|im_end|> are in the tiny tokenizer already
_QWEN_WORDS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# (special tokens added, plain added tokens, bos, eos, pad, template)
_SPECS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str | None, str, str, str]] = {
    "llama3": (
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>")
        + ("<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
        (),
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|pad|>",
        _LLAMA3,
    ),
    "qwen2_5": (_QWEN_SPECIALS, _QWEN_WORDS, None, "<|im_end|>", "<|endoftext|>", _QWEN2_5),
    # Qwen3 marks <think> and </think> as added but not special (decoding keeps them).
    "qwen3": (
        _QWEN_SPECIALS,
        _QWEN_WORDS + ("<think>", "</think>"),
        None,
        "<|im_end|>",
        "<|endoftext|>",
        _QWEN3,
    ),
}


def family_tokenizer(name: str, out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with family `name`'s special tokens and chat template (see the module doc);
    saved to `out_dir` when given, so that AutoTokenizer and vLLM load it from there."""
    if name not in _SPECS:
        raise ValueError(f"unknown chat family {name!r}; use one of {FAMILIES}")
    tokenizer = copy.deepcopy(_build(name))  # a fresh object each call: callers may change it
    if out_dir is not None:
        tokenizer.save_pretrained(Path(out_dir))
    return tokenizer


@functools.cache
def _build(name: str) -> PreTrainedTokenizerFast:
    specials, words, bos, eos, pad, template = _SPECS[name]
    tokenizer = build_tokenizer(TINY_DEFAULTS["vocab_size"])
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in specials]},
        replace_extra_special_tokens=False,
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in words])
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = bos, eos, pad
    tokenizer.chat_template = template
    top = max(tokenizer.get_vocab().values())
    assert top < TINY_DEFAULTS["vocab_size"], f"{name}: token id {top} is outside the tiny model's vocab"
    return tokenizer


def stop_token_ids(tokenizer: PreTrainedTokenizerFast, name: str) -> list[int]:
    """The ids of family `name`'s stop tokens (STOP_TOKENS) in `tokenizer`."""
    return [tokenizer.convert_tokens_to_ids(token) for token in STOP_TOKENS[name]]

"""The tokens a multi-turn rollout appends between generated assistant turns, read off the chat template.

A multi-turn trajectory never re-tokenises its past: after the engine generates an assistant turn, the
tool or user messages that follow are appended as tokens, and the engine continues from there. Those
tokens are what the tokenizer's own chat template would put after an assistant turn:

    ...assistant text<|im_end|>  \\n<|im_start|>user\\n<tool_response>\\n...</tool_response><|im_end|>\\n<|im_start|>assistant\\n
    ^ generated (its stop token)  ^ appended: the rest of the turn boundary, each message, the generation prompt

`ChatFormat` finds them by rendering a placeholder conversation (a user question and an assistant answer)
followed by the new messages, and cutting the render right after the placeholder answer. No family has
hand-written token tables: the end-of-turn token is the first token the template writes after an
assistant's content, and everything else comes from the template's own text (tools in the system part,
tool messages wrapped in a user turn, an ``ipython`` role, an empty think block in the generation prompt).
The text is tokenised on its own; it starts at an added token (the end-of-turn token), so the cut falls on
a token boundary of the full render as well.

The render is done once per sequence of roles (("tool",), ("tool", "tool"), ("user",), ...) with slot
markers as contents, giving the literal text around each message; a message's content then goes into its
slot. That is checked at the same time against renders of awkward contents (spaces and newlines at the
ends, quotes, backslashes, JSON, a wrapped tool response); a template that changes them (Llama 3.1 writes a
tool message through ``tojson``, quoting it) is rendered afresh for every append instead. Either way the
appended ids are what the trajectory records and the engine reads, so token-exactness does not rest on it.
"""

from __future__ import annotations

from typing import Any

from megarl.errors import EXIT_USAGE, MegarlError

Messages = list[dict[str, Any]]

_QUESTION = "Placeholder question for the chat format"
_ANSWER = "Placeholder answer of the chat format"
_SLOT = "\ue000slot {}\ue001"  # private-use characters: no template writes them
# Contents a template might change: they must come out of the render as they went in.
_PROBES = (
    "  spaces and a newline at the ends\n",
    '"quoted" \\ back{slash} {"json": [1, 2]}',
    "\n<tool_response>\n7\n</tool_response>\n",
    "ünïcode ✓ <b>tag</b>",
    "",
)
_MAX_SKELETONS = 256

# For messages only: the family a template belongs to, by a marker its text contains (first match wins).
_FAMILY_MARKERS = (("llama3", "<|start_header_id|>"), ("qwen3", "<think>"), ("chatml", "<|im_start|>"))


class ChatFormatError(MegarlError, ValueError):
    """A chat template that multi-turn rollouts cannot extend in token space, or messages it cannot
    append; the message says which and what to change."""

    exit_code = EXIT_USAGE


def template_family(chat_template: str) -> str:
    """A short name for the template's family ("llama3", "qwen3", "chatml"; "unknown" otherwise)."""
    return next((name for name, marker in _FAMILY_MARKERS if marker in chat_template), "unknown")


class ChatFormat:
    """Turn boundaries of one tokenizer's chat template, for appending messages to a generated turn.

    `tools` (OpenAI function schemas) and `chat_template_kwargs` (e.g. ``{"enable_thinking": False}``)
    are passed to every render, as verl's ``apply_chat_template_kwargs`` are.
    """

    def __init__(
        self, tokenizer: Any, tools: list[dict] | None = None, chat_template_kwargs: dict | None = None
    ) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not template or not isinstance(template, str):
            raise ChatFormatError(
                f"tokenizer {type(tokenizer).__name__} has no chat template (or several named ones); "
                "multi-turn rollouts append messages with it: use the model's instruct tokenizer "
                "(model.tokenizer_path) or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.family = template_family(template)

        # What the template writes after an assistant's content when nothing follows: "<|im_end|>\n",
        # "<|eot_id|>". Its first token, when it is an added token, ends the turn.
        self.turn_close = self._after_answer([], add_generation_prompt=False)
        close_ids = self._encode(self.turn_close)
        added = set(getattr(tokenizer, "added_tokens_decoder", {}))
        eos = tokenizer.eos_token_id
        first = close_ids[0] if close_ids else None
        self.end_of_turn_id: int | None = (
            first if first is not None and (first in added or first == eos) else None
        )
        self.stop_token_ids: list[int] = list(
            dict.fromkeys(i for i in (self.end_of_turn_id, eos) if i is not None)
        )

        question = [{"role": "user", "content": _QUESTION}]
        bare, opened = self._render(question, False), self._render(question, True)
        if not opened.startswith(bare):
            raise ChatFormatError(
                f"the {self.family} chat template renders the conversation differently when "
                "add_generation_prompt=True (not as a suffix); multi-turn rollouts need a template whose "
                "generation prompt only appends the assistant header"
            )
        self.generation_prompt = opened[len(bare) :]  # "<|im_start|>assistant\n": what ends every append
        # roles of the appended messages -> the literal text around their contents (None: render each time)
        self._skeletons: dict[tuple[str, ...], list[str] | None] = {}

    def prompt_ids(self, messages: Messages) -> list[int]:
        """The first turn's input: `messages` rendered with the tools and the generation prompt."""
        return self._encode(self._render(messages, True))

    def append_ids(self, messages: Messages, after_stop: int | None) -> list[int]:
        """The tokens to append after a generated assistant turn for the new `messages` (tool, user or
        system; several at once when they follow the same turn), ending with the generation prompt.

        `after_stop` is the turn's last generated token. When it is the template's end-of-turn token,
        the append starts after it (ChatML: with "\\n"); otherwise (another eos, or None for a turn cut
        by length) the end-of-turn token is appended too.
        """
        if not messages:
            raise ChatFormatError("append_ids needs at least one message to append after the assistant turn")
        for i, message in enumerate(messages):
            if message.get("role") == "assistant":
                raise ChatFormatError(
                    f"message {i} has role 'assistant'; assistant turns are generated, not appended: "
                    "record them with Trajectory.add_generated and append only tool/user/system messages"
                )
        ids = self._encode(self._appended_text(messages))
        if self.end_of_turn_id is not None and after_stop == self.end_of_turn_id:
            if not ids or ids[0] != self.end_of_turn_id:
                roles = [m.get("role") for m in messages]
                raise ChatFormatError(
                    f"the {self.family} chat template does not close an assistant turn with "
                    f"{self._token(self.end_of_turn_id)!r} when {roles} follow it; the generated turn "
                    "cannot be extended in token space with this template"
                )
            ids = ids[1:]
        return ids

    def describe(self, ids: list[int]) -> str:
        """`ids` as their tokens' text joined by '|', for messages and reports."""
        return "|".join(self._token(i) for i in ids)

    def _render(self, messages: Messages, add_generation_prompt: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=self.tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.chat_template_kwargs,
            )
        except Exception as e:  # jinja's TemplateError and whatever raise_exception() raised
            roles = [m.get("role") for m in messages]
            raise ChatFormatError(
                f"the {self.family} chat template fails on messages with roles {roles}: "
                f"{type(e).__name__}: {e}. Check the messages' roles and contents (and chat_template_kwargs)"
            ) from None
        if not isinstance(text, str):
            raise ChatFormatError(
                f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not text"
            )
        return text

    def _after_answer(self, messages: Messages, add_generation_prompt: bool) -> str:
        """What the template writes after the placeholder answer when `messages` follow it."""
        conversation = [{"role": "user", "content": _QUESTION}, {"role": "assistant", "content": _ANSWER}]
        text = self._render(conversation + list(messages), add_generation_prompt)
        at = text.find(_ANSWER)
        if at < 0:
            raise ChatFormatError(
                f"the {self.family} chat template does not render an assistant message's content as "
                "given (it rewrites or drops it), so the tokens after an assistant turn cannot be found"
            )
        return text[at + len(_ANSWER) :]

    def _appended_text(self, messages: Messages) -> str:
        """The text after the placeholder answer when `messages` and the generation prompt follow it."""
        if all(set(m) <= {"role", "content"} and isinstance(m.get("content"), str) for m in messages):
            roles = tuple(str(m.get("role")) for m in messages)
            if roles not in self._skeletons and len(self._skeletons) < _MAX_SKELETONS:
                self._skeletons[roles] = self._skeleton(roles)
            pieces = self._skeletons.get(roles)
            if pieces is not None:
                return _fill(pieces, [m["content"] for m in messages])
        return self._after_answer(messages, add_generation_prompt=True)

    def _skeleton(self, roles: tuple[str, ...]) -> list[str] | None:
        """The literal text before, between and after the contents of messages with these `roles`; None
        when the template does not write every content verbatim (see the module doc)."""
        slots = [_SLOT.format(i) for i in range(len(roles))]
        rest, pieces = self._after_answer(_messages(roles, slots), add_generation_prompt=True), []
        for slot in slots:
            before, found, rest = rest.partition(slot)
            if not found or slot in rest:
                return None
            pieces.append(before)
        pieces.append(rest)
        for shift in range(len(_PROBES)):
            contents = [_PROBES[(i + shift) % len(_PROBES)] for i in range(len(roles))]
            if self._after_answer(_messages(roles, contents), add_generation_prompt=True) != _fill(
                pieces, contents
            ):
                return None
        return pieces

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _token(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))


def _messages(roles: tuple[str, ...], contents: list[str]) -> Messages:
    return [{"role": role, "content": content} for role, content in zip(roles, contents, strict=True)]


def _fill(pieces: list[str], contents: list[str]) -> str:
    return pieces[0] + "".join(content + piece for content, piece in zip(contents, pieces[1:], strict=True))

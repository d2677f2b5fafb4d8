"""Prompt layouts: how a haystack of `n` units plus needles plus padding becomes chat messages.

A layout is a pure function of (n_units, pad_words, pad_suffix): the fitter (`fit.py`) searches
those two knobs until the server's tokenizer counts exactly the target length. Needles sit at
unit index round(depth * n), so the depth is a fraction of the haystack, and padding always goes
in the opening text (before every needle) so it never changes which side of a needle a unit is on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from verify.live.corpus import pad_text

Message = dict[str, Any]


@dataclass(frozen=True)
class Needle:
    """One planted fact. `depth` is a fraction in [0, 1] of the haystack units."""

    depth: float
    payload: Any  # str for text layouts, a layout-specific object otherwise
    target: bool = True  # the needle whose position the record reports


@dataclass(frozen=True)
class Rendered:
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    # Where the target needle starts, as a fraction of all message text (approximate token depth).
    needle_frac: float | None
    # Characters of pad text inserted (lead-in included): a calibrated counter prices them apart,
    # since catalogue words tokenize unlike the haystack of an INI file or a tool transcript.
    pad_chars: int = 0


class Layout(Protocol):
    # A first guess of tokens per unit, only to start the fitter's search near the answer.
    unit_tokens_guess: float

    def render(self, n_units: int, pad_words: int, pad_suffix: str = "") -> Rendered: ...


def place_needles(n_units: int, needles: Sequence[Needle]) -> list[tuple[int, Needle]]:
    """Insertion slot (0..n) of each needle, in haystack order; ties keep the given order."""
    slots = [(min(n_units, max(0, round(nd.depth * n_units))), i, nd) for i, nd in enumerate(needles)]
    slots.sort(key=lambda t: (t[0], t[1]))
    return [(slot, nd) for slot, _, nd in slots]


def _pad(pad_words: int, pad_suffix: str) -> str:
    return pad_text(pad_words) + pad_suffix


def _needle_frac(messages: list[Message], marker_msg: int, marker_offset: int) -> float:
    """Character offset of a point inside message `marker_msg`, as a fraction of all text."""
    lengths = [len(_message_text(m)) for m in messages]
    total = sum(lengths) or 1
    return (sum(lengths[:marker_msg]) + marker_offset) / total


def _message_text(message: Message) -> str:
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        text += call["function"]["name"] + call["function"]["arguments"]
    return text


@dataclass
class TextLayout:
    """System message + one user message: head, haystack units (needles inside), question.

    Used for prose haystacks (units are sentences), the repetitive noise haystack and the config
    file (units are sections).
    """

    system: str
    head: str  # text before the haystack; the pad goes at its end
    question: str
    unit: Callable[[int], str]
    needles: Sequence[Needle]
    unit_tokens_guess: float = 20.0
    pad_lead: str = " Catalogue words:"  # precedes the pad words so the padding reads as a label
    pad_end: str = ""
    haystack_open: str = "\n\n"
    haystack_close: str = "\n\n"
    separator: str = " "
    paragraph_every: int = 6  # a blank line after every k items, for readable prose

    def render(self, n_units: int, pad_words: int, pad_suffix: str = "") -> Rendered:
        head = self.head
        if pad_words or pad_suffix:
            head += f"{self.pad_lead} {_pad(pad_words, pad_suffix)}{self.pad_end}"
        pad_chars = len(head) - len(self.head)
        items: list[str] = []
        target_item: int | None = None
        placed = place_needles(n_units, self.needles)
        k = 0
        for i in range(n_units + 1):
            while k < len(placed) and placed[k][0] == i:
                if placed[k][1].target and target_item is None:
                    target_item = len(items)
                items.append(str(placed[k][1].payload))
                k += 1
            if i < n_units:
                items.append(self.unit(i))
        pieces: list[str] = []
        target_offset = 0
        for j, item in enumerate(items):
            if j:
                sep = "\n\n" if self.paragraph_every and j % self.paragraph_every == 0 else self.separator
                pieces.append(sep)
            if j == target_item:
                target_offset = sum(len(p) for p in pieces)
            pieces.append(item)
        body = "".join(pieces)
        user = head + self.haystack_open + body + self.haystack_close + self.question
        messages: list[Message] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": user},
        ]
        frac = None
        if target_item is not None:
            frac = _needle_frac(messages, 1, len(head) + len(self.haystack_open) + target_offset)
        return Rendered(messages=messages, tools=None, needle_frac=frac, pad_chars=pad_chars)


@dataclass
class ConversationLayout:
    """A multi-turn chat: an opening user turn, then (user, assistant) pairs, then a question.

    Needles are whole (user, assistant) pairs; the pad goes in the opening user turn.
    """

    system: str
    opening: str
    opening_reply: str
    question: str
    turn: Callable[[int], tuple[str, str]]
    needles: Sequence[Needle]  # payload: tuple[str, str]
    unit_tokens_guess: float = 120.0

    def render(self, n_units: int, pad_words: int, pad_suffix: str = "") -> Rendered:
        opening = self.opening
        if pad_words or pad_suffix:
            opening += f" Tags for my notes: {_pad(pad_words, pad_suffix)}."
        pad_chars = len(opening) - len(self.opening)
        messages: list[Message] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": opening},
            {"role": "assistant", "content": self.opening_reply},
        ]
        target_msg: int | None = None
        placed = place_needles(n_units, self.needles)
        k = 0
        for i in range(n_units + 1):
            while k < len(placed) and placed[k][0] == i:
                user, reply = placed[k][1].payload
                if placed[k][1].target and target_msg is None:
                    target_msg = len(messages)
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
                k += 1
            if i < n_units:
                user, reply = self.turn(i)
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": self.question})
        frac = _needle_frac(messages, target_msg, 0) if target_msg is not None else None
        return Rendered(messages=messages, tools=None, needle_frac=frac, pad_chars=pad_chars)


@dataclass
class ToolLayout:
    """An agent transcript: task, then rounds of (assistant tool call, tool result), then a request.

    `page(k, records)` renders the tool result of round k; needle payloads are extra record lists
    that become their own round. Tool call ids and page numbers follow render order.
    """

    system: str
    task: str
    tools: list[dict[str, Any]]
    tool_name: str
    records: Callable[[int], list[dict[str, Any]]]  # filler records of unit i
    needles: Sequence[Needle]  # payload: list of records (one of them the needle)
    closing: str  # assistant text after the last round
    request: str  # the final user turn
    unit_tokens_guess: float = 250.0

    def _round(self, k: int, records: list[dict[str, Any]]) -> list[Message]:
        call_id = f"call_{k:04d}"
        result = {"page": k, "shipments": records}
        return [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": self.tool_name, "arguments": json.dumps({"page": k})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
        ]

    def render(self, n_units: int, pad_words: int, pad_suffix: str = "") -> Rendered:
        task = self.task
        if pad_words or pad_suffix:
            task += f" Reference words: {_pad(pad_words, pad_suffix)}."
        pad_chars = len(task) - len(self.task)
        messages: list[Message] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": task},
        ]
        target_msg: int | None = None
        placed = place_needles(n_units, self.needles)
        k = 0
        page = 1
        for i in range(n_units + 1):
            while k < len(placed) and placed[k][0] == i:
                if placed[k][1].target and target_msg is None:
                    target_msg = len(messages) + 1
                messages += self._round(page, list(placed[k][1].payload))
                page += 1
                k += 1
            if i < n_units:
                messages += self._round(page, self.records(i))
                page += 1
        messages.append({"role": "assistant", "content": self.closing})
        messages.append({"role": "user", "content": self.request})
        frac = _needle_frac(messages, target_msg, 0) if target_msg is not None else None
        return Rendered(messages=messages, tools=self.tools, needle_frac=frac, pad_chars=pad_chars)

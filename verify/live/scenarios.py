"""The scenarios: what each prompt says, where the needles go and what counts as a right answer.

Each builder turns a `Cell` (scenario, length, depth, ...) and the run seed into a `PromptSpec`:
a layout (sized later by the fitter), the exact strings the answer must contain, and any
distractor values (reported when the model returns one of those instead). All randomness comes
from `stable_seed(run seed, cell identity)`, so a cell is the same prompt in every run.

Scenario names are the public vocabulary of the CSV, JSONL and report:
  sweep             one code needle ("ZEBRA-4492-OMEGA" style) in prose, the length x depth heatmap
  ruler_single      RULER-style single needle: 7-digit number / UUID in prose, or number in noise
  ruler_multikey    four keyed needles, three of them distractors with confusable keys
  ruler_multivalue  four values under one key; all four must be returned
  multiturn_secret  a secret told in one user turn of a long chat, asked for at the end
  multiturn_tools   an agent transcript of tool calls; the final tool call needs a value read earlier
  config_recall     a long INI-style config file; one key of one section is asked for
  shared_prefix     one haystack with five keyed needles asked one by one (radix-cache reuse)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verify.live.corpus import (
    ADJECTIVES,
    NOUNS,
    SentenceStream,
    ValueFactory,
    paragraph,
    sentence,
    stable_seed,
)
from verify.live.layouts import ConversationLayout, Layout, Needle, TextLayout, ToolLayout

SCENARIOS = (
    "sweep",
    "ruler_single",
    "ruler_multikey",
    "ruler_multivalue",
    "multiturn_secret",
    "multiturn_tools",
    "config_recall",
    "shared_prefix",
)

# Answers are short; multi-value lists and tool calls need room. Thinking needs far more.
MAX_TOKENS = {
    "sweep": 64,
    "ruler_single": 64,
    "ruler_multikey": 64,
    "ruler_multivalue": 128,
    "multiturn_secret": 64,
    "multiturn_tools": 256,
    "config_recall": 96,
    "shared_prefix": 64,
}
THINKING_MAX_TOKENS = 4096

SHARED_PREFIX_DEPTHS = (10.0, 30.0, 50.0, 70.0, 90.0)


@dataclass(frozen=True)
class Cell:
    """One prompt of the plan. `depth_pct` is where the target needle sits (0-100)."""

    scenario: str
    variant: str
    base_length: int
    target_tokens: int
    depth_pct: float
    extra: str = ""  # e.g. which key of the shared-prefix haystack is asked

    @property
    def cell_id(self) -> str:
        tail = f"|{self.extra}" if self.extra else ""
        return f"{self.variant}|L{self.target_tokens}|d{self.depth_pct:g}{tail}"

    @property
    def fit_group(self) -> str:
        """Cells of one group share one haystack; only shared_prefix has groups of several cells."""
        if self.scenario == "shared_prefix":
            return f"{self.scenario}|{self.variant}|L{self.target_tokens}"
        return f"{self.scenario}|{self.cell_id}"


@dataclass
class PromptSpec:
    layout: Layout
    expected: list[str]
    distractors: list[str] = field(default_factory=list)
    tool_choice: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def system_prompt(nonce: str) -> str:
    # The session line comes first so prompts with different nonces share no cached prefix.
    return (
        f"Session {nonce}. You are a careful assistant. Answer from the material you are given and "
        "reply exactly as briefly as you are asked."
    )


def _prose(seed: int) -> Callable[[int], str]:
    return SentenceStream(seed).get


def _noise(seed: int) -> Callable[[int], str]:
    return SentenceStream(seed, noise=True).get


HEAD = "Below is a long document. Read it carefully; a question about it follows."


def build_sweep(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    vf = ValueFactory(random.Random(s))
    key, value = vf.key(), vf.code()
    layout = TextLayout(
        system=system_prompt(nonce),
        head=HEAD,
        question=f'Question: what is the secret code for the "{key}" vault? Reply with the code only.',
        unit=_prose(s + 1),
        needles=(Needle(cell.depth_pct / 100, f'The secret code for the "{key}" vault is {value}.'),),
    )
    return PromptSpec(layout=layout, expected=[value], meta={"key": key})


def build_ruler_single(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    vf = ValueFactory(random.Random(s))
    key = vf.key()
    if cell.variant == "uuid":
        value, what = vf.uuid(), "access key"
    else:
        value, what = vf.number(), "access number"
    unit = _noise(s + 1) if cell.variant == "noise" else _prose(s + 1)
    layout = TextLayout(
        system=system_prompt(nonce),
        head=HEAD,
        question=f'Question: what is the {what} for "{key}"? Reply with the {what} only.',
        unit=unit,
        needles=(Needle(cell.depth_pct / 100, f'Registry entry: the {what} for "{key}" is {value}.'),),
    )
    return PromptSpec(layout=layout, expected=[value], meta={"key": key})


def build_ruler_multikey(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    vf = ValueFactory(random.Random(s))
    key = vf.key()
    others = [vf.similar_key(key) for _ in range(3)]
    value = vf.number()
    other_values = [vf.number() for _ in others]
    d = cell.depth_pct / 100
    needles = [Needle(d, f'Registry entry: the access number for "{key}" is {value}.')]
    for j, (k, v) in enumerate(zip(others, other_values), start=1):
        # Distractors spread evenly around the haystack, away from the target.
        needles.append(
            Needle((d + j / 4) % 1.0, f'Registry entry: the access number for "{k}" is {v}.', False)
        )
    layout = TextLayout(
        system=system_prompt(nonce),
        head=HEAD,
        question=f'Question: what is the access number for "{key}"? Reply with the access number only.',
        unit=_prose(s + 1),
        needles=needles,
    )
    return PromptSpec(
        layout=layout,
        expected=[value],
        distractors=other_values,
        meta={"key": key, "distractor_keys": others},
    )


def build_ruler_multivalue(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    vf = ValueFactory(random.Random(s))
    key = vf.key()
    values = [vf.number() for _ in range(4)]
    d = cell.depth_pct / 100
    # First value at the cell's depth, the rest evenly over what remains (gkamradt's multi-needle rule).
    needles = [
        Needle(d + j * (1 - d) / 4, f'Registry entry: one of the access numbers for "{key}" is {v}.', j == 0)
        for j, v in enumerate(values)
    ]
    layout = TextLayout(
        system=system_prompt(nonce),
        head=HEAD,
        question=(
            f'Question: the document lists four access numbers for "{key}". Reply with all of them, '
            "separated by commas, and nothing else."
        ),
        unit=_prose(s + 1),
        needles=needles,
    )
    return PromptSpec(layout=layout, expected=values, meta={"key": key})


_ACKS = ("Thanks, noted.", "Got it.", "Noted, thank you.", "Understood.", "Thank you, I have that.")


def build_multiturn_secret(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    vf = ValueFactory(random.Random(s))
    key, value = vf.key(), vf.code()
    turns: dict[int, tuple[str, str]] = {}

    def turn(i: int) -> tuple[str, str]:
        if i not in turns:
            rng = random.Random(stable_seed(s, "turn", i))
            turns[i] = (f"More notes from my week: {paragraph(rng, 5)}", rng.choice(_ACKS))
        return turns[i]

    secret = (
        f'Please remember this for later: the secret passphrase for "{key}" is {value}. Keep it private.',
        "Understood, I will remember it.",
    )
    layout = ConversationLayout(
        system=system_prompt(nonce),
        opening="I will share notes from my week over the next messages; just acknowledge each one.",
        opening_reply="Sure, go ahead.",
        question=f'What is the secret passphrase for "{key}" that I gave you earlier? Reply with the passphrase only.',
        turn=turn,
        needles=(Needle(cell.depth_pct / 100, secret),),
    )
    return PromptSpec(layout=layout, expected=[value], meta={"key": key})


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_shipments",
            "description": "Return one page of the shipment register.",
            "parameters": {
                "type": "object",
                "properties": {"page": {"type": "integer", "description": "Page number, from 1."}},
                "required": ["page"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_notice",
            "description": "Send a customer the tracking code of their shipment.",
            "parameters": {
                "type": "object",
                "properties": {
                    "shipment_id": {"type": "string"},
                    "tracking_code": {"type": "string"},
                },
                "required": ["shipment_id", "tracking_code"],
            },
        },
    },
]
_STATUSES = ("in transit", "delivered", "held at depot", "awaiting pickup", "returned", "out for delivery")


def build_multiturn_tools(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    rng = random.Random(s)
    vf = ValueFactory(rng)

    def record() -> dict[str, Any]:
        # Field order matters to a reader: the id comes right before its code.
        return {
            "shipment_id": vf.shipment_id(),
            "tracking_code": vf.code(),
            "status": rng.choice(_STATUSES),
            "note": sentence(rng),
        }

    target = record()
    needle_page = [record(), target, record()]
    pages: dict[int, list[dict[str, Any]]] = {}

    def records(i: int) -> list[dict[str, Any]]:
        # Generated in order so page i is the same whatever n the fitter tries.
        while len(pages) <= i:
            pages[len(pages)] = [record() for _ in range(4)]
        return pages[i]

    layout = ToolLayout(
        system=system_prompt(nonce) + " You can call tools.",
        task="Read the whole shipment register page by page; I will then ask you to notify one customer.",
        tools=TOOLS,
        tool_name="list_shipments",
        records=records,
        needles=(Needle(cell.depth_pct / 100, needle_page),),
        closing="I have read every page of the shipment register.",
        request=(
            f'Now call send_notice for shipment "{target["shipment_id"]}" with its tracking code from '
            "the register."
        ),
    )
    return PromptSpec(
        layout=layout,
        expected=[target["tracking_code"]],
        distractors=[r["tracking_code"] for r in needle_page if r is not target],
        tool_choice="auto",
        meta={"key": target["shipment_id"]},
    )


_SERVICE_A = (
    "billing",
    "search",
    "auth",
    "ledger",
    "media",
    "notify",
    "orders",
    "reports",
    "catalog",
    "profile",
    "audit",
    "export",
    "pricing",
    "cache",
    "queue",
    "scheduler",
    "inventory",
    "payments",
    "mailer",
    "tiles",
)
_SERVICE_B = ("api", "worker", "gateway", "store", "proxy", "sync", "index", "relay", "cron", "edge")
_REGIONS = ("eu-west-2", "us-east-1", "ap-south-1", "eu-central-1", "us-west-2", "sa-east-1")
_LEVELS = ("debug", "info", "warn", "error")


def build_config_recall(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    s = stable_seed(seed, cell.scenario, cell.cell_id)
    rng = random.Random(s)
    vf = ValueFactory(rng)
    used: set[str] = set()

    def name() -> str:
        for _ in range(10000):
            n = f"{rng.choice(_SERVICE_A)}-{rng.choice(_SERVICE_B)}-{rng.randint(1, 99):02d}"
            if n not in used:
                used.add(n)
                return n
        raise RuntimeError("service names exhausted")

    def section(n: str, token: str) -> str:
        return "\n".join(
            (
                f"[{n}]",
                f'host = "{n}.internal"',
                f"port = {rng.randint(2000, 65000)}",
                f"replicas = {rng.randint(1, 12)}",
                f"timeout_ms = {rng.randint(100, 9000)}",
                f'region = "{rng.choice(_REGIONS)}"',
                f'log_level = "{rng.choice(_LEVELS)}"',
                f'owner = "team-{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"',
                f'api_token = "{token}"',
            )
        )

    target_name, target_token = name(), vf.uuid()
    target_text = section(target_name, target_token)
    sections: dict[int, str] = {}

    def unit(i: int) -> str:
        while len(sections) <= i:
            sections[len(sections)] = section(name(), vf.uuid())
        return sections[i]

    layout = TextLayout(
        system=system_prompt(nonce),
        head="Here is our deployment configuration file.",
        question=(
            f'Question: what is the value of "{target_name}.api_token" in the configuration file above '
            f"(section [{target_name}], key api_token)? Reply with the value only."
        ),
        unit=unit,
        needles=(Needle(cell.depth_pct / 100, target_text),),
        unit_tokens_guess=90.0,
        haystack_open="\n\n```ini\n",
        haystack_close="\n```\n\n",
        separator="\n\n",
        paragraph_every=0,
    )
    return PromptSpec(layout=layout, expected=[target_token], meta={"key": f"{target_name}.api_token"})


def build_shared_prefix(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    # Seeded by the length only: every cell of the group gets the byte-identical haystack, and
    # only the question after it differs, so later requests reuse the first one's cached prefix.
    s = stable_seed(seed, cell.scenario, cell.variant, cell.target_tokens)
    vf = ValueFactory(random.Random(s))
    keys = [vf.key() for _ in SHARED_PREFIX_DEPTHS]
    values = [vf.number() for _ in SHARED_PREFIX_DEPTHS]
    ask = int(cell.extra[1:]) if cell.extra.startswith("k") else 0
    needles = [
        Needle(d / 100, f'Registry entry: the access number for "{k}" is {v}.', j == ask)
        for j, (d, k, v) in enumerate(zip(SHARED_PREFIX_DEPTHS, keys, values))
    ]
    layout = TextLayout(
        system=system_prompt(nonce),
        head=HEAD,
        question=f'Question: what is the access number for "{keys[ask]}"? Reply with the access number only.',
        unit=_prose(s + 1),
        needles=needles,
    )
    return PromptSpec(
        layout=layout,
        expected=[values[ask]],
        distractors=[v for j, v in enumerate(values) if j != ask],
        meta={"key": keys[ask], "asked": ask},
    )


BUILDERS: dict[str, Callable[[Cell, int, str], PromptSpec]] = {
    "sweep": build_sweep,
    "ruler_single": build_ruler_single,
    "ruler_multikey": build_ruler_multikey,
    "ruler_multivalue": build_ruler_multivalue,
    "multiturn_secret": build_multiturn_secret,
    "multiturn_tools": build_multiturn_tools,
    "config_recall": build_config_recall,
    "shared_prefix": build_shared_prefix,
}


def build(cell: Cell, seed: int, nonce: str) -> PromptSpec:
    return BUILDERS[cell.scenario](cell, seed, nonce)


def max_tokens_for(scenario: str, thinking: bool, override: int | None) -> int:
    if override is not None:
        return override
    return THINKING_MAX_TOKENS if thinking else MAX_TOKENS[scenario]

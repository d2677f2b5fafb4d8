"""A small OpenAI-compatible server whose "model" has a known recall window, for testing the harness.

The model reads the question's key (the last double-quoted string of the last user message),
finds `key ... value` facts in the rendered prompt and answers with the values it can *see*: a
fact is visible only if it lies in the first `recall_first` or the last `recall_last` tokens.
So a test knows exactly where recall must break and can check that the harness reports it there.

Also: a crude deterministic tokenizer (`chars_per_token` characters per token, or "mixed": letters
in chunks of 4, every digit and punctuation mark one token, so an INI file of UUIDs costs about
twice the tokens per character of prose, as with a real BPE), SGLang-style `/v1/tokenize`,
`/server_info` and `/get_server_info` (resolved server args flat at the top level, the index-K
format under the field a series or upstream server reports it in, `startup_time` per launch,
per-DP `internal_states`), context-length errors, silent truncation (of the tail, a few tokens at
the front, or a few in the middle), delays, and a server that stops after N completions.

Ordinary deployment faults, each switched on by one field and counted by request so a test knows
exactly which requests hit it (no timing involved): rate limits on tokenize and chat (429 with
Retry-After, or any status), the same on the start-up probes, usage dropped from the stream or
from every answer, stalls (held until the client gives up or the server stops; also only the
non-streamed usage follow-ups), a connection dropped mid-stream, and reasoning content returned
although thinking is off (spending the answer's max_tokens, as a template that ignores
thinking=false does).

Every completion is logged with what the fake received and read (`prompt_tokens`, `sent_tokens`),
so a test can check the harness's record of a request against the server's own.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

VALUE_RE = re.compile(
    r"\b\d{7}\b|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[A-Z]{2,}-\d{4}-[A-Z]{2,}\b"
)
QUOTED_RE = re.compile(r'"([^"\n]{1,80})"')
MIXED_TOKEN_RE = re.compile(r"[A-Za-z]{1,4}|\d|[^\sA-Za-z\d]")


@dataclass
class FakeConfig:
    model: str = "fake-dsv4"
    max_model_len: int = 40000
    advertised_max_model_len: int | None = None  # what /v1/models and server info claim
    recall_last: int | None = None  # None: sees everything
    recall_first: int = 0
    index_k_format: str | None = "bf16"  # None: no format field and no flag (a server that says nothing)
    # Where the format is reported: "dtype" (the series' resolved server arg
    # deepseek_v4_indexer_k_dtype), "legacy" (an older series: dsv4_index_k_format and
    # enable_deepseek_v4_bf16_index_k), "upstream" (only enable_deepseek_v4_fp4_indexer).
    format_field: str = "dtype"
    model_path: str | None = None  # default /models/<model>
    server_args: dict[str, Any] = field(default_factory=dict)  # more resolved args, at the top level
    expose_startup_time: bool = True  # SGLang's per-launch startup_time record
    nest_max_total_num_tokens: bool = False  # under internal_states (per DP), as some versions put it
    tokenize: bool = True
    truncate_to: int | None = None  # keep only the first N tokens, like --allow-auto-truncate
    truncate_front: int = 0  # drop this many tokens from the start of prompts over truncate_over
    truncate_middle: int = 0  # drop this many tokens from the middle of prompts over truncate_over
    truncate_over: int = 1000
    delay_s: float = 0.0
    delay_from: int = 0  # completions served before the delay starts (the harness probes once first)
    die_after: int | None = None  # shut down after serving this many completions
    usage_in_stream: bool = True
    chars_per_token: int = 4
    tokenizer: str = "chars"  # "chars": chars_per_token per token; "mixed": see the module docstring
    corrupt_every: int | None = None  # every k-th completion gets its last character changed
    # Faults, by request count. Chat requests are numbered from 1 in arrival order; the first
    # `faults_after` of them (the harness's start-up probes) never fault.
    faults_after: int = 1
    probe_errors: int = 0  # the first N 1-token requests (start-up probes) answer chat_error_status
    chat_error_every: int | None = None  # every k-th chat request (after faults_after) answers...
    chat_error_status: int = 429  # ...with this status
    tokenize_error_every: int | None = None  # every k-th tokenize request answers...
    tokenize_error_status: int = 429  # ...with this status
    retry_after: str | None = "0.05"  # Retry-After header of those answers (None: no header)
    stall_every: int | None = None  # every k-th chat request is held until the client gives up
    stall_non_stream: bool = False  # every non-streamed request but the probes is held (usage follow-ups)
    reset_every: int | None = None  # every k-th streamed chat request drops the connection mid-stream
    usage_in_response: bool = True  # False: no usage in non-streamed answers either
    reasoning_when_off: int = 0  # tokens of reasoning_content sent with thinking off


@dataclass
class FakeState:
    cfg: FakeConfig
    log: list[dict[str, Any]] = field(default_factory=list)
    served: int = 0
    chat_calls: int = 0
    tokenize_calls: int = 0
    faults: list[dict[str, Any]] = field(default_factory=list)  # every injected fault, in order
    arrivals: list[tuple[str, float]] = field(default_factory=list)  # (endpoint, monotonic time)
    stopping: bool = False
    inflight: int = 0
    max_inflight: int = 0
    probes: int = 0  # 1-token requests seen
    server: uvicorn.Server | None = None
    # This launch's start-up record (SGLang reports durations measured at each start).
    startup_time: dict[str, float] = field(
        default_factory=lambda: {"load_weight": round(time.time() % 1000, 6), "scheduler_e2e": 1.0}
    )

    @property
    def dead(self) -> bool:
        """`die_after` completions were served: the server answers nothing more."""
        return self.cfg.die_after is not None and self.served >= self.cfg.die_after


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, thinking: bool) -> str:
    parts = ["<bos>"]
    if tools:
        parts.append("<tools>" + json.dumps(tools) + "</tools>")
    for m in messages:
        role = m.get("role", "user")
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<{role}>{content}")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            parts.append(f"<call>{fn.get('name', '')}{fn.get('arguments', '')}</call>")
        parts.append(f"</{role}>")
    parts.append("<assistant>")
    if thinking:
        parts.append("<think>")
    return "".join(parts)


class Tokens:
    """The fake's tokenization of one text: its count and the token index of any character."""

    def __init__(self, text: str, cfg: FakeConfig) -> None:
        self.cfg = cfg
        self.ends = [m.end() for m in MIXED_TOKEN_RE.finditer(text)] if cfg.tokenizer == "mixed" else []
        self.count = len(self.ends) if cfg.tokenizer == "mixed" else n_tokens(text, cfg.chars_per_token)

    def index(self, char: int) -> int:
        if self.cfg.tokenizer != "mixed":
            return char // self.cfg.chars_per_token
        return bisect.bisect_right(self.ends, char)

    def chars_of_first(self, n: int) -> int:
        if self.cfg.tokenizer != "mixed":
            return n * self.cfg.chars_per_token
        return self.ends[n - 1] if 0 < n <= len(self.ends) else 0


def n_tokens(text: str, cpt: int) -> int:
    return math.ceil(len(text) / cpt)


def count_tokens(text: str, cfg: FakeConfig) -> int:
    return Tokens(text, cfg).count


def _visible(span: tuple[int, int], total_tokens: int, cfg: FakeConfig, toks: Tokens | None = None) -> bool:
    if toks is None:
        first_tok, last_tok = span[0] // cfg.chars_per_token, (span[1] - 1) // cfg.chars_per_token
    else:
        first_tok, last_tok = toks.index(span[0]), toks.index(span[1] - 1)
    if last_tok < cfg.recall_first:
        return True
    if cfg.recall_last is None:
        return True
    return first_tok >= total_tokens - cfg.recall_last


def answer(text: str, question: str, total_tokens: int, cfg: FakeConfig) -> str:
    toks = Tokens(text, cfg) if cfg.tokenizer == "mixed" else None
    keys = QUOTED_RE.findall(question)
    if not keys:
        return "OK"
    key = keys[-1]
    values: list[str] = []
    if key.endswith(".api_token"):  # config recall: [section] ... api_token = "value"
        section = key[: -len(".api_token")]
        start = 0
        while (i := text.find(f"[{section}]", start)) >= 0:
            start = i + 1
            end = text.find("\n[", i + 1)
            block = text[i : end if end >= 0 else len(text)]
            m = re.search(r'api_token = "([^"]+)"', block)
            if m and _visible((i, i + m.end()), total_tokens, cfg, toks):
                values.append(m.group(1))
                break
    else:
        start = 0
        while (i := text.find(key, start)) >= 0:
            start = i + 1
            after = text[i + len(key) : i + len(key) + 160]
            cut = min((p for p in (after.find("\n"), after.find(". ")) if p >= 0), default=len(after))
            m = VALUE_RE.search(after[:cut])
            visible = m is not None and _visible((i, i + len(key) + m.end()), total_tokens, cfg, toks)
            if m is not None and visible and m.group(0) not in values:
                values.append(m.group(0))
    return ", ".join(values) if values else "I cannot find it."


def make_app(state: FakeState) -> FastAPI:
    app = FastAPI()
    cfg = state.cfg

    def advertised() -> int:
        return cfg.advertised_max_model_len or cfg.max_model_len

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": cfg.model, "object": "model", "max_model_len": advertised()}],
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        internal: dict[str, Any] = {"last_gen_throughput": round(time.time() % 7, 3)}  # changes per call
        info: dict[str, Any] = {
            "version": "0.0.0-fake",
            "model_path": cfg.model_path or f"/models/{cfg.model}",
            "served_model_name": cfg.model,
            "context_length": advertised(),
            "page_size": 64,
            "tp_size": 1,
            "dp_size": 1,
            "disable_radix_cache": False,
            "random_seed": round(state.startup_time["load_weight"] * 1000),  # SGLang picks one per launch
            "launch_command": "fake_server",
            **cfg.server_args,
            "internal_states": [internal],
        }
        (internal if cfg.nest_max_total_num_tokens else info)["max_total_num_tokens"] = 200000
        if cfg.expose_startup_time:
            info["startup_time"] = state.startup_time
        fmt = cfg.index_k_format
        if fmt is not None and cfg.format_field == "dtype":
            info |= {"deepseek_v4_indexer_k_dtype": fmt, "enable_deepseek_v4_fp4_indexer": fmt == "fp4"}
        elif fmt is not None and cfg.format_field == "legacy":
            info |= {
                "dsv4_index_k_format": fmt,
                "enable_deepseek_v4_bf16_index_k": fmt == "bf16",
                "enable_deepseek_v4_fp4_indexer": fmt == "fp4",
            }
        elif fmt is not None and cfg.format_field == "upstream":
            info["enable_deepseek_v4_fp4_indexer"] = fmt == "fp4"
        return info

    def fault_response(status: int, where: str) -> JSONResponse:
        state.faults.append({"endpoint": where, "status": status, "time": time.monotonic()})
        message = {
            404: f"The model '{cfg.model}-gone' does not exist",
            400: "Invalid request: unsupported parameter 'seed'",
        }.get(status, f"fake fault {status}")
        headers = (
            {"Retry-After": cfg.retry_after} if cfg.retry_after is not None and status in (429, 503) else {}
        )
        return JSONResponse(
            {"object": "error", "message": message, "code": status}, status_code=status, headers=headers
        )

    async def tokenize(request: Request) -> JSONResponse:
        if not cfg.tokenize:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        state.tokenize_calls += 1
        state.arrivals.append(("tokenize", time.monotonic()))
        if cfg.tokenize_error_every and state.tokenize_calls % cfg.tokenize_error_every == 0:
            return fault_response(cfg.tokenize_error_status, "tokenize")
        body = await request.json()
        thinking = bool((body.get("chat_template_kwargs") or {}).get("thinking"))
        if body.get("messages") is not None:
            text = render(body["messages"], body.get("tools"), thinking)
        else:
            text = str(body.get("prompt", ""))
        n = count_tokens(text, cfg)
        return JSONResponse({"tokens": [], "count": n, "max_model_len": advertised()})

    app.add_api_route("/v1/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        if state.dead:
            # uvicorn only notices `should_exit` on its next tick (~0.1 s), and a fast client could
            # finish the whole run on its keep-alive connection before that. A dead server answers
            # nothing: hold the request until the shutdown cancels it and drops the connection.
            await asyncio.Event().wait()
        state.chat_calls += 1
        state.arrivals.append(("chat", time.monotonic()))
        body = await request.json()
        probe = int(body.get("max_tokens") or 64) == 1
        if probe:
            state.probes += 1
            if state.probes <= cfg.probe_errors:
                return fault_response(cfg.chat_error_status, "probe")
        k = state.chat_calls - cfg.faults_after
        if k > 0 and cfg.chat_error_every and k % cfg.chat_error_every == 0:
            return fault_response(cfg.chat_error_status, "chat")
        stall = cfg.stall_non_stream and not probe and not body.get("stream")
        if stall or (k > 0 and cfg.stall_every and k % cfg.stall_every == 0):
            # Held until the client gives up (its timeout) or the fake stops: no timing race.
            state.faults.append({"endpoint": "chat", "status": "stall", "time": time.monotonic()})
            while not state.stopping:
                await asyncio.sleep(0.02)
            return JSONResponse({"message": "stopped"}, status_code=503)
        reset = bool(k > 0 and cfg.reset_every and k % cfg.reset_every == 0)
        if body.get("model") != cfg.model:
            return JSONResponse(
                {
                    "object": "error",
                    "message": f"The model '{body.get('model')}' does not exist",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                },
                status_code=404,
            )
        thinking = bool((body.get("chat_template_kwargs") or {}).get("thinking"))
        messages = body["messages"]
        text = render(messages, body.get("tools"), thinking)
        toks = Tokens(text, cfg)
        n = sent = toks.count
        max_tokens = int(body.get("max_tokens") or 64)
        cut = cfg.truncate_front + cfg.truncate_middle
        if cfg.truncate_to is not None and n > cfg.truncate_to:
            text, n = text[: toks.chars_of_first(cfg.truncate_to)], cfg.truncate_to
        elif cut and n > cfg.truncate_over:
            # A proxy or template step losing a few tokens: the model reads what is left.
            start = 0 if cfg.truncate_front else n // 2 - cut // 2
            text = text[: toks.chars_of_first(start)] + text[toks.chars_of_first(start + cut) :]
            n = count_tokens(text, cfg)
        elif n >= cfg.max_model_len or n + max_tokens > cfg.max_model_len:
            return JSONResponse(
                {
                    "object": "error",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                    "message": f"The input ({n} tokens) is longer than the model's context length "
                    f"({cfg.max_model_len} tokens).",
                },
                status_code=400,
            )
        question = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        reply = answer(text, str(question), n, cfg)
        finish = "stop"
        reasoning = ""
        if cfg.reasoning_when_off and not thinking:
            # A template that ignores thinking=false: the reasoning spends the answer's budget.
            reasoning = ("Let me look for the key in the document. " * cfg.reasoning_when_off)[
                : cfg.reasoning_when_off * cfg.chars_per_token
            ]
        budget = max(0, max_tokens - n_tokens(reasoning, cfg.chars_per_token))
        if n_tokens(reply, cfg.chars_per_token) > budget:
            reply, finish = reply[: budget * cfg.chars_per_token], "length"
        completion = max(1, n_tokens(reasoning + reply, cfg.chars_per_token))
        usage = {"prompt_tokens": n, "completion_tokens": completion, "total_tokens": n + completion}
        state.log.append(
            {
                "model": body.get("model"),
                "prompt_tokens": n,  # what the fake read (after any truncation)
                "sent_tokens": sent,  # what it was sent
                "stream": bool(body.get("stream")),
                "temperature": body.get("temperature"),
                "top_p": body.get("top_p"),
                "seed": body.get("seed"),
                "max_tokens": max_tokens,
                "chat_template_kwargs": body.get("chat_template_kwargs"),
                "stream_options": body.get("stream_options"),
                "answer": reply,
                "reasoning": reasoning,
                "tools": bool(body.get("tools")),
                "first_message": messages[0].get("content", "")[:60],
                "time": time.monotonic(),
            }
        )
        state.inflight += 1
        state.max_inflight = max(state.max_inflight, state.inflight)
        try:
            if cfg.delay_s and state.served >= cfg.delay_from:
                await asyncio.sleep(cfg.delay_s)
        finally:
            state.inflight -= 1
        state.served += 1
        if cfg.corrupt_every and state.served % cfg.corrupt_every == 0 and reply[-1:].isalnum():
            # A deterministic wrong last character: the "right code, last digit wrong" failure.
            reply = reply[:-1] + ("0" if reply[-1] != "0" else "1")
            state.log[-1]["answer"] = reply
        if state.dead and state.server is not None:
            state.server.should_exit = True
        cid, created = f"chatcmpl-{state.served}", int(time.time())
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply}
            if reasoning:
                message["reasoning_content"] = reasoning
            doc: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": cfg.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
            if cfg.usage_in_response:
                doc["usage"] = usage
            return doc
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and cfg.usage_in_stream

        async def events() -> Any:
            def chunk(delta: dict[str, Any], fin: str | None = None) -> str:
                doc = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": cfg.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": fin}],
                }
                return f"data: {json.dumps(doc)}\n\n"

            yield chunk({"role": "assistant", "content": ""})
            if reset:
                state.faults.append({"endpoint": "chat", "status": "reset", "time": time.monotonic()})
                raise ConnectionResetError("fake: connection dropped mid-stream")
            for i in range(0, len(reasoning), 12):
                yield chunk({"reasoning_content": reasoning[i : i + 12]})
            for i in range(0, len(reply), 6):
                yield chunk({"content": reply[i : i + 6]})
            yield chunk({}, finish)
            if include_usage:
                doc = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": cfg.model,
                    "choices": [],
                    "usage": usage,
                }
                yield f"data: {json.dumps(doc)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class FakeServer:
    """Runs the app with uvicorn in a thread on 127.0.0.1 and a free port."""

    def __init__(self, cfg: FakeConfig, port: int = 0) -> None:
        """`port`: 0 for a free one, or a stopped fake's port to relaunch a server at the same URL."""
        self.state = FakeState(cfg)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            make_app(self.state),
            log_level="error",
            lifespan="off",
            access_log=False,
            # A dying fake's held requests are cancelled (connection dropped) soon after shutdown.
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.state.server = self.server
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cfg(self) -> FakeConfig:
        return self.state.cfg

    def start(self) -> FakeServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def reset(self, **changes: Any) -> FakeServer:
        """A fresh fake on the running server: default settings plus `changes`, counters at zero.
        (The app holds this FakeConfig object, so it is updated in place.) Saves a uvicorn start
        and stop per case where many short cases run one after another."""
        fresh = FakeConfig(**changes)
        for f in dataclasses.fields(FakeConfig):
            setattr(self.state.cfg, f.name, getattr(fresh, f.name))
        st = self.state
        st.log, st.faults, st.arrivals = [], [], []
        st.served = st.chat_calls = st.tokenize_calls = st.inflight = st.max_inflight = st.probes = 0
        return self

    def stop(self) -> None:
        self.state.stopping = True  # releases stalled requests at once
        self.server.should_exit = True
        self.thread.join(timeout=10)
        try:
            self.sock.close()
        except OSError:
            pass

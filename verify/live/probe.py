"""What a server is: served models, context limit, index-K format, tokenizer access, identity.

Read once at start-up, written to the report's environment block, and used to refuse runs that
cannot work (server down, wrong model name, target longer than the server allows, another index-K
format than expected) before any long prompt is sent. The identity (URL, model path, version, a
digest of the resolved server args, the launch) is what a resumed run must match (store.py).

Start-up requests are retried like any request. A start-up that still fails on a transient fault
(a rate-limiting router, a 503) is `StartupIncomplete`, rerun completes it; one that cannot work
(server down, wrong model, no usable endpoint) is a `SetupError`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from verify.live.client import ArmClient, ChatResult, RequestFailure, Sampling, classify_status
from verify.live.layouts import Message, Rendered
from verify.live.retry import RetryPolicy, with_retries
from verify.live.states import TRANSIENT_KINDS
from verify.live.tokens import CalibratedCounter, ServerTokenCounter, TokenCounter, TokenizeUnavailable

# server_info fields worth showing in the report (the full JSON goes to environment.json).
SERVER_INFO_FIELDS = (
    "version",
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "context_length",
    "max_req_input_len",
    "max_total_num_tokens",
    "startup_time",
    "deepseek_v4_indexer_k_dtype",
    "dsv4_index_k_format",
    "enable_deepseek_v4_bf16_index_k",
    "enable_deepseek_v4_fp4_indexer",
    "kv_cache_dtype",
    "attention_backend",
    "page_size",
    "tp_size",
    "dp_size",
    "enable_dp_attention",
    "chunked_prefill_size",
    "disable_radix_cache",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
    "allow_auto_truncate",
    "reasoning_parser",
    "tool_call_parser",
    "launch_command",
)


INDEX_K_FORMATS = ("bf16", "fp8", "fp4")
UNKNOWN_FORMAT = "unknown (not patched?)"
# server_info fields that change while one server runs, or on every launch of the same settings
# (SGLang picks a random seed and measures its KV pool at each start): not part of the digest.
VOLATILE_INFO_FIELDS = frozenset(
    {"internal_states", "startup_time", "status", "max_total_num_tokens", "random_seed", "kv_events"}
)
T = TypeVar("T")


class SetupError(Exception):
    """A problem found before measuring anything; the message says what to do."""


class StartupIncomplete(Exception):
    """A start-up request still failed on a transient fault after the retries: rerunning completes it."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


async def startup_call(
    policy: RetryPolicy, call: Callable[[], Awaitable[T]], what: str, label: str, retried: list[str]
) -> T:
    """A start-up request, retried like any request (each retried kind appended to `retried`). A
    server that refuses connections is down (not waited on); a transient fault left after the
    retries is StartupIncomplete."""

    async def keep_trying(e: RequestFailure) -> bool:
        return e.kind != "connection"

    try:
        return await with_retries(policy, call, keep_trying, retried)
    except RequestFailure as e:
        if e.kind in TRANSIENT_KINDS and e.kind != "connection":
            raise StartupIncomplete(
                f"the {label}'s {what} still failed at start-up after {e.attempts} attempt(s): {e.message}",
                e.kind,
            ) from e
        raise


@dataclass
class ServerProfile:
    arm: str
    url: str
    models: list[dict[str, Any]]
    model: str
    server_info: dict[str, Any] | None
    server_info_path: str | None
    model_info: dict[str, Any] | None
    max_model_len: int | None  # from /v1/models or server_info
    max_req_input_len: int | None
    index_k_format: str  # "bf16", "fp8", "fp4" or UNKNOWN_FORMAT
    index_k_source: str  # where the format came from
    notes: list[str] = field(default_factory=list)
    startup_retried: list[str] = field(default_factory=list)  # kinds of start-up faults retried away

    def info(self, key: str) -> Any:
        """A server_info value where the server puts it: top level, else nested (per-DP states)."""
        return info_value(self.server_info, key)

    def server_args(self) -> dict[str, Any]:
        """server_info without what changes while the server runs or at every launch."""
        return {k: v for k, v in (self.server_info or {}).items() if k not in VOLATILE_INFO_FIELDS}

    @cached_property
    def _identity(self) -> dict[str, Any]:
        """Who this server is, as far as it says: a resumed run must find the same (store.py)."""
        info = self.server_info or {}
        args = self.server_args()
        launch = info.get("startup_time")
        return {
            "url": self.url,
            "model": self.model,
            "model_path": info.get("model_path"),
            "version": info.get("version"),
            "server_args_digest": _digest(args) if args else None,
            "index_k_format": self.index_k_format,
            "launch": f"startup_time {_digest(launch)}" if launch is not None else None,
        }

    def identity(self) -> dict[str, Any]:
        return dict(self._identity)  # server_info does not change once read: digested once

    def max_prompt_tokens(self, max_tokens: int) -> int | None:
        """Largest prompt this server accepts with `max_tokens` to generate.

        SGLang refuses input >= context_len and input + max_new_tokens > context_len.
        """
        limits: list[int] = []
        if self.max_model_len:
            limits.append(self.max_model_len - max_tokens - 1)
        if self.max_req_input_len:
            limits.append(self.max_req_input_len)
        return min(limits) if limits else None

    def environment(self) -> dict[str, Any]:
        info = self.server_info or {}
        picked = {k: info_value(info, k) for k in SERVER_INFO_FIELDS if info_value(info, k) is not None}
        return {
            "url": self.url,
            "model": self.model,
            "served_models": [m.get("id") for m in self.models],
            "max_model_len": self.max_model_len,
            "max_req_input_len": self.max_req_input_len,
            "index_k_format": self.index_k_format,
            "index_k_format_source": self.index_k_source,
            "identity": self.identity(),
            "server_info_path": self.server_info_path,
            "server_info": picked,
            "model_info": self.model_info,
            "notes": self.notes,
        }


def _find_key(obj: Any, key: str) -> Any:
    """First value of `key` in a nested dict/list (server_info nests per-DP internal states)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def info_value(info: dict[str, Any] | None, key: str) -> Any:
    """`key` at the top level of server_info, else wherever it is nested (None: absent)."""
    if not info:
        return None
    return info[key] if key in info else _find_key(info, key)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def index_k_format(info: dict[str, Any] | None) -> tuple[str, str]:
    """The index-K format and where it came from, in the order servers grew the fields.

    The series resolves `deepseek_v4_indexer_k_dtype` among the server args; older series servers
    report `dsv4_index_k_format` and `enable_deepseek_v4_bf16_index_k`. An unpatched upstream server
    has only `enable_deepseek_v4_fp4_indexer`: there the indexer is fp4 when it is on and upstream's
    only other format, fp8, when it is present and off. A server with none of these says nothing
    about its format, and is never labelled fp8.
    """
    if not info:
        return UNKNOWN_FORMAT, "no server info endpoint"
    for key in ("deepseek_v4_indexer_k_dtype", "dsv4_index_k_format"):
        fmt = info_value(info, key)
        if isinstance(fmt, str) and fmt:
            return fmt, f"server_info.{key}"
    if info_value(info, "enable_deepseek_v4_bf16_index_k"):
        return "bf16", "inferred: enable_deepseek_v4_bf16_index_k is set (an older series server)"
    fp4 = info_value(info, "enable_deepseek_v4_fp4_indexer")
    if fp4:
        return "fp4", "inferred: enable_deepseek_v4_fp4_indexer is set (no index-K format field)"
    if fp4 is not None:
        return (
            "fp8",
            "inferred: enable_deepseek_v4_fp4_indexer is off on a server without the series (upstream: fp8)",
        )
    return UNKNOWN_FORMAT, "no index-K format field, nor upstream's fp4 indexer flag"


def same_format_warning(formats: Sequence[str]) -> str | None:
    """An A/B of two servers of one index-K format compares deployments, not formats: say so."""
    if len(formats) < 2 or len(set(formats)) > 1:
        return None
    if formats[0] == UNKNOWN_FORMAT:
        return "neither server reports its index-K format: the A/B cannot say which formats it compares"
    return (
        f"both servers report index-K format {formats[0]}: the A/B compares two {formats[0]} deployments, "
        "not two formats"
    )


def check_format(profile: ServerProfile, expected: str | None, option: str) -> None:
    """`--expect-format`: a server of another format, or one that does not say, is a setup error."""
    if expected is None or profile.index_k_format == expected:
        return
    raise SetupError(
        f"{option} {expected}: the {'baseline server' if profile.arm != 'server' else 'server under test'} "
        f"at {profile.url} reports index-K format {profile.index_k_format!r} ({profile.index_k_source}). "
        "Point it at a server of that format, or relaunch it with the format you mean to test."
    )


async def profile_server(arm: ArmClient, requested_model: str | None, policy: RetryPolicy) -> ServerProfile:
    retried: list[str] = []

    async def get(path: str) -> tuple[int, Any]:
        return await startup_call(policy, lambda: _get_checked(arm, path), f"GET {path}", arm.label, retried)

    try:
        status, models_doc = await get("/v1/models")
    except RequestFailure as e:
        raise SetupError(
            f"cannot reach the {arm.label} at {arm.root} ({e.message}). Is SGLang running there, "
            f"and is the URL right (host:port of `python -m sglang.launch_server`)?"
        ) from e
    if status != 200 or not isinstance(models_doc, dict):
        raise SetupError(
            f"{arm.root}/v1/models answered HTTP {status}; this does not look like an OpenAI-compatible "
            f"server: {str(models_doc)[:200]}"
        )
    models = [m for m in models_doc.get("data", []) if isinstance(m, dict)]
    ids = [str(m.get("id")) for m in models]
    if not ids:
        raise SetupError(f"{arm.root}/v1/models lists no model")
    if requested_model is None:
        model = ids[0]
    elif requested_model in ids:
        model = requested_model
    else:
        raise SetupError(
            f"model {requested_model!r} is not served by the {arm.label} at {arm.root}; it serves "
            f"{ids}. Pass --model {ids[0]} (or the served name of your choice), or omit --model."
        )
    card = next(m for m in models if str(m.get("id")) == model)

    info, info_path = None, None
    for path in ("/server_info", "/get_server_info"):
        try:
            status, doc = await get(path)
        except RequestFailure:
            continue
        if status == 200 and isinstance(doc, dict):
            info, info_path = doc, path
            break
    model_info = None
    for path in ("/model_info", "/get_model_info"):
        try:
            status, doc = await get(path)
        except RequestFailure:
            continue
        if status == 200 and isinstance(doc, dict):
            model_info = doc
            break

    max_len_candidates = [card.get("max_model_len"), info_value(info, "context_length")]
    max_lens = [int(v) for v in max_len_candidates if isinstance(v, int) and v > 0]
    max_req = info_value(info, "max_req_input_len")
    fmt, source = index_k_format(info)
    profile = ServerProfile(
        arm=arm.name,
        url=arm.root,
        models=models,
        model=model,
        server_info=info,
        server_info_path=info_path,
        model_info=model_info,
        max_model_len=min(max_lens) if max_lens else None,
        max_req_input_len=int(max_req) if isinstance(max_req, int) and max_req > 0 else None,
        index_k_format=fmt,
        index_k_source=source,
        startup_retried=retried,
    )
    if info is None:
        profile.notes.append("no /server_info or /get_server_info: not an SGLang server, or an old one")
    if profile.max_model_len is None:
        profile.notes.append(
            "max context unknown (no max_model_len / context_length): no lengths are pre-skipped"
        )
    return profile


async def _get_checked(arm: ArmClient, path: str) -> tuple[int, Any]:
    """GET that raises the transient HTTP answers (429, 408, 5xx) as RequestFailure, to be retried."""
    status, doc = await arm.get_json(path)
    if status in (408, 429) or status >= 500:
        kind = classify_status(status, str(doc))
        raise RequestFailure(kind, f"GET {arm.root}{path} answered HTTP {status}: {str(doc)[:200]}", status)
    return status, doc


def _tiny_prompt() -> Rendered:
    messages: list[Message] = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Reply with the word OK."},
    ]
    return Rendered(messages=messages, tools=None, needle_frac=None)


async def make_counter(
    arm: ArmClient, profile: ServerProfile, sampling: Sampling, policy: RetryPolicy
) -> TokenCounter:
    """Server tokenizer when present (checked against usage once), else the calibrated estimate.

    Transient faults here (a rate-limiting router, a 503) are retried like any request; only an
    endpoint that does not work at all (missing route, no `messages` support) means "no tokenizer".
    """
    kwargs = sampling.template_kwargs()
    probe_sampling = Sampling(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        thinking=sampling.thinking,
        stream=False,
    )

    def probe(rendered: Rendered) -> Awaitable[ChatResult]:
        return arm.chat(profile.model, rendered, probe_sampling, max_tokens=1)

    async def startup_usage() -> int | None:
        result = await startup_call(
            policy, lambda: probe(_tiny_prompt()), "1-token probe request", arm.label, profile.startup_retried
        )
        return result.prompt_tokens

    async def calibration_probe(rendered: Rendered) -> int:
        # During the run, like a tokenize call: its failure is the cell's sizing error (runner.py).
        result = await with_retries(policy, lambda: probe(rendered))
        if result.prompt_tokens is None:
            raise RequestFailure(
                "server_error", f"the {arm.label} returned no usage.prompt_tokens for a probe"
            )
        return result.prompt_tokens

    for path in ("/v1/tokenize", "/tokenize"):
        counter = ServerTokenCounter(arm.http, path, profile.model, kwargs)

        def tiny_count(c: ServerTokenCounter = counter) -> Awaitable[int]:
            return c.raw_count(_tiny_prompt())

        try:
            n = await startup_call(
                policy,
                tiny_count,
                path,
                arm.label,
                profile.startup_retried,
            )
        except TokenizeUnavailable as e:
            # Missing route, old server without `messages`, or a non-JSON answer: try the next one.
            profile.notes.append(f"{path} not usable: {str(e)[:120]}")
            continue
        except RequestFailure as e:
            raise SetupError(f"the {arm.label}'s {path} kept failing at start-up: {e.message}") from e
        try:
            used = await startup_usage()
        except RequestFailure as e:
            raise SetupError(f"the {arm.label} failed a 1-token probe request: {e.message}") from e
        if used is None:
            profile.notes.append(
                "no usage.prompt_tokens even without streaming: the length the server reads cannot be "
                "checked, so every cell will be 'unchecked'"
            )
            return counter
        counter.offset = used - n
        if counter.offset:
            profile.notes.append(
                f"{path} counts {n} tokens for the probe, usage.prompt_tokens says {used}: offset "
                f"{counter.offset:+d} applied to every count"
            )
        return counter
    try:
        used = await startup_usage()
    except RequestFailure as e:
        raise SetupError(f"the {arm.label} failed a 1-token probe request: {e.message}") from e
    if used is None:
        raise SetupError(
            f"the {arm.label} has no usable tokenize endpoint and returns no usage.prompt_tokens, so prompt "
            "sizes can be neither fitted nor checked. Serve /v1/tokenize or return usage (SGLang does both)."
        )
    profile.notes.append(
        "no tokenize endpoint: prompt sizes are estimates calibrated per scenario layout from usage.prompt_tokens"
    )
    return CalibratedCounter(probe=calibration_probe)

"""What a server is: served models, context limit, index-K format, tokenizer access.

Read once at start-up, written to the report's environment block, and used to refuse runs that
cannot work (server down, wrong model name, target longer than the server allows) before any
long prompt is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verify.live.client import ArmClient, RequestFailure, Sampling
from verify.live.layouts import Message, Rendered
from verify.live.retry import RetryPolicy, with_retries
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


class SetupError(Exception):
    """A problem found before measuring anything; the message says what to do."""


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
    index_k_format: str  # "bf16", "fp8", "fp4" or "unknown"
    index_k_source: str  # where the format came from
    notes: list[str] = field(default_factory=list)

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
        picked = {k: info.get(k) for k in SERVER_INFO_FIELDS if k in info}
        return {
            "url": self.url,
            "model": self.model,
            "served_models": [m.get("id") for m in self.models],
            "max_model_len": self.max_model_len,
            "max_req_input_len": self.max_req_input_len,
            "index_k_format": self.index_k_format,
            "index_k_format_source": self.index_k_source,
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


def index_k_format(info: dict[str, Any] | None) -> tuple[str, str]:
    """The index-K format and where it came from.

    The series adds `dsv4_index_k_format` to /get_server_info; an unpatched server has no such field,
    and then the format follows from its flags (fp4 only when the fp4 indexer is on, else fp8).
    """
    if not info:
        return "unknown", "no server info endpoint"
    fmt = _find_key(info, "dsv4_index_k_format")
    if isinstance(fmt, str) and fmt:
        return fmt, "server_info.dsv4_index_k_format"
    if _find_key(info, "enable_deepseek_v4_bf16_index_k"):
        return "bf16", "inferred: enable_deepseek_v4_bf16_index_k is set (no dsv4_index_k_format field)"
    if _find_key(info, "enable_deepseek_v4_fp4_indexer"):
        return "fp4", "inferred: enable_deepseek_v4_fp4_indexer is set (no dsv4_index_k_format field)"
    return "fp8", "inferred: upstream default (no dsv4_index_k_format field: server not patched?)"


async def profile_server(arm: ArmClient, requested_model: str | None) -> ServerProfile:
    try:
        status, models_doc = await arm.get_json("/v1/models")
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
            status, doc = await arm.get_json(path)
        except RequestFailure:
            continue
        if status == 200 and isinstance(doc, dict):
            info, info_path = doc, path
            break
    model_info = None
    for path in ("/model_info", "/get_model_info"):
        try:
            status, doc = await arm.get_json(path)
        except RequestFailure:
            continue
        if status == 200 and isinstance(doc, dict):
            model_info = doc
            break

    max_len_candidates = [card.get("max_model_len")]
    if info:
        max_len_candidates.append(info.get("context_length"))
    max_lens = [int(v) for v in max_len_candidates if isinstance(v, int) and v > 0]
    max_req = _find_key(info, "max_req_input_len") if info else None
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
    )
    if info is None:
        profile.notes.append("no /server_info or /get_server_info: not an SGLang server, or an old one")
    if profile.max_model_len is None:
        profile.notes.append(
            "max context unknown (no max_model_len / context_length): no lengths are pre-skipped"
        )
    return profile


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

    async def usage_tokens(rendered: Rendered) -> int | None:
        result = await with_retries(
            policy, lambda: arm.chat(profile.model, rendered, probe_sampling, max_tokens=1)
        )
        return result.prompt_tokens

    async def calibration_probe(rendered: Rendered) -> int:
        tokens = await usage_tokens(rendered)
        if tokens is None:
            raise RequestFailure(
                "server_error", f"the {arm.label} returned no usage.prompt_tokens for a probe"
            )
        return tokens

    for path in ("/v1/tokenize", "/tokenize"):
        counter = ServerTokenCounter(arm.http, path, profile.model, kwargs)
        try:
            n = await with_retries(policy, lambda c=counter: c.raw_count(_tiny_prompt()))
        except TokenizeUnavailable as e:
            # Missing route, old server without `messages`, or a non-JSON answer: try the next one.
            profile.notes.append(f"{path} not usable: {str(e)[:120]}")
            continue
        except RequestFailure as e:
            raise SetupError(f"the {arm.label}'s {path} kept failing at start-up: {e.message}") from e
        try:
            used = await usage_tokens(_tiny_prompt())
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
        used = await usage_tokens(_tiny_prompt())
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

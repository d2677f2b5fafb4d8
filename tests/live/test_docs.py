"""The live tier's documentation states what the code does: exit codes, states, retry defaults,
the options a verdict or a resume depends on, and the extra that installs the tier.

Both READMEs quote these figures to operators deciding a rollout; read from the real parser,
policy and verdict table, so changing a default or an exit code without the docs fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from verify.live import cli
from verify.live.config import RunConfig
from verify.live.gate import SETUP_ERROR_EXIT, VERDICT_EXIT
from verify.live.probe import UNKNOWN_FORMAT, VOLATILE_INFO_FIELDS
from verify.live.runner import (
    TIMEOUT_BASE_S,
    TIMEOUT_PER_OUTPUT_TOKEN_S,
    TIMEOUT_PER_PROMPT_TOKEN_S,
    request_timeout,
)
from verify.live.states import ERROR_KINDS, STATES, UNCHECKED_KINDS

ROOT = Path(__file__).resolve().parents[2]
LIVE_README = ROOT / "verify" / "live" / "README.md"


def text(path: Path) -> str:
    return " ".join(path.read_text().split())  # line wrapping is not content


def test_exit_code_tables_match_the_verdicts() -> None:
    codes = {**VERDICT_EXIT, "setup error": SETUP_ERROR_EXIT}
    assert sorted(codes.values()) == [0, 1, 2, 3]
    for readme in (ROOT / "README.md", LIVE_README):
        rows = dict(re.findall(r"^\| (\d) \| ([A-Za-z ]+?) \|", readme.read_text(), re.MULTILINE))
        assert {verdict: int(code) for code, verdict in rows.items()} == codes, readme
    doc = cli.__doc__ or ""
    for verdict, code in codes.items():
        assert re.search(
            rf"^\s+{code}\s+{verdict.upper() if code != 2 else 'setup error'}", doc, re.MULTILINE
        )


def test_states_and_error_kinds_are_all_documented() -> None:
    readme = LIVE_README.read_text()
    section = readme[readme.index("## States") : readme.index("## Retries")]
    documented = re.findall(r"^\| `([a-z]+)` \|", section, re.MULTILINE)
    assert documented == list(STATES)
    for kind in ERROR_KINDS:
        assert f"`{kind}`" in section, kind


def test_retry_and_timeout_defaults_are_the_documented_ones() -> None:
    args = cli.build_parser().parse_args(["--server", "http://h:1"])
    doc = text(LIVE_README)
    assert f"at most `--retries` times (default {args.retries})" in doc
    assert f"`--retry-wait` (default {args.retry_wait:g} s)" in doc
    assert f"`--retry-max-wait` (default {args.retry_max_wait:g} s)" in doc
    assert f"`--max-consecutive-errors` (default {args.max_consecutive_errors})" in doc
    assert args.timeout is None  # scaled unless given
    assert (
        f"{TIMEOUT_BASE_S:g} s, plus {TIMEOUT_PER_PROMPT_TOKEN_S * 1000:g} ms per prompt token, plus "
        f"{TIMEOUT_PER_OUTPUT_TOKEN_S:g} s per completion token" in doc
    )
    cfg = RunConfig(out_dir=Path("x"), server_url="x")
    short, long = (round(request_timeout(cfg, n, 64)) for n in (1024, 65536))
    assert f"about {short} s at 1K tokens, {long} s at 64K" in doc


def test_the_live_tier_section_names_the_extra_the_format_check_and_what_a_resume_refuses() -> None:
    readme = (ROOT / "README.md").read_text()
    section = " ".join(readme[readme.index("## Deploying with the patched wheel") :].split("## ")[1].split())
    assert "pip install '.[live]'" in section and "--expect-format bf16|fp8|fp4" in section
    assert "a resume refuses an `--out` folder of other settings or of another server" in section
    for option in ("--accept-relaunch", "--restart", "--baseline-expect-format"):
        assert option in section
    # The extra the README installs is the one pyproject declares.
    assert "live = [" in (ROOT / "pyproject.toml").read_text()


def test_every_option_a_verdict_or_a_resume_depends_on_is_documented() -> None:
    args = cli.build_parser().parse_args(["--server", "http://h:1"])
    doc = text(LIVE_README)
    for option in (
        "--expect-format",
        "--baseline-expect-format",
        "--restart",
        "--accept-relaunch",
        "--accept-calibrated",
        "--token-tolerance",
    ):
        assert f"`{option}" in doc, option
    assert f"`--token-tolerance N` allows N missing tokens (default {args.token_tolerance})" in doc
    assert f"`{UNKNOWN_FORMAT}`" in doc
    for field in sorted(VOLATILE_INFO_FIELDS):
        assert f"`{field}`" in doc, field  # what a server-args digest leaves out
    for kind in UNCHECKED_KINDS:
        assert f"(`{kind}`" in doc, kind

"""Which function upstream's C4 indexer calls on each platform, read off upstream's own hook and
forward (the dispatch probe), on the real pool, backend and indexer -- the selection each
platform profile of verify/ runs. If a new upstream release changes a platform's path, these fail
and say which: the profiles then follow upstream, not this file."""

import pytest

from verify.core import platform as P
from verify.core import probe


@pytest.fixture(scope="module")
def dispatch():
    return {
        (d.profile, d.flag, d.mode.split()[0]): d
        for prof in P.PROFILE_NAMES
        for flag in (False, True)
        for d in probe.probe(prof, flag)
    }


def test_hook_sets_sm120_switches():
    with P.applied("sm120") as applied:
        env = applied.hook_env
    assert env["SGLANG_OPT_USE_TILELANG_INDEXER"] == "True"
    assert env["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "True"
    assert env["SGLANG_OPT_USE_TOPK_V2"] == "False"
    with P.applied("sm90") as applied:
        assert applied.hook_env["SGLANG_OPT_USE_TILELANG_INDEXER"] is None


def test_profile_is_undone_on_exit():
    import os

    from sglang.srt.layers.attention.dsv4 import metadata
    from sglang.srt.runtime_context import get_platform

    before = (metadata._IS_SM120, os.environ.get("SGLANG_OPT_USE_TOPK_V2"))
    with P.applied("sm120"):
        assert metadata._IS_SM120 is True and get_platform().is_sm120 is True
    assert (metadata._IS_SM120, os.environ.get("SGLANG_OPT_USE_TOPK_V2")) == before


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_sm120_fp8_runs_tilelang_and_topk_v1_without_chunking(dispatch, mode):
    d = dispatch[("sm120", False, mode)]
    assert d.scorer == ["score_tilelang"] and d.topk == ["topk_v1"]
    assert d.metadata.startswith("none") and d.seq_lens_dim == 1 and d.clean_logits is False
    assert not d.nonpaged_gather


def test_sm90_and_sm100_fp8_run_deepgemm_and_topk_v2(dispatch):
    for prof in ("sm90", "sm100"):
        dec, ext = dispatch[(prof, False, "decode")], dispatch[(prof, False, "extend")]
        assert dec.scorer == ["score_deepgemm"] and dec.topk == ["topk_v2"] and dec.seq_lens_dim == 2
        assert dec.metadata.startswith("DeepGEMM schedule")
        # one request of >= 8192 prefill rows: upstream gathers its keys for the non-paged kernel
        assert ext.scorer == ["score_deepgemm_nonpaged"] and ext.nonpaged_gather


def test_hip_fp8_runs_aiter(dispatch):
    d = dispatch[("hip", False, "decode")]
    assert d.scorer == ["score_aiter"] and d.topk == ["topk_v2"] and d.metadata.startswith("none")


@pytest.mark.parametrize("prof", P.PROFILE_NAMES)
def test_flag_on_reads_bf16_in_place_everywhere(dispatch, prof):
    for mode in ("decode", "extend"):
        d = dispatch[(prof, True, mode)]
        # one request's long prefill: the bf16 prefill kernel where upstream's fp8 path gathers its keys
        # for the non-paged fp8_mqa_logits (every CUDA profile, sm_120's included); ROCm has no such path
        want = "score_bf16_prefill" if mode == "extend" and prof != "hip" else "score_bf16"
        assert d.scorer == [want], d
        assert not d.nonpaged_gather
        # no DeepGEMM schedule for the bf16 scorers, on any platform
        assert d.metadata.startswith("none"), d
        assert (
            d.topk == dispatch[(prof, False, "decode")].topk
        )  # the series leaves the top-k as upstream picks it


def test_replacements_are_named(dispatch):
    named = " ".join(dispatch[("sm90", False, "decode")].replaced)
    assert "_create_flashmla_metadata" in named and "spy" in named


def test_profile_roles_for_the_backends():
    assert probe.profile_roles("sm120") == {
        "scorer": "score_tilelang",
        "topk": "topk_v1",
        "metadata": "none (no DeepGEMM schedule, no row chunking)",
    }
    assert probe.profile_roles("sm90")["scorer"] == "score_deepgemm"


def test_unknown_profile_is_refused():
    with pytest.raises(P.ProfileError, match="unknown platform profile"):
        P.resolve("sm75")

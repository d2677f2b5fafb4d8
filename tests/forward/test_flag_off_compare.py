"""The flag-off identity verdict: the patched tree against the unpatched one, with the unpatched
tree run twice as the control where selections differ."""

import torch

from verify.forward.checks import compare_flag_off


def record(sel_rows, status="pass", digest="d0"):
    sel = {"prefill": torch.tensor(sel_rows), "decode": torch.tensor([[0, 1, 2]])}
    return {"selections": sel, "pool_digest": {k: digest for k in sel}, "step_status": {k: status for k in sel}}


def test_identical_runs_pass():
    res = compare_flag_off(record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 5]]))
    assert res["status"] == "pass" and "all 2 steps select the same slots" in res["detail"]


def test_different_pool_bytes_fail_whatever_the_selections():
    res = compare_flag_off(record([[0, 1, 2]]), record([[0, 1, 2]], digest="d1"))
    assert res["status"] == "fail" and res["pool_differs"] == ["decode", "prefill"]


def test_a_difference_without_the_control_is_incomplete_not_a_pass():
    res = compare_flag_off(record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]]))
    assert res["status"] == "incomplete"
    assert res["differing_steps"]["prefill"]["rows"] == 1 and res["differing_steps"]["prefill"]["max_slots_per_row"] == 1
    assert "no unpatched rerun" in res["detail"]


def test_upstreams_own_tie_breaking_explains_a_difference():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    control = record([[0, 1, 2], [3, 4, 7]])
    res = compare_flag_off(patched, base, control)
    assert res["status"] == "pass" and "run-to-run tie-breaking" in res["detail"]


def test_a_difference_upstream_does_not_show_against_itself_fails():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    res = compare_flag_off(patched, base, record([[0, 1, 2], [3, 4, 6]]))
    assert res["status"] == "fail" and "NOT explained" in res["detail"]


def test_a_difference_where_an_oracle_check_failed_fails_even_with_the_control():
    patched, base = record([[0, 1, 2], [3, 4, 5]], status="fail"), record([[0, 1, 2], [3, 4, 6]])
    res = compare_flag_off(patched, base, record([[0, 1, 2], [3, 4, 7]]))
    assert res["status"] == "fail"


def test_missing_steps_fail():
    patched = record([[0, 1, 2]])
    del patched["selections"]["decode"]
    res = compare_flag_off(patched, record([[0, 1, 2]]))
    assert res["status"] == "fail" and res["missing"] == ["decode"]


def test_a_record_from_before_the_classification_reads_incomplete_where_the_pools_agreed():
    from verify.forward.checks import flag_off_status

    old = {"status": "fail", "detail": "differs from the unpatched tree: selections ['stale:3000'], pool bytes [], missing []"}
    assert flag_off_status(old)[0] == "incomplete"
    pool = {"status": "fail", "detail": "differs from the unpatched tree: selections [], pool bytes ['a'], missing []"}
    assert flag_off_status(pool)[0] == "fail"
    new = compare_flag_off(record([[0, 1, 2]]), record([[0, 1, 3]]))
    assert flag_off_status(new) == (new["status"], new["detail"])


def test_runs_whose_scorers_were_built_differently_are_not_compared():
    # Session 5's sm120 run: the patched run forced TileLang to sm_120's mma.sync lowering, the
    # unpatched worker did not (wgmma), and 35 prefill steps broke near-ties differently.
    patched = {**record([[0, 1, 2]]), "scorer_build": "TileLang built with TL_DISABLE_WGMMA"}
    res = compare_flag_off(patched, {**record([[0, 1, 3]]), "scorer_build": None})
    assert res["status"] == "error" and "built differently" in res["detail"]
    same = compare_flag_off(patched, {**record([[0, 1, 2]]), "scorer_build": patched["scorer_build"]})
    assert same["status"] == "pass"

"""The flag-off identity verdict: the patched tree against the unpatched one, with the unpatched
tree run twice as the control where selections differ."""

import torch

from verify.forward.checks import compare_flag_off


def record(sel_rows, status="pass", digest="d0"):
    sel = {"prefill": torch.tensor(sel_rows), "decode": torch.tensor([[0, 1, 2]])}
    return {
        "selections": sel,
        "pool_digest": {k: digest for k in sel},
        "step_status": {k: status for k in sel},
    }


def test_identical_runs_pass():
    res = compare_flag_off(record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 5]]))
    assert res["status"] == "pass" and "all 2 steps select the same slots" in res["detail"]


def test_different_pool_bytes_fail_whatever_the_selections():
    res = compare_flag_off(record([[0, 1, 2]]), record([[0, 1, 2]], digest="d1"))
    assert res["status"] == "fail" and res["pool_differs"] == ["decode", "prefill"]


def test_a_difference_without_the_control_is_incomplete_not_a_pass():
    res = compare_flag_off(record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]]))
    assert res["status"] == "incomplete"
    assert (
        res["differing_steps"]["prefill"]["rows"] == 1
        and res["differing_steps"]["prefill"]["max_slots_per_row"] == 1
    )
    assert "no rerun of either tree" in res["detail"]


def test_upstreams_own_tie_breaking_explains_a_difference():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    control = record([[0, 1, 2], [3, 4, 7]])
    res = compare_flag_off(patched, base, control)
    assert (
        res["status"] == "pass"
        and "run-to-run tie-breaking" in res["detail"]
        and res["differing_steps"]["prefill"]["unpatched_rerun_differs"]
    )


def test_a_difference_upstream_does_not_show_against_itself_fails():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    res = compare_flag_off(patched, base, record([[0, 1, 2], [3, 4, 6]]))
    assert res["status"] == "fail" and "NOT explained by either tree" in res["detail"]


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
    from verify.core.forward_runs import flag_off_status

    old = {
        "status": "fail",
        "detail": "differs from the unpatched tree: selections ['stale:3000'], pool bytes [], missing []",
    }
    assert flag_off_status(old)[0] == "incomplete"
    pool = {
        "status": "fail",
        "detail": "differs from the unpatched tree: selections [], pool bytes ['a'], missing []",
    }
    assert flag_off_status(pool)[0] == "fail"
    new = compare_flag_off(record([[0, 1, 2]]), record([[0, 1, 3]]))
    assert flag_off_status(new) == (new["status"], new["detail"])


def test_runs_whose_scorers_were_built_differently_are_not_compared():
    # An sm120 run where the patched run forced TileLang to sm_120's mma.sync lowering and the
    # unpatched worker did not (wgmma): prefill steps broke near-ties differently.
    patched = {**record([[0, 1, 2]]), "scorer_build": "TileLang built with TL_DISABLE_WGMMA"}
    res = compare_flag_off(patched, {**record([[0, 1, 3]]), "scorer_build": None})
    assert res["status"] == "error" and "built differently" in res["detail"]
    same = compare_flag_off(patched, {**record([[0, 1, 2]]), "scorer_build": patched["scorer_build"]})
    assert same["status"] == "pass"


def test_the_patched_trees_own_rerun_explains_what_the_unpatched_control_does_not():
    # The unpatched tree repeats itself; the patched tree, run again, does not: the flag-off path
    # (upstream's kernels, in both trees) varies run to run on that step.
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    res = compare_flag_off(patched, base, record([[0, 1, 2], [3, 4, 6]]), record([[0, 1, 2], [3, 4, 6]]))
    assert res["status"] == "pass", res["detail"]
    assert res["differing_steps"]["prefill"]["patched_rerun_differs"] is True
    assert res["control"] == "unpatched tree run twice and patched tree run twice"


def test_a_difference_both_trees_repeat_fails():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    res = compare_flag_off(patched, base, record([[0, 1, 2], [3, 4, 6]]), record([[0, 1, 2], [3, 4, 5]]))
    assert res["status"] == "fail" and "NOT explained by either tree" in res["detail"]
    assert res["differing_steps"]["prefill"]["patched_rerun_differs"] is False


def test_a_patched_rerun_alone_is_a_control():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    res = compare_flag_off(patched, base, patched_control=record([[0, 1, 2], [3, 4, 5]]))
    assert res["status"] == "fail" and res["control"] == "patched tree run twice"


def test_compare_with_baseline_reruns_the_patched_arm_only_where_the_unpatched_control_leaves_a_doubt(
    monkeypatch, tmp_path
):
    from types import SimpleNamespace

    from verify.forward import cli

    def arm(rows):
        r = record(rows)
        return SimpleNamespace(
            selections=r["selections"], pool_digest=r["pool_digest"], step_status=r["step_status"]
        )

    runs = {"": record([[0, 1, 2], [3, 4, 6]]), "-control": record([[0, 1, 2], [3, 4, 6]])}
    monkeypatch.setattr(
        cli, "_run_baseline", lambda tree, profile, quick, out, tag, scenarios=None: runs[tag]
    )
    reruns = []

    def rerun():
        reruns.append(1)
        return arm([[0, 1, 2], [3, 4, 6]])  # the patched tree, run again, selects what upstream did

    res = cli.compare_with_baseline(
        arm([[0, 1, 2], [3, 4, 5]]), tmp_path, "sm120", True, tmp_path, None, rerun
    )
    assert reruns == [1] and res["status"] == "pass", res["detail"]

    runs[""] = record([[0, 1, 2], [3, 4, 5]])  # identical: no control, no rerun
    res = cli.compare_with_baseline(
        arm([[0, 1, 2], [3, 4, 5]]), tmp_path, "sm120", True, tmp_path, None, rerun
    )
    assert reruns == [1] and res["status"] == "pass" and res["control"] is None


def test_row_digests_count_only_the_columns_a_top_k_reads():
    from verify.forward.checks import logits_row_digests

    logits = torch.randn(3, 700)
    lens = torch.tensor([600, 700, 100])
    first = logits_row_digests(logits, lens, min_keys=512, chunk=2)
    poisoned = logits.clone()
    poisoned[0, 600:] = float("nan")  # past row 0's length: stale or never written
    poisoned[2] = float("inf")  # row 2 has <= 512 keys: the top-k takes all without reading
    assert torch.equal(logits_row_digests(poisoned, lens, min_keys=512), first)
    assert first[2] == 0 and first[0] != 0
    nudged = logits.clone()
    nudged[1, 3] = torch.nextafter(nudged[1, 3], torch.tensor(float("inf")))  # one ulp on a read column
    assert not torch.equal(logits_row_digests(nudged, lens, min_keys=512), first)


def test_the_comparison_says_whether_the_scores_differed_where_the_selections_did():
    patched, base = record([[0, 1, 2], [3, 4, 5]]), record([[0, 1, 2], [3, 4, 6]])
    same = {"prefill": torch.tensor([7, 9]), "decode": torch.tensor([1])}
    patched["logits_digest"], base["logits_digest"] = same, dict(same)
    res = compare_flag_off(patched, base)
    assert (
        res["differing_steps"]["prefill"]["scores_differ_on_those_rows"] is False
    )  # the top-k chose differently
    base["logits_digest"] = {"prefill": torch.tensor([7, 8]), "decode": torch.tensor([1])}
    res = compare_flag_off(patched, base)
    assert res["differing_steps"]["prefill"]["scores_differ_on_those_rows"] is True  # the scorer did

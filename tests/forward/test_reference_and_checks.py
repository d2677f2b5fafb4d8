"""The forward tier's oracles and checks on CPU: the one-shot reference compression against an
independent per-window evaluation of DeepSeek-V4's formula, and the key / selection checks
catching what they exist to catch."""

import torch

from verify.core import formats as F
from verify.core.rig import RigConfig, make_weights
from verify.forward import reference as R
from verify.forward.checks import check_keys, check_selection


def _weights():
    return make_weights(RigConfig(hidden_size=64, q_lora_rank=32), torch.Generator().manual_seed(3))


def test_compressed_kv_is_deepseeks_windows():
    """Key i pools tokens 4i..4i+3 (second-half projections) and 4i-4..4i-1 (first-half), with a
    per-dimension softmax over the 8 gate scores plus the positional bias; key 0 has no overlap."""
    w = _weights()
    x = torch.randn(4 * 6 + 3, 64, generator=torch.Generator().manual_seed(4))  # 3 tokens of an open window
    got = R.compressed_kv(x, w)
    assert got.shape == (6, 128)
    kv, sc = x @ w.wkv.T, x @ w.wgate.T
    for i in range(6):
        parts_kv, parts_sc = [], []
        if i > 0:
            for t in range(4):
                parts_kv.append(kv[4 * (i - 1) + t, :128])
                parts_sc.append(sc[4 * (i - 1) + t, :128] + w.ape[t, :128])
        for t in range(4):
            parts_kv.append(kv[4 * i + t, 128:])
            parts_sc.append(sc[4 * i + t, 128:] + w.ape[t, 128:])
        p = torch.stack(parts_sc).softmax(0)
        want = (torch.stack(parts_kv) * p).sum(0)
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)


def test_reference_keys_are_rotated_and_normalised():
    from sglang.kernels.ops.attention.deepseek_v4_rope import precompute_freqs_cis

    w = _weights()
    x = torch.randn(400, 64, generator=torch.Generator().manual_seed(5))
    freqs = precompute_freqs_cis(64, 1024, 65536, 160000, 16.0, 32, 1)
    keys = R.reference_keys(x, w, freqs)
    assert keys.shape == (100, 128)
    # Hadamard and RoPE are rotations: the norm is the RMS-normed, weighted vector's
    kv = R.compressed_kv(x, w)
    normed = kv * torch.rsqrt(kv.pow(2).mean(1, keepdim=True) + w.eps) * w.norm
    torch.testing.assert_close(keys.norm(dim=1), normed.norm(dim=1), rtol=1e-4, atol=1e-5)


def _pools(keys):
    slots = torch.randperm(50 * 64, generator=torch.Generator().manual_seed(6))[: keys.shape[0]]
    pools = {"bf16": F.new_pool("bf16", 50), "fp8": F.new_pool("fp8", 50)}
    F.bf16_store(pools["bf16"], slots, keys)
    F.fp8_store(pools["fp8"], slots, keys)
    return pools, slots


def test_key_check_passes_exact_stores_and_names_the_first_wrong_key():
    keys = torch.randn(3000, 128, generator=torch.Generator().manual_seed(7))
    pools, slots = _pools(keys)
    for fmt in ("bf16", "fp8"):
        assert check_keys(pools[fmt], slots, keys, fmt).ok
    # a key two pages in is wrong (as a page-offset fault would leave it)
    pools["fp8"][slots[200] // 64, (slots[200] % 64) * 128 + 5] ^= 0x40
    kc = check_keys(pools["fp8"], slots, keys, "fp8")
    assert not kc.ok and kc.first_bad_key == 200 and kc.first_bad_page == 3
    bad = keys.clone()
    bad[1500:] *= 1.01  # the reference moved past key 1500: every key after it mismatches
    kc = check_keys(pools["bf16"], slots, bad, "bf16")
    assert not kc.ok and kc.first_bad_key == 1500 and kc.numbers["bad_keys_in_first_page"] == 0


def _problem():
    g = torch.Generator().manual_seed(8)
    keys = torch.randn(3000, 128, generator=g)
    q = torch.randn(5, 64, 128, generator=g)
    w = torch.rand(5, 64, generator=g)
    lens = torch.tensor([100, 600, 2999, 3000, 1500])
    chosen = torch.full((5, 512), -1, dtype=torch.long)
    for r in range(5):
        s = R.scores64(q[r : r + 1], w[r : r + 1], keys[: lens[r]])[0]
        top = s.topk(min(512, int(lens[r]))).indices
        chosen[r, : top.numel()] = top
    return keys, q, w, lens, chosen


def test_selection_check_accepts_the_oracles_topk():
    keys, q, w, lens, chosen = _problem()
    res = check_selection(chosen, lens, q, w, keys, q, w, keys, 512, R.scores64(q, w, keys).float())
    assert res.ok and res.recall_same_input == 1.0
    assert res.numbers["topk_recall_on_its_logits_min"] == 1.0 and res.numbers["scorer_calc_diff_max"] < 1e-12


def test_selection_check_blames_the_topk_or_the_scorer():
    keys, q, w, lens, chosen = _problem()
    logits = R.scores64(q, w, keys).float()
    worst = R.scores64(q[3:4], w[3:4], keys)[0].argmin()
    wrong = chosen.clone()
    wrong[3, 0] = worst  # the top-k picked a key far below the k-th on its own (correct) input
    res = check_selection(wrong, lens, q, w, keys, q, w, keys, 512, logits)
    assert not res.ok and res.numbers["wrong_rows"] == [3] and "top-k (recall" in res.detail
    # the same pick, explained by logits that rank that key high: the scorer is to blame
    bad_logits = logits.clone()
    bad_logits[3, worst] = 1e9
    res = check_selection(wrong, lens, q, w, keys, q, w, keys, 512, bad_logits)
    assert "scorer (calc_diff" in res.detail
    past = chosen.clone()
    past[2, 7] = 2999  # row 2 sees 2,999 keys: index 2,999 is past its length
    assert not check_selection(past, lens, q, w, keys, q, w, keys, 512).ok


def test_scorer_logits_are_held_to_the_oracle_only_where_the_topk_reads_them():
    # upstream's non-paged fp8 path gives rows of <= k keys an empty range (ke = ks): -inf logits
    # the top-k never reads. Those rows must pass; a longer row with the same logits must not.
    keys, q, w, lens, chosen = _problem()
    logits = R.scores64(q, w, keys).float()
    empty = logits.clone()
    empty[0] = float("-inf")  # row 0 sees 100 keys <= 512
    assert check_selection(chosen, lens, q, w, keys, q, w, keys, 512, empty).ok
    empty[1] = float("-inf")  # row 1 sees 600 keys > 512: the top-k reads these logits
    res = check_selection(chosen, lens, q, w, keys, q, w, keys, 512, empty)
    assert not res.ok and res.numbers["scorer_finite"] is False


def test_long_steps_check_the_rows_around_every_key_tile_boundary():
    # a causal prefill chunk: row p sees (p + 1) // 4 keys; rows 258 / 259 see 64 / 65 keys
    from verify.forward.tier import _sample_rows

    lens = (torch.arange(8192) + 1) // 4
    pick = _sample_rows(8192, lens)
    assert {258, 259, 514, 515} <= set(pick)
    crossings = [(a, a + 1) for a in range(8191) if lens[a] % 64 == 0 and lens[a + 1] % 64 == 1]
    assert len(crossings) == 32 and all(a in pick and b in pick for a, b in crossings)
    assert len(pick) < 8192 // 16  # still a sample
    assert _sample_rows(100, lens[:100]) == list(range(100))


def test_a_forward_result_names_the_series_its_tree_carries():
    from pathlib import Path

    from bf16k.series import series_hash
    from verify.forward.cli import _versions

    root = Path(__file__).resolve().parents[2]
    info = _versions()
    assert info["series_hash"] == series_hash(root / "series") and len(info["tree_head"]) == 40


def test_selection_check_reports_the_reference_oracle_without_gating_on_it():
    """DeepSeek's reference numerics (fp4 q x fp4 k) as a reported figure: the exact top-k is not
    the reference's, and picking the reference's own top-k keeps it fully while the check (the
    same-input oracle) fails it."""
    keys, q, w, lens, chosen = _problem()
    res = check_selection(chosen, lens, q, w, keys, q, w, keys, 512)
    assert res.ok and res.recall_exact == 1.0
    assert 0.5 < res.recall_reference < 1.0  # the exact selection, seen by the reference
    assert 0.5 < res.numbers["reference_recall_exact"] < 1.0
    assert "vs DeepSeek's reference selection" in res.detail
    indexer = R.reference_indexer(keys)
    theirs = torch.full_like(chosen, -1)
    for r in range(5):
        n = int(lens[r])
        _, sel = R.reference_selection(indexer, q[r : r + 1], w[r : r + 1], n, 512)
        theirs[r] = sel[0]
    res = check_selection(theirs, lens, q, w, keys, q, w, keys, 512)
    assert res.recall_reference == 1.0 and res.numbers["reference_recall_exact"] == res.recall_exact
    assert not res.ok  # the gate is still the same-input oracle's

"""kda.Engine with drafts (speculative decoding): verified drafts give the plain decode's results."""

import numpy as np
import pytest

import kda
from golden import check_f32, check_state_f32, golden_set_dir


def _rows(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 512)).astype(np.float32)


def _plain(path, xs, decode):
    eng = kda.Engine(path, max_running=2, dtype="float32")
    ids = [eng.submit(x, decode_tokens=decode) for x in xs]
    res = eng.run()
    return [res[i] for i in ids]


def test_engine_verifies_drafts_and_keeps_the_accepted_ones():
    path = golden_set_dir("kda-mini")
    xs = [_rows(12, 1), _rows(9, 2), _rows(7, 3)]
    want = _plain(path, xs, 6)
    eng = kda.Engine(path, max_running=2, dtype="float32", max_draft_tokens=3)
    calls = []

    def draft(committed, max_k):
        # Request 0's true next rows, the third one wrong: at most two are accepted.
        k = min(3, max_k)
        rows = xs[0][committed + 1:committed + 1 + k].copy()
        if k == 3:
            rows[2] = -rows[2]
        return rows

    def accept(committed, k, out):
        calls.append((committed, k, out.shape))
        return min(k, 2)

    ids = [eng.submit(xs[0], decode_tokens=6, draft=draft, accept=accept),
           eng.submit(xs[1], decode_tokens=6, seeded_drafts=(2, 0.7, 5)),
           eng.submit(xs[2], decode_tokens=6)]  # no drafts: k = 0 in the verify steps
    got = eng.run()
    assert eng.failed == {}
    assert calls and all(shape == (1 + k, 512) for _, k, shape in calls)
    # Request 0 commits 3 rows per verify step from its first decode row on.
    assert [c for c, _, _ in calls][:2] == [6, 9]
    for rid, w in zip(ids, want):
        r = got[rid]
        check_f32(r.out, w.out, what=f"request {rid} out")
        check_state_f32(r.final_recurrent_state, w.final_recurrent_state, what=f"request {rid} recurrent")
        check_state_f32(r.final_conv_state, w.final_conv_state, what=f"request {rid} conv")


def test_engine_draft_errors_fail_their_request():
    path = golden_set_dir("kda-mini")
    x = _rows(8, 4)
    eng = kda.Engine(path, max_running=2, dtype="float32", max_draft_tokens=2, verify_method="token_states")

    def boom(committed, max_k):
        raise RuntimeError("no drafts today")

    bad = eng.submit(x, decode_tokens=4, draft=boom)
    good = eng.submit(x, decode_tokens=4, draft=lambda c, m: x[c + 1:c + 1 + m])
    got = eng.run()  # stops at the error, as a failing forward does; the next run() goes on
    assert "no drafts today" in eng.failed[bad]
    if good not in got:
        got = eng.run()
    assert list(got) == [good]
    check_f32(got[good].out, _plain(path, [x], 4)[0].out)
    with pytest.raises(ValueError, match=r"max_draft_tokens must be in \[0, 64\]"):
        kda.Engine(path, max_draft_tokens=-1)
    with pytest.raises(ValueError, match="verify_method"):
        kda.Engine(path, max_draft_tokens=2, verify_method="copy")
    with pytest.raises(ValueError, match="not both"):
        eng.submit(x, decode_tokens=4, draft=boom, seeded_drafts=(1, 0.5, 1))
    wrong = eng.submit(x, decode_tokens=4, draft=lambda c, m: x[c + 1:c + 1 + m].astype(np.float64))
    eng.run()
    assert "draft rows: dtype must be float32, got float64" in eng.failed[wrong]


def test_engine_state_budget_counts_the_verify_area():
    """state_budget_bytes bounds the pool, the verify area included: as many requests as fit run at once,
    the rest queue, and the results are the unbounded engine's."""
    path = golden_set_dir("kda-mini")
    two = kda.Engine(path, max_running=2, dtype="float32", max_draft_tokens=3, verify_method="token_states")
    assert two.pool_capacity == 2
    budget = two.pool_bytes
    eng = kda.Engine(path, max_running=8, dtype="float32", max_draft_tokens=3, verify_method="token_states",
                     state_budget_bytes=budget)
    assert (eng.pool_capacity, eng.pool_bytes) == (2, budget)
    assert kda.Engine(path, max_running=8, dtype="float32", max_draft_tokens=3, verify_method="token_states",
                      state_budget_bytes=budget - 1).pool_capacity == 1
    # Without a verify area (or with the smaller one of the recompute method) the same bytes hold more.
    assert kda.Engine(path, max_running=8, dtype="float32", state_budget_bytes=budget).pool_capacity > 2
    assert kda.Engine(path, max_running=8, dtype="float32", max_draft_tokens=3,
                      state_budget_bytes=budget).pool_capacity > 2
    xs = [_rows(10, 20 + i) for i in range(3)]
    ids = [eng.submit(x, decode_tokens=5, seeded_drafts=(3, 0.7, i)) for i, x in enumerate(xs)]
    got = eng.run()
    assert eng.failed == {}
    for rid, w in zip(ids, _plain(path, xs, 5)):
        check_f32(got[rid].out, w.out, what=f"request {rid} out")
        check_state_f32(got[rid].final_recurrent_state, w.final_recurrent_state, what=f"request {rid} recurrent")
    with pytest.raises(ValueError, match="state_budget_bytes must be >= 0"):
        kda.Engine(path, state_budget_bytes=-1)
    with pytest.raises(ValueError, match="budget"):
        kda.Engine(path, max_draft_tokens=3, state_budget_bytes=1024)

"""kda with numpy: prefill two sequences with chunk_kda, then decode one more token of each with
fused_recurrent_kda_fwd from a state pool, and check the result against a prefill over all tokens.

    python examples/numpy_example.py [CHECKPOINT_DIR]

With a Kimi-Linear checkpoint directory (config.json + safetensors), also runs its first KDA layer
in bf16 over the same packed batch.
"""

import sys

import ml_dtypes
import numpy as np

import kda

rng = np.random.default_rng(0)
H, K = 4, 64
lengths = [37, 12]
T = sum(lengths)
cu = np.cumsum([0] + lengths)  # packed: cu_seqlens [N + 1]


def tokens(n):
    q, k, v = (rng.standard_normal((1, n, H, K), dtype=np.float32) for _ in range(3))
    g = -0.05 * rng.random((1, n, H, K), dtype=np.float32)  # log decay <= 0
    beta = rng.random((1, n, H), dtype=np.float32)
    return q, k, v, g, beta


q, k, v, g, beta = tokens(T + 2)  # T prefill tokens + one decode token per sequence

# Prefill: fp32 states [N, H, K, V] come back with output_final_state.
o, state = kda.chunk_kda(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], output_final_state=True,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
print("prefill o", o.shape, o.dtype, "states", state.shape)

# Decode: the states live in a pool [S, H, K, V]; sequence n in slot slots[n], updated in place.
pool = np.zeros((4, H, K, K), np.float32)
slots = np.array([3, 1], np.int32)
pool[slots] = state
dec = [x[:, T:].transpose(1, 0, *range(2, x.ndim)).copy() for x in (q, k, v, g, beta)]  # [N, 1, ...]
o_dec, pool_after = kda.fused_recurrent_kda_fwd(*dec, initial_state=pool, ssm_state_indices=slots,
                                                use_qk_l2norm_in_kernel=True)
assert pool_after is pool  # in place
print("decode o", o_dec.shape)

# The same tokens in one prefill: every sequence one token longer.
cat = [np.concatenate([x[:, cu[n]:cu[n + 1]], x[:, T + n:T + n + 1]], axis=1) for x in (q, k, v, g, beta)
       for n in range(2)]
full = [np.concatenate(cat[2 * i:2 * i + 2], axis=1) for i in range(5)]
o_full, s_full = kda.chunk_kda(*full, output_final_state=True, use_qk_l2norm_in_kernel=True,
                               cu_seqlens=np.cumsum([0] + [n + 1 for n in lengths]))
last = np.cumsum(lengths) + np.arange(2)  # index of each sequence's last token in the longer batch
np.testing.assert_allclose(o_dec[:, 0], o_full[0, last], rtol=1e-5, atol=1e-5)
np.testing.assert_allclose(pool[slots], s_full, rtol=1e-5, atol=1e-5)

# bf16 activations (ml_dtypes.bfloat16): o comes back in q's dtype.
bf = ml_dtypes.bfloat16
o_bf, _ = kda.chunk_kda(q.astype(bf), k.astype(bf), v.astype(bf), g, beta, use_qk_l2norm_in_kernel=True)
print("bf16 o", o_bf.dtype, "kernel:", kda.active_kernel())

if len(sys.argv) > 1:
    layer = kda.KimiDeltaAttention.from_pretrained(sys.argv[1], dtype="bfloat16")
    x = rng.standard_normal((T, layer.hidden_size), dtype=np.float32).astype(bf)
    out, rec, conv = layer.forward(x, cu_seqlens=cu)
    print("layer out", out.shape, out.dtype, "recurrent", rec.shape, "conv", conv.shape)
    assert np.isfinite(out.astype(np.float32)).all()
print("ok")

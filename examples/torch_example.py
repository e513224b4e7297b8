"""kda with PyTorch: the kernels as torch custom ops (torch.ops.kda.*), eager and under
torch.compile, with the decode state pool updated in place.

    python examples/torch_example.py
"""

import torch

import kda.torch as kt  # registers torch.ops.kda.chunk_kda and torch.ops.kda.fused_recurrent_kda_fwd

torch.manual_seed(0)
H, K = 4, 64
lengths = torch.tensor([20, 9])
cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
T = int(cu[-1])
q, k, v = (torch.randn(1, T, H, K, dtype=torch.bfloat16) for _ in range(3))
g = -0.05 * torch.rand(1, T, H, K)
beta = torch.rand(1, T, H)

# Prefill straight into a state pool: sequence n in slot slots[n], updated in place.
pool = torch.zeros(4, H, K, K)
slots = torch.tensor([2, 0], dtype=torch.int32)
o, final = kt.chunk_kda(q, k, v, g, beta, initial_state=pool, output_final_state=True,
                        use_qk_l2norm_in_kernel=True, cu_seqlens=cu, state_indices=slots)
assert final is pool and o.dtype == torch.bfloat16
print("prefill o", tuple(o.shape), o.dtype)


def decode(q, k, v, g, beta, pool, slots):
    o, _ = kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots,
                                      use_qk_l2norm_in_kernel=True)
    return o.float().norm()


step = [torch.randn(2, 1, H, K, dtype=torch.bfloat16) for _ in range(3)] + [-0.05 * torch.rand(2, 1, H, K),
                                                                           torch.rand(2, 1, H)]
eager_pool = pool.clone()
want = decode(*step, eager_pool, slots)
compiled = torch.compile(decode, backend="aot_eager", fullgraph=True)
got = compiled(*step, pool, slots)
torch.testing.assert_close(got, want)
torch.testing.assert_close(pool, eager_pool)  # the compiled graph updated the pool in place too
print("decode |o|", float(got), "(eager and compiled agree)")
print("ok")

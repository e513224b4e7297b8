"""kda.jax in a jitted prefill + decode loop with fla's API: the FFI kernels (or the naive fallback) on a small
batch with grouped value heads, K != V, fla's sigmoid gate and beta logits.

Run from the repository root after building the FFI library:

    cmake -S . -B build -DKDA_BUILD_XLA_FFI=ON -DPython_EXECUTABLE=$(which python) && \\
        cmake --build build --target kda_xla_ffi
    KDA_XLA_FFI_LIBRARY=build/python/xla_ffi/libkda_xla_ffi.so PYTHONPATH=python python examples/jax_example.py

(With the installed package, kda/libkda_xla_ffi.so is found without the variable.)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import kda.jax as kj

H, HV, K, V = 2, 4, 64, 32  # key heads, value heads (grouped: value head i uses key head i / 2), head dims
LENGTHS = [37, 5, 64]  # three prompts, packed
SLOTS = 8  # state pool size; slot s holds one request's state [HV, K, V]
DECODE_STEPS = 4
GATE = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, lower_bound=-5.0,  # fla's sigmoid gate
            use_beta_sigmoid_in_kernel=True)  # beta as logits


def random_tokens(key, T):
    kq, kk, kv, kg, kb = jax.random.split(key, 5)
    q = jax.random.normal(kq, (1, T, H, K))
    k = jax.random.normal(kk, (1, T, H, K))
    v = jax.random.normal(kv, (1, T, HV, V))
    g_raw = jax.random.normal(kg, (1, T, HV, K))  # the raw gate, activated in the kernel
    beta = jax.random.normal(kb, (1, T, HV))  # logits
    return q, k, v, g_raw, beta


# The pool is donated: the kernels update it in place, and the caller uses the returned pool.
@functools.partial(jax.jit, donate_argnums=0, static_argnames="kernel")
def prefill(pool, slots, cu_seqlens, q, k, v, g_raw, beta, A_log, dt_bias, kernel=None):
    return kj.chunk_kda(q, k, v, g_raw, beta, initial_state=pool, cu_seqlens=cu_seqlens, A_log=A_log,
                        dt_bias=dt_bias, state_indices=slots, kernel=kernel, **GATE)


@functools.partial(jax.jit, donate_argnums=0, static_argnames="kernel")
def decode(pool, slots, q, k, v, g_raw, beta, A_log, dt_bias, kernel=None):
    # One token per running request: q [N, 1, H, K]; slot -1 is a padding entry. vLLM's entry: the pool
    # updated in place (inplace_final_state=True, its default) and returned.
    return kj.fused_recurrent_kda_fwd(q, k, v, g_raw, beta, A_log=A_log, dt_bias=dt_bias, initial_state=pool,
                                      ssm_state_indices=slots, kernel=kernel, **GATE)


def serve(kernel):
    key = jax.random.PRNGKey(0)
    A_log = jnp.log(jnp.linspace(1.0, 16.0, HV))
    dt_bias = jnp.zeros((HV * K,))
    pool = jnp.zeros((SLOTS, HV, K, V), jnp.float32)
    slots = jnp.asarray([3, 1, 6], jnp.int32)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(LENGTHS)]), jnp.int32)
    o, pool = prefill(pool, slots, cu, *random_tokens(key, sum(LENGTHS)), A_log, dt_bias, kernel=kernel)
    outs = [o]
    decode_slots = jnp.asarray([3, -1, 6], jnp.int32)  # request 1 has finished: padding
    for step in range(DECODE_STEPS):
        q, k, v, g_raw, beta = (x.reshape((len(LENGTHS), 1) + x.shape[2:])
                                for x in random_tokens(jax.random.fold_in(key, step + 1), len(LENGTHS)))
        o, pool = decode(pool, decode_slots, q, k, v, g_raw, beta, A_log, dt_bias, kernel=kernel)
        outs.append(o)
    return outs, pool


def main():
    print("backend:", kj.backend())
    outs, pool = serve(None)
    print("prefill o:", outs[0].shape, outs[0].dtype, "| decode o:", outs[1].shape, "| pool:", pool.shape)
    print("state norms per slot:", np.round(np.linalg.norm(np.asarray(pool).reshape(SLOTS, -1), axis=1), 3))
    ref_outs, ref_pool = serve("naive")
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(outs, ref_outs))
    diff = max(diff, float(jnp.max(jnp.abs(pool - ref_pool))))
    print(f"max |{kj.backend()} - naive| over outputs and states: {diff:.2e}")
    assert diff < 1e-4, diff
    print("ok")


if __name__ == "__main__":
    main()

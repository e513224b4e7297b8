"""mamba_ssm's semantics in float64, token by token: the reference the front ends of Mamba2's SSD scan
(kda.mamba_ssm, kda.torch, kda.jax) are checked against, and their random inputs."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from golden import REPO


def project_reference():
    """tools/mamba2_ref.py by its path (../shared/tools holds an independent module of the same name)."""
    name = "kda_project_mamba2_ref"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "mamba2_ref.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def softplus(u):
    return np.where(u > 20.0, u, np.log1p(np.exp(np.minimum(u, 20.0))))


def ref_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, state=None, softplus_dt=False, limit=(0.0, np.inf),
             starts=()):
    """mamba_ssm's scan token by token in float64 over one row: x [L, H, P], dt [L, H], B, C [L, G, N]; a new
    sequence (state zeros) at every index in ``starts``. Returns (y [L, H, P], the states after each token)."""
    L, H, P = x.shape
    N = B.shape[2]
    recurrent = project_reference().recurrent  # the project's float64 selective scan, a token at a time
    s = np.zeros((H, P, N)) if state is None else np.array(state, np.float64)
    d = np.asarray(dt, np.float64) + (0.0 if dt_bias is None else np.asarray(dt_bias, np.float64))
    d = np.clip(softplus(d) if softplus_dt else d, *limit)
    y, states = np.zeros((L, H, P)), []
    for t in range(L):
        if t in starts:
            s = np.zeros((H, P, N))
        y_t, s = recurrent(x[t : t + 1], d[t : t + 1], A, B[t : t + 1], C[t : t + 1], np.zeros(H), s)
        y[t] = y_t[0]
        states.append(s.copy())
    if D is not None:
        y = y + (D[:, None] if D.ndim == 1 else D) * x
    if z is not None:
        y = y * z / (1.0 + np.exp(-z))
    return y, states


def inputs(b=2, L=37, H=4, P=8, G=2, N=16, seed=0):
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(x=f(b, L, H, P), dt=f(b, L, H), A=-np.exp(f(H) * 0.5), B=f(b, L, G, N), C=f(b, L, G, N),
                D=f(H), D2=f(H, P), z=f(b, L, H, P), dt_bias=f(H) * 0.3, init=f(b, H, P, N))


def ref_step(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus_dt=False):
    """mamba_ssm's selective_state_update in float64, the general form (dt, A per channel)."""
    s = np.array(state, np.float64)
    d = np.asarray(dt, np.float64) + (0.0 if dt_bias is None else np.asarray(dt_bias, np.float64))
    d = softplus(d) if softplus_dt else d
    b, H, P = x.shape
    G = B.shape[1]
    y = np.zeros((b, H, P))
    for i in range(b):
        for h in range(H):
            g = h // (H // G)
            s[i, h] = np.exp(d[i, h][:, None] * A[h]) * s[i, h] + (d[i, h] * x[i, h])[:, None] * B[i, g][None]
            y[i, h] = s[i, h] @ C[i, g]
    if D is not None:
        y = y + np.asarray(D) * x
    if z is not None:
        y = y * z / (1.0 + np.exp(-z))
    return y, s

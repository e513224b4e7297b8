#!/usr/bin/env python3
"""torch's F.linear on a KDA layer's projection shapes beside kda's projection rows, in one run.

Times the nine projections of one Kimi-Linear KDA layer (q/k/v fused as kda holds them, f_a, f_b,
b, g_a, g_b, o_proj; f_b and g_b on f_a's and g_a's outputs, o_proj on f_b's, as
``kda bench-kernels --only projections`` runs them) through ``torch.nn.functional.linear`` at
M = 1, 8, 64, 2048 rows, bf16 and fp32. At M <= 8 each call runs the next of enough copies of the
weights to span the bytes kda's row of that dtype and M cycles through (its ``streamed_bytes``:
past twice the last-level cache), so that they come from memory. Rounds alternate with ``kda bench-kernels --only projections --json``
run as a subprocess (a slow spell of the machine hits both); the table gives each side's median
over the rounds of its per-round median call, and kda/torch (the median of the per-round ratios).
The layer's shapes come from kda's rows (hidden, H, K).

Not part of the build; runs in the test venv (scripts/python-env.sh), which has torch:

    python=$(bash scripts/python-env.sh)/bin/python
    $python bench/torch_linear.py --kda build/kda [--rounds 5] [--threads 2] [--repeats 5] [--json]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROWS = (1, 8, 64, 2048)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def layer_shapes(hidden, heads, head_dim):
    """[out, in] of q|k|v, f_a, f_b, b, g_a, g_b, o (Hugging Face's Linear layout)."""
    p = heads * head_dim
    return [(3 * p, hidden), (head_dim, hidden), (p, head_dim), (heads, hidden), (head_dim, hidden), (p, head_dim),
            (hidden, p)]


class Projections:
    """`copies` copies of one layer's projection weights in `dtype`, run on M rows."""

    def __init__(self, shapes, rows, dtype, copies):
        gen = torch.Generator().manual_seed(7)
        self.layers = [[(torch.rand(s, generator=gen) * 0.02 - 0.01).to(dtype) for s in shapes]
                       for _ in range(copies)]
        self.x = (torch.rand((rows, shapes[0][1]), generator=gen) * 2 - 1).to(dtype)

    def step(self, i):
        qkv, f_a, f_b, b, g_a, g_b, o = self.layers[i % len(self.layers)]
        x = self.x
        F.linear(x, qkv)
        ya = F.linear(x, f_a)
        yb = F.linear(ya, f_b)
        F.linear(x, b)
        ga = F.linear(x, g_a)
        F.linear(ga, g_b)
        F.linear(yb, o)


def torch_round(problems, repeats):
    """{(weights, M): the median call in µs} over one round."""
    out = {}
    for (name, rows), p in problems.items():
        calls = max(repeats * 8, 16) if len(p.layers) > 1 else repeats  # as kda's rows
        t = []
        for i in range(calls):
            t0 = time.perf_counter()
            p.step(i)
            t.append(time.perf_counter() - t0)
        out[(name, rows)] = statistics.median(t) * 1e6
    return out


def kda_round(kda, threads, repeats):
    """kda's projection rows: ({(weights, M): µs per call}, a row for the shapes and route)."""
    cmd = [kda, "bench-kernels", "--only", "projections", "--json", "--threads", str(threads), "--repeats",
           str(repeats)]
    rows = [json.loads(line) for line in subprocess.run(cmd, check=True, capture_output=True,
                                                         text=True).stdout.splitlines() if line.startswith("{")]
    rows = [r for r in rows if r["kernel"] == "projections"]
    return {(r["weights"], int(r["M"])): r["us_per_call"] for r in rows}, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kda", default="build/kda", help="the kda CLI (default build/kda)")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds of each (>= 5 for medians)")
    ap.add_argument("--threads", type=int, default=2, help="threads of both (default 2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per row and round (M <= 8: 8x)")
    ap.add_argument("--json", action="store_true", help="one JSON object per row instead of the table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    kda_times, kda_rows = kda_round(args.kda, args.threads, args.repeats)
    first = kda_rows[0]
    shapes = layer_shapes(int(first["hidden"]), int(first["H"]), int(first["K"]))
    routes = {(r["weights"], int(r["M"])): r["gemm_route"] for r in kda_rows}
    streamed = {(r["weights"], int(r["M"])): r["streamed_bytes"] for r in kda_rows if "streamed_bytes" in r}
    problems = {}
    for name, dtype in DTYPES.items():
        for rows in ROWS:
            one = sum(o * i for o, i in shapes) * torch.tensor([], dtype=dtype).element_size()
            key = (name, rows)
            copies = max(2, -(-int(streamed[key]) // one)) if key in streamed else 1
            p = Projections(shapes, rows, dtype, copies)
            for i in range(copies):
                p.step(i)  # warm-up: one pass over the copies
            problems[(name, rows)] = p

    # kda, torch, kda, torch, ...: round r pairs kda's run r with torch's.
    kda_runs = [kda_times]
    torch_runs = []
    for r in range(args.rounds):
        torch_runs.append(torch_round(problems, args.repeats))
        if r + 1 < args.rounds:
            kda_runs.append(kda_round(args.kda, args.threads, args.repeats)[0])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    out = []
    for name in DTYPES:
        for rows in ROWS:
            key = (name, rows)
            k = [run[key] for run in kda_runs]
            t = [run[key] for run in torch_runs]
            out.append({"weights": name, "M": rows, "threads": args.threads, "rounds": args.rounds,
                        "gemm_route": routes[key], "kda_us": statistics.median(k),
                        "torch_us": statistics.median(t),
                        "kda_over_torch": statistics.median([a / b for a, b in zip(k, t)]),
                        "copies": len(problems[key].layers)})
    if args.json:
        for row in out:
            print(json.dumps(row))
        return
    print(f"torch {torch.__version__}, {args.threads} threads, medians of {args.rounds} alternated rounds; "
          f"M <= {max(m for _, m in streamed)}: weights cycled over {max(streamed.values()) / 2**20:.0f} MiB "
          "(as kda's rows)")
    print(f"{'weights':7} {'M':>5} {'route':>9} {'kda us':>10} {'torch us':>10} {'kda/torch':>9}")
    for row in out:
        print(f"{row['weights']:7} {row['M']:5d} {row['gemm_route']:>9} {row['kda_us']:10.0f} "
              f"{row['torch_us']:10.0f} {row['kda_over_torch']:9.2f}")


if __name__ == "__main__":
    main()

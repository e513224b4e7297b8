"""One KDA layer of Kimi-Linear and one Gated DeltaNet layer of Qwen3-Next as Hugging Face transformers
runs them on the CPU: kernelized with kda (kda.transformers), unkernelized (transformers' torch
fallback), and kda's own layer (`kda bench-kernels` rows), timed in the same run.

Run with the test venv (torch, transformers, kernels and kda installed; not needed by make):

    $(bash scripts/python-env.sh)/bin/python bench/transformers_layers.py --kda build/kda --threads 2

Shapes: Kimi-Linear-48B's KDA layer (hidden 2304, 32 heads x 128) and Qwen3-Next-80B's GDN layer
(hidden 2048, 16 key / 32 value heads x 128), random weights; prefill of one sequence of T tokens
(default 2048, µs per token) and a batch-1 decode step after a 64-token prompt (ms), fp32 and bf16.
kda's own layer: the `layer` (prefill, T = 2048) and `decode_layer` (batch 1, bf16 weights; kda has no
fp32 decode row) rows of `kda bench-kernels --only layer,decode`. kda has no Gated DeltaNet layer of
its own yet: for Qwen3-Next the script prints the GDN kernel rows of `kda bench-kernels --only gdn`
(the delta rule alone) instead. Medians over --repeats timed runs (the unkernelized prefill, tens of
seconds a call, over --fallback-repeats); --json prints one JSON object per row.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def kimi_layer(dtype):
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    cfg = KimiLinearConfig(hidden_size=2304, linear_num_heads=32, linear_head_dim=128, linear_conv_kernel_dim=4,
                           rms_norm_eps=1e-5, num_hidden_layers=1, layer_types=["linear_attention"],
                           mlp_layer_types=["dense"])
    layer = KimiLinearDeltaAttention(cfg, 0)
    with torch.no_grad():  # the forget gate's A_log and dt_bias are left uninitialised by the module
        gate = layer.forget_gate
        gate.A_log.copy_(torch.log(torch.empty_like(gate.A_log).uniform_(1, 16)))
        gate.dt_bias.uniform_(-1, 1)
    return cfg, layer.to(dtype).eval()


def qwen3_next_layer(dtype):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = Qwen3NextConfig(hidden_size=2048, linear_num_key_heads=16, linear_num_value_heads=32,
                          linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                          rms_norm_eps=1e-6, num_hidden_layers=1, layer_types=["linear_attention"])
    return cfg, Qwen3NextGatedDeltaNet(cfg, 0).to(dtype).eval()


MODELS = {"kimi_linear": kimi_layer, "qwen3_next": qwen3_next_layer}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_prefill(layer, x, repeats: int) -> float:
    with torch.inference_mode():
        return median_time(lambda: layer(x), repeats) / x.shape[1] * 1e6  # µs per token


def time_decode(cfg, layer, hidden: int, dtype, steps: int, prompt: int = 64) -> float:
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        cache = DynamicCache(config=cfg)
        layer(torch.randn(1, prompt, hidden, generator=g).to(dtype), cache=cache)
        xs = [torch.randn(1, 1, hidden, generator=g).to(dtype) for _ in range(steps + 1)]
        layer(xs[0], cache=cache)  # warm-up
        times = []
        for x in xs[1:]:
            t0 = time.perf_counter()
            layer(x, cache=cache)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3  # ms per step


def kda_rows(kda: str, only: str, threads: int) -> list[dict]:
    out = subprocess.run([kda, "bench-kernels", "--only", only, "--json", "--threads", str(threads)], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kda", default="build/kda", help="the kda CLI (for its bench-kernels rows); '' skips them")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048, help="prefill tokens")
    ap.add_argument("--repeats", type=int, default=3, help="timed prefill runs (kernelized)")
    ap.add_argument("--fallback-repeats", type=int, default=1, help="timed prefill runs (unkernelized)")
    ap.add_argument("--decode-steps", type=int, default=20)
    ap.add_argument("--models", default="kimi_linear,qwen3_next")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--skip-fallback", action="store_true", help="do not time the unkernelized layers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import kernels
    import transformers

    import kda
    import kda.transformers as kt

    torch.set_num_threads(args.threads)
    kda.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()  # the fallback's warning, once per function
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("kernels").setLevel(logging.ERROR)
    kt.enable()

    cpu = "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    log(f"{cpu}; {args.threads} threads; kda {kda.active_kernel()}; torch {torch.__version__}; transformers "
        f"{transformers.__version__}; kernels {kernels.__version__}; load average {os.getloadavg()[0]:.2f}")

    rows = []

    def emit(row: dict) -> None:
        if args.json:
            print(json.dumps(row), flush=True)

    for name in args.models.split(","):
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            torch.manual_seed(0)
            cfg, ref = MODELS[name](dtype)
            kern = copy.deepcopy(ref)
            kernels.kernelize(kern, device="cpu", mode=kernels.Mode.INFERENCE)
            hidden = cfg.hidden_size
            x = torch.randn(1, args.T, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
            kt.call_counts(reset=True)
            log(f"{name} {dname}: kernelized prefill")
            pk = time_prefill(kern, x, args.repeats)
            log(f"{name} {dname}: kernelized decode")
            dk = time_decode(cfg, kern, hidden, dtype, args.decode_steps)
            served = kt.call_counts(reset=True)
            if any(v["transformers"] for v in served.values()):
                raise SystemExit(f"{name} {dname}: a kernelized call went to transformers' route: {served}")
            pu = du = math.nan
            if not args.skip_fallback:
                log(f"{name} {dname}: unkernelized prefill (slow)")
                pu = time_prefill(ref, x, args.fallback_repeats)
                log(f"{name} {dname}: unkernelized decode")
                du = time_decode(cfg, ref, hidden, dtype, args.decode_steps)
            rows.append({"model": name, "dtype": dname, "T": args.T, "threads": args.threads,
                         "prefill_us_per_token_kernelized": pk, "prefill_us_per_token_unkernelized": pu,
                         "decode_ms_kernelized": dk, "decode_ms_unkernelized": du,
                         "prefill_speedup": pu / pk, "decode_speedup": du / dk})
            emit(rows[-1])

    own = {}
    gdn = []
    if args.kda:
        log("kda bench-kernels --only layer,decode (kda's own KDA layer)")
        for r in kda_rows(args.kda, "layer,decode", args.threads):
            if r.get("kernel") == "layer" and r.get("T") == args.T:
                own[("prefill", r["dtype"])] = r["us_per_token"]
            if r.get("kernel") == "decode_layer" and r.get("N") == 1 and r.get("weights") == "bf16":
                own[("decode", r["dtype"])] = r["step_us"] / 1e3
        if "qwen3_next" in args.models:
            log("kda bench-kernels --only gdn (the Gated DeltaNet kernels; kda has no GDN layer yet)")
            gdn = kda_rows(args.kda, "gdn", args.threads)

    print(f"\n{cpu}, {args.threads} threads, T = {args.T}; prefill µs/token, decode ms/step (batch 1)")
    print("| layer | dtype | kernelized prefill | unkernelized | kda's own layer | kernelized / kda | speedup over "
          "unkernelized | kernelized decode | unkernelized | kda's own layer | kernelized / kda | speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        kimi = r["model"] == "kimi_linear"
        op = own.get(("prefill", r["dtype"])) if kimi else None
        od = own.get(("decode", r["dtype"])) if kimi else None

        def f(v, fmt):
            return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

        print(f"| {r['model']} | {r['dtype']} | {f(r['prefill_us_per_token_kernelized'], '{:.0f}')} | "
              f"{f(r['prefill_us_per_token_unkernelized'], '{:.0f}')} | {f(op, '{:.0f}')} | "
              f"{f(op and r['prefill_us_per_token_kernelized'] / op, '{:.2f}x')} | {f(r['prefill_speedup'], '{:.1f}x')} | "
              f"{f(r['decode_ms_kernelized'], '{:.2f}')} | {f(r['decode_ms_unkernelized'], '{:.2f}')} | "
              f"{f(od, '{:.2f}')} | {f(od and r['decode_ms_kernelized'] / od, '{:.2f}x')} | "
              f"{f(r['decode_speedup'], '{:.1f}x')} |")
        if kimi:
            emit({"model": r["model"], "dtype": r["dtype"], "kda_layer_prefill_us_per_token": op,
                  "kda_layer_decode_ms": od})
    if "qwen3_next" in args.models:
        print("\nqwen3_next: kda has no Gated DeltaNet layer of its own yet; its GDN kernel rows (the delta rule "
              "alone, Qwen3-Next's heads):")
        for r in gdn:
            keys = ("kernel", "dtype", "T", "N", "us_per_token", "step_us")
            print("  " + ", ".join(f"{k} {r[k]:.1f}" if isinstance(r.get(k), float) else f"{k} {r.get(k)}"
                                   for k in keys if k in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

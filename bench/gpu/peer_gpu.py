#!/usr/bin/env python3
"""GPU peers for kiln's CUDA benchmark: PyTorch eager, torch.compile and CuPy on the peer kit's
workloads W1-W4 (../shared/bench-peers/README.md) and kiln's row workloads LN and CE
(bench/peers/workloads.h), one line per (workload, n) in the kit's format:

  peer=torch-cuda-eager workload=W1 n=16777216 ns_per_elem=0.0042 gbps=3800 threads=1 reps=...

Self-contained (the kit's common.py is CPU/numpy-bound): same formulas, input ranges and Adam
constants; timing = warm-up, then individually timed calls each ending in a device
synchronisation, median reported. A peer whose library is missing prints a `# skip` line and
the others still run; the exit status is non-zero only when a correctness check fails.

Usage: peer_gpu.py [--peers torch,compile,cupy] [--workloads W1,W2,W3,W4,LN,CE] [--sizes 16777216,...]
(CuPy runs W1-W4 only.)
"""
import argparse
import math
import os
import sys
import time

BYTES = {"W1": 16, "W2": 8, "W3": 28, "W4": 8, "LN": 8, "CE": 8}
ROW = 1024
LR, BETA1, BETA2, EPS, STEP = 1e-3, 0.9, 0.999, 1e-8, 10
BC1 = 1.0 - BETA1 ** STEP
BC2 = 1.0 - BETA2 ** STEP
STEP_SIZE = LR / BC1
BC2_SQRT = math.sqrt(BC2)
RANGES = {"W1": dict(a=(-1, 1), b=(-1, 1), c=(-1, 1)), "W2": dict(x=(-3, 3)),
          "W3": dict(p=(-2, 2), g=(-2e-2, 2e-2), m=(-2e-3, 2e-3), v=(1e-6, 1e-4)), "W4": dict(x=(-4, 4)),
          "LN": dict(x=(-4, 4)), "CE": dict(x=(-4, 4))}
LN_EPS = 1e-5
ROWS = ("W4", "LN", "CE")  # workloads over rows of ROW

TARGET_S = float(os.environ.get("BENCH_TARGET_S", "0.4"))
WARMUP_S = float(os.environ.get("BENCH_WARMUP_S", "0.1"))
MIN_REPS = int(os.environ.get("BENCH_MIN_REPS", "7"))
MAX_REPS = int(os.environ.get("BENCH_MAX_REPS", "3000"))


def emit(peer, workload, n, ts, extra=""):
    ts = sorted(ts)
    r = len(ts)
    med = ts[r // 2] if r % 2 else 0.5 * (ts[r // 2 - 1] + ts[r // 2])
    ns = med / n
    p90 = ts[min(r - 1, math.ceil(0.9 * r) - 1)] / n
    pas = os.environ.get("BENCH_PASS")
    print(f"peer={peer} workload={workload} n={n} ns_per_elem={ns:.4g} gbps={BYTES[workload] / ns:.2f} threads=1 "
          f"reps={r} min_ns_per_elem={ts[0] / n:.4g} p90_ns_per_elem={p90:.4g}{extra}"
          + (f" pass={pas}" if pas else ""), flush=True)


def time_calls(call, sync):
    # The first calls (compilation, allocator warm-up) are not timed.
    for _ in range(2):
        call()
    sync()
    t0 = time.perf_counter()
    k = 0
    while k < 2 or (time.perf_counter() - t0 < WARMUP_S and k < 1000):
        call()
        sync()
        k += 1
    est = (time.perf_counter() - t0) / k
    reps = int(min(MAX_REPS, max(MIN_REPS, TARGET_S / max(est, 1e-9))))
    ts = []
    for _ in range(reps):
        s = time.perf_counter_ns()
        call()
        sync()
        ts.append(time.perf_counter_ns() - s)
    return ts


# ------------------------------------------------------------------------------------ torch
def torch_workloads(torch):
    def w1(a, b, c, y):
        torch.exp(a * b + c * 2.0, out=y)

    def w2(x, y):
        t = x * 1.5 + 0.5
        torch.sqrt(torch.abs(torch.tanh(torch.sigmoid(t) * x - 0.25)), out=y)

    def w3(p, g, m, v):
        # torch.optim.Adam's single-tensor step, as the kit's CPU torch peer.
        m.mul_(BETA1).add_(g, alpha=1 - BETA1)
        v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
        denom = (v.sqrt() / BC2_SQRT).add_(EPS)
        p.addcdiv_(m, denom, value=-STEP_SIZE)

    def w4(x, y):
        torch._softmax(x, -1, False, out=y)

    return {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "LN": row_workloads(torch)["LN"], "CE": row_workloads(torch)["CE"]}


def row_workloads(torch):
    # What a PyTorch user runs for kiln's LN and CE (bench/peers/workloads.h): F.layer_norm with
    # weight and bias; F.cross_entropy with probability targets, one loss per row.
    import torch.nn.functional as F

    def ln(x, g, b):
        return F.layer_norm(x, (ROW,), g, b, LN_EPS)

    def ce(x, t):
        return F.cross_entropy(x, t, reduction="none")

    return {"LN": ln, "CE": ce}


def torch_compiled(torch):
    # Functional forms for torch.compile (out= arguments do not trace well); W3 mutates its
    # state in place, which torch.compile supports.
    def w1(a, b, c):
        return torch.exp(a * b + c * 2.0)

    def w2(x):
        t = x * 1.5 + 0.5
        return torch.sqrt(torch.abs(torch.tanh(torch.sigmoid(t) * x - 0.25)))

    def w3(p, g, m, v):
        m.mul_(BETA1).add_(g, alpha=1 - BETA1)
        v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
        denom = (v.sqrt() / BC2_SQRT).add_(EPS)
        p.addcdiv_(m, denom, value=-STEP_SIZE)

    def w4(x):
        return torch.softmax(x, -1)

    fns = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, **row_workloads(torch)}
    return {k: torch.compile(f, dynamic=False) for k, f in fns.items()}


def torch_inputs(torch, w, n, seed=1234):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, (lo, hi) in RANGES[w].items():
        out[name] = torch.rand(n, device="cuda", generator=g, dtype=torch.float32) * (hi - lo) + lo
    if w in ROWS:
        out["x"] = out["x"].reshape(n // ROW, ROW)
    if w == "LN":
        out["g"] = torch.rand(ROW, device="cuda", generator=g) + 0.5
        out["b"] = torch.rand(ROW, device="cuda", generator=g) - 0.5
    if w == "CE":  # one-hot probability targets, class r * 7919 mod ROW (workloads.h)
        rows = n // ROW
        out["t"] = torch.zeros(rows, ROW, device="cuda")
        cls = (torch.arange(rows, device="cuda", dtype=torch.int64) * 7919) % ROW
        out["t"][torch.arange(rows, device="cuda"), cls] = 1.0
    return out


def torch_reference(torch, w, inp):
    d = {k: v.double() for k, v in inp.items()}
    if w == "W1":
        return torch.exp(d["a"] * d["b"] + d["c"] * 2.0)
    if w == "W2":
        x = d["x"]
        return torch.sqrt(torch.abs(torch.tanh(torch.sigmoid(x * 1.5 + 0.5) * x - 0.25)))
    if w == "W3":
        m = BETA1 * d["m"] + (1 - BETA1) * d["g"]
        v = BETA2 * d["v"] + (1 - BETA2) * d["g"] * d["g"]
        return d["p"] - STEP_SIZE * m / (torch.sqrt(v) / BC2_SQRT + EPS)
    if w == "LN":
        x = d["x"]
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + LN_EPS) * d["g"] + d["b"]
    if w == "CE":
        return -(d["t"] * torch.log_softmax(d["x"], -1)).sum(-1)
    return torch.softmax(d["x"], -1)


def run_torch(args, compiled):
    peer = "torch-cuda-compile" if compiled else "torch-cuda-eager"
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no peer"
        print(f"# skip peer={peer}: torch is not importable ({e.__class__.__name__}: {e})", flush=True)
        return True
    if not torch.cuda.is_available():
        print(f"# skip peer={peer}: torch {torch.__version__} sees no CUDA device", flush=True)
        return True
    print(f"# {peer} torch={torch.__version__} cuda={torch.version.cuda} device={torch.cuda.get_device_name(0)}",
          flush=True)
    try:
        fns = torch_compiled(torch) if compiled else torch_workloads(torch)
    except Exception as e:  # noqa: BLE001
        print(f"# skip peer={peer}: {e.__class__.__name__}: {e}", flush=True)
        return True
    ok_all = True
    for w in args.workloads:
        for i, n in enumerate(args.sizes):
            inp = torch_inputs(torch, w, n)
            y = torch.empty_like(inp["x"] if "x" in inp else inp["a"]) if w != "W3" else None
            f = fns[w]
            if w in ("LN", "CE"):  # functional in both modes: the result is the call's value
                names = ("x", "g", "b") if w == "LN" else ("x", "t")
                call = lambda: f(*(inp[k] for k in names))  # noqa: E731
            elif compiled:
                if w == "W3":
                    call = lambda: f(inp["p"], inp["g"], inp["m"], inp["v"])  # noqa: E731
                elif w == "W1":
                    call = lambda: f(inp["a"], inp["b"], inp["c"])  # noqa: E731
                else:
                    call = lambda: f(inp["x"])  # noqa: E731
            else:
                if w == "W3":
                    call = lambda: f(inp["p"], inp["g"], inp["m"], inp["v"])  # noqa: E731
                elif w == "W1":
                    call = lambda: f(inp["a"], inp["b"], inp["c"], y)  # noqa: E731
                else:
                    call = lambda: f(inp["x"], y)  # noqa: E731
            if i == 0:  # correctness at the smallest size, on fresh inputs
                ref = torch_reference(torch, w, inp)
                got = call()
                if w == "W3":
                    got = inp["p"]
                elif not compiled and w not in ("LN", "CE"):
                    got = y
                if w == "W2":
                    # sqrt(|t|) near t = 0 turns an f32 rounding of t into ~sqrt(ulp) of absolute
                    # error: absolute, with kiln's own W2 bound (bench/peers/workloads.h).
                    err = (got.double() - ref).abs().max().item()
                    ok = err < 2e-3
                else:
                    # The row workloads' bound is relative to max(1, |ref|), as kiln's own check.
                    floor = 1.0 if w in ("LN", "CE") else 1e-6
                    err = ((got.double() - ref).abs() / ref.abs().clamp_min(floor)).max().item()
                    ok = err < 1e-4
                ok_all &= ok
                print(f"# check peer={peer} workload={w} n={n} max_err={err:.3g} ok={int(ok)}", flush=True)
                inp = torch_inputs(torch, w, n)
            try:
                ts = time_calls(call, torch.cuda.synchronize)
            except Exception as e:  # noqa: BLE001 - e.g. a torch.compile failure on this build
                print(f"# skip peer={peer} workload={w} n={n}: {e.__class__.__name__}: {str(e)[:200]}", flush=True)
                break
            emit(peer, w, n, ts)
            del inp, y
            torch.cuda.empty_cache()
    return ok_all


# ------------------------------------------------------------------------------------- cupy
def run_cupy(args):
    peer = "cupy"
    try:
        import cupy as cp
    except Exception as e:  # noqa: BLE001
        print(f"# skip peer={peer}: cupy is not importable ({e.__class__.__name__}: {e})", flush=True)
        return True
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        print(f"# skip peer={peer}: no CUDA device for cupy ({e})", flush=True)
        return True
    print(f"# {peer} cupy={cp.__version__}", flush=True)
    f32 = cp.float32

    @cp.fuse()
    def w1_fused(a, b, c):
        return cp.exp(a * b + c * f32(2.0))

    @cp.fuse()
    def w2_fused(x):
        t = x * f32(1.5) + f32(0.5)
        s = f32(1.0) / (f32(1.0) + cp.exp(-t))
        return cp.sqrt(cp.abs(cp.tanh(s * x - f32(0.25))))

    def w3(p, g, m, v):
        m *= f32(BETA1)
        m += f32(1 - BETA1) * g
        v *= f32(BETA2)
        v += f32(1 - BETA2) * g * g
        p -= f32(STEP_SIZE) * m / (cp.sqrt(v) / f32(BC2_SQRT) + f32(EPS))

    def w4(x, y):
        e = cp.exp(x - x.max(axis=-1, keepdims=True))
        cp.divide(e, e.sum(axis=-1, keepdims=True), out=y)

    def inputs(w, n):
        rng = cp.random.default_rng(1234)
        out = {k: (rng.random(n, dtype=cp.float32) * f32(hi - lo) + f32(lo)) for k, (lo, hi) in RANGES[w].items()}
        if w == "W4":
            out["x"] = out["x"].reshape(n // ROW, ROW)
        return out

    sync = cp.cuda.Device().synchronize
    for w in args.workloads:
        if w not in RANGES or w in ("LN", "CE"):
            print(f"# skip peer={peer} workload={w}: not written for CuPy", flush=True)
            continue
        for n in args.sizes:
            inp = inputs(w, n)
            if w == "W1":
                call = lambda: w1_fused(inp["a"], inp["b"], inp["c"])  # noqa: E731
            elif w == "W2":
                call = lambda: w2_fused(inp["x"])  # noqa: E731
            elif w == "W3":
                call = lambda: w3(inp["p"], inp["g"], inp["m"], inp["v"])  # noqa: E731
            else:
                y = cp.empty_like(inp["x"])
                call = lambda: w4(inp["x"], y)  # noqa: E731
            emit(peer, w, n, time_calls(call, sync), " fused=cupy.fuse" if w in ("W1", "W2") else " fused=eager")
            del inp
            cp.get_default_memory_pool().free_all_blocks()
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default="torch,compile,cupy")
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--sizes", default=",".join(str(1 << k) for k in range(24, 29)))
    args = ap.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    ok = True
    for p in args.peers.split(","):
        if p == "torch":
            ok &= run_torch(args, compiled=False)
        elif p == "compile":
            ok &= run_torch(args, compiled=True)
        elif p == "cupy":
            ok &= run_cupy(args)
        elif p:
            print(f"# unknown peer {p}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

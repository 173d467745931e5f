"""PyTorch CPU peer for kiln's row workloads beyond the kit (bench/peers/workloads.h): LN and CE
over rows of 1024, plus the kit's W4 for reference, timed with the project venv's PyTorch (the
pinned release, not the kit's Debian 1.13). Prints the kit's line format:

  peer=torch-<version> workload=LN n=<elements> ns_per_elem=<median> gbps=<useful GB/s> threads=<t> ...

LN is torch.nn.functional.layer_norm (one ATen kernel) into a preallocated output; CE is
torch.nn.functional.cross_entropy with probability targets and reduction='none' (log_softmax,
then the weighted sum); W4 is torch._softmax into a preallocated output. Each line's value is
checked against float64 first.

usage: .venv/bin/python bench/peers/peer_rows.py [--workloads LN,CE,W4] [--sizes 1048576,16777216]
                                                  [--threads 1,2]
"""
import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

ROW = 1024
EPS = 1e-5


def inputs(workload, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, n).astype(np.float32).reshape(n // ROW, ROW)
    if workload == "LN":
        g = rng.uniform(0.5, 1.5, ROW).astype(np.float32)
        b = rng.uniform(-0.5, 0.5, ROW).astype(np.float32)
        return dict(x=x, g=g, b=b)
    if workload == "CE":
        t = np.zeros_like(x)
        rows = np.arange(n // ROW)
        t[rows, (rows * 7919) % ROW] = 1.0
        return dict(x=x, t=t)
    return dict(x=x)


def reference(workload, d):
    x = d["x"].astype(np.float64)
    if workload == "LN":
        mean = x.mean(axis=1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
        return (x - mean) / np.sqrt(var + EPS) * d["g"] + d["b"]
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1, keepdims=True)) + m
    if workload == "CE":
        return -(d["t"] * (x - lse)).sum(axis=1)
    return np.exp(x - lse)


def kernel(workload, d):
    x = torch.from_numpy(d["x"])
    if workload == "LN":  # layer_norm has no out=: its output is a fresh tensor each call
        g, b = torch.from_numpy(d["g"]), torch.from_numpy(d["b"])
        return lambda: F.layer_norm(x, (ROW,), g, b, EPS)
    if workload == "CE":
        t = torch.from_numpy(d["t"])
        return lambda: F.cross_entropy(x, t, reduction="none")
    y = torch.empty_like(x)
    return lambda: torch._softmax(x, -1, False, out=y)


def measure(f, n, target_s=0.5, min_reps=5, max_reps=3000):
    f()
    f()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < target_s and len(times) < max_reps):
        t0 = time.perf_counter_ns()
        f()
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return statistics.median(times) / n, times[0] / n, times[int(0.9 * (len(times) - 1))] / n, len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="LN,CE,W4")
    ap.add_argument("--sizes", default=f"{1 << 20},{1 << 24}")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    peer = "torch-" + torch.__version__.split("+")[0]
    for w in args.workloads.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            d = inputs(w, n, 1234)
            for t in (int(s) for s in args.threads.split(",")):
                torch.set_num_threads(t)
                f = kernel(w, d)
                got = f().numpy().astype(np.float64)
                want = reference(w, d)
                err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
                print(f"# check peer={peer} workload={w} n={n} threads={t} max_err={err:.3g} ok={int(err < 1e-4)}")
                med, lo, p90, reps = measure(f, n)
                print(f"peer={peer} workload={w} n={n} ns_per_elem={med:.4g} gbps={8 / med:.2f} threads={t} "
                      f"reps={reps} min_ns_per_elem={lo:.4g} p90_ns_per_elem={p90:.4g}", flush=True)


if __name__ == "__main__":
    main()

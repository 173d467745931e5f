#!/usr/bin/env python3
"""The layers real models spend their time in: kiln's fast CPU paths against PyTorch's CPU
kernels, side by side in one run (issue 21, "Benchmarks").

    bench/layers/run.sh [options]                         # the release build, the project venv
    .venv/bin/python bench/layers/bench_layers.py --kiln-path build/release/python [options]

kiln runs each op through its PyTorch device (in process: the `Session`, the fusion stream and
the fast CPU executor; the op is queued, then `kiln.synchronize()` waits for it), PyTorch through
its own CPU kernels (oneDNN / ATen), from the same inputs. At these sizes an op takes milliseconds
and the device's host cost (a few microseconds per op) is noise.

Workloads (f32; the shapes a ResNet or a transformer layer trains with):
  conv2d_fwd     x [32, 64, 56, 56], w [64, 64, 3, 3], padding 1          (aten::convolution)
  conv2d_bwd     the X and W gradients of that convolution                 (aten::convolution_backward)
  maxpool_fwd    x [32, 64, 112, 112], 3x3, stride 2, padding 1, indices   (aten::max_pool2d_with_indices)
  maxpool_bwd    its gradient into x                                       (..._backward)
  layernorm_fwd  x [4096, 1024] over the last dim, affine                  (aten::native_layer_norm)
  layernorm_bwd  the x, weight and bias gradients                          (..._backward)
  batchnorm_eval x [32, 64, 56, 56], running statistics, affine (inference) (aten::native_batch_norm)
  embedding_bwd  4096 indices into 32000 x 512                             (aten::embedding_dense_backward)
  sort           x [256, 4096] along the last dim, values and indices      (aten::sort)

Each thread count (--threads, default 1,2) runs in a Python process of its own, pinned to that
many cores (os.sched_setaffinity before torch starts a thread; kiln's kernels use the cores the
process may run on), with torch.set_num_threads(t), OMP_NUM_THREADS=t and KILN_RUNTIME_THREADS=t.
In it, every workload runs once on each side untimed (kiln's first call compiles and caches), its
results are compared (a `# check` line: kiln's outputs against PyTorch's, within a matmul's
tolerance for the convolutions), then --reps timed calls alternate between the two sides.

Output: the peer kit's line format (../shared/bench-peers/README.md), n = the elements of the
workload's main output (ns_per_elem = the median call's time / n):

  peer=kiln workload=conv2d_fwd n=6422528 ns_per_elem=... gbps=0 threads=1 reps=... ms=... [keys]

and one `# target` line per workload and thread count: kiln / PyTorch on the medians, against the
issue's targets (convolutions within 1.5x; pooling, layer norm and embedding backward at or below
1.0x; batch norm and sort are reported without a target).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TARGETS = {"conv2d_fwd": 1.5, "conv2d_bwd": 1.5, "maxpool_fwd": 1.0, "maxpool_bwd": 1.0, "layernorm_fwd": 1.0,
           "layernorm_bwd": 1.0, "embedding_bwd": 1.0}
WORKLOADS = ("conv2d_fwd", "conv2d_bwd", "maxpool_fwd", "maxpool_bwd", "layernorm_fwd", "layernorm_bwd",
             "batchnorm_eval", "embedding_bwd", "sort")


def make_workload(name, torch, quick):
    """(inputs as a dict of CPU tensors, fn(inputs) -> tuple of outputs, n, tolerance)."""
    g = torch.Generator().manual_seed(0)
    aten = torch.ops.aten
    batch = 4 if quick else 32
    if name.startswith("conv2d"):
        x = torch.randn(batch, 64, 56, 56, generator=g)
        w = torch.randn(64, 64, 3, 3, generator=g) * 0.05
        if name == "conv2d_fwd":
            return {"x": x, "w": w}, lambda t: (aten.convolution(t["x"], t["w"], None, [1, 1], [1, 1], [1, 1], False,
                                                                 [0, 0], 1),), x.numel(), 2e-4
        gy = torch.randn(batch, 64, 56, 56, generator=g)
        return ({"gy": gy, "x": x, "w": w},
                lambda t: aten.convolution_backward(t["gy"], t["x"], t["w"], None, [1, 1], [1, 1], [1, 1], False,
                                                    [0, 0], 1, [True, True, False])[:2], x.numel(), 2e-4)
    if name.startswith("maxpool"):
        x = torch.randn(batch, 64, 112, 112, generator=g)
        args = ([3, 3], [2, 2], [1, 1], [1, 1], False)
        if name == "maxpool_fwd":
            return {"x": x}, lambda t: aten.max_pool2d_with_indices(t["x"], *args), x.numel() // 4, 0.0
        _, idx = aten.max_pool2d_with_indices(x, *args)
        gy = torch.randn(idx.shape, generator=g)
        return ({"gy": gy, "x": x, "idx": idx},
                lambda t: (aten.max_pool2d_with_indices_backward(t["gy"], t["x"], *args, t["idx"]),), x.numel(), 1e-6)
    if name.startswith("layernorm"):
        rows = 512 if quick else 4096
        x = torch.randn(rows, 1024, generator=g)
        w = torch.rand(1024, generator=g) + 0.5
        b = torch.randn(1024, generator=g)
        if name == "layernorm_fwd":
            return {"x": x, "w": w, "b": b}, lambda t: aten.native_layer_norm(t["x"], [1024], t["w"], t["b"], 1e-5), \
                x.numel(), 1e-4
        _, mean, rstd = aten.native_layer_norm(x, [1024], w, b, 1e-5)
        gy = torch.randn(rows, 1024, generator=g)
        return ({"gy": gy, "x": x, "mean": mean, "rstd": rstd, "w": w, "b": b},
                lambda t: aten.native_layer_norm_backward(t["gy"], t["x"], [1024], t["mean"], t["rstd"], t["w"],
                                                          t["b"], [True, True, True]), x.numel(), 1e-3)
    if name == "batchnorm_eval":
        x = torch.randn(batch, 64, 56, 56, generator=g)
        stats = {"w": torch.rand(64, generator=g) + 0.5, "b": torch.randn(64, generator=g),
                 "mean": torch.randn(64, generator=g), "var": torch.rand(64, generator=g) + 0.5}
        return dict(stats, x=x), lambda t: aten.native_batch_norm(t["x"], t["w"], t["b"], t["mean"], t["var"], False,
                                                                   0.1, 1e-5)[:1], x.numel(), 1e-5
    if name == "embedding_bwd":
        count = 512 if quick else 4096
        idx = torch.randint(0, 32000, (count,), generator=g)
        gy = torch.randn(count, 512, generator=g)
        return {"gy": gy, "idx": idx}, lambda t: (aten.embedding_dense_backward(t["gy"], t["idx"], 32000, -1,
                                                                                False),), gy.numel(), 1e-5
    if name == "sort":
        x = torch.randn(32 if quick else 256, 4096, generator=g)
        return {"x": x}, lambda t: tuple(torch.sort(t["x"], dim=-1)), x.numel(), 0.0
    raise ValueError(name)


def max_error(kiln_out, cpu_out, inputs):
    """The largest |kiln - cpu| relative to 1 + max |cpu| over the outputs (indices compared exactly;
    sort's indices through the values they pick, since PyTorch's default sort may order ties
    either way)."""
    worst = 0.0
    for k, c in zip(kiln_out, cpu_out):
        k = k.cpu()
        if not c.is_floating_point() and "x" in inputs and k.shape == inputs["x"].shape:
            picked = inputs["x"].gather(-1, k)
            worst = max(worst, float((picked != cpu_out[0]).sum()))
            continue
        if not c.is_floating_point():
            worst = max(worst, float((k != c).sum()))
            continue
        worst = max(worst, float((k - c).abs().max()) / (1.0 + float(c.abs().max())))
    return worst


def worker(args):
    cores = sorted(os.sched_getaffinity(0))
    if not args.no_pin and args.threads < len(cores):
        cores = cores[:args.threads]
        os.sched_setaffinity(0, cores)
    import torch
    torch.set_num_threads(args.threads)
    import kiln
    out = {"cores": cores, "torch_threads": torch.get_num_threads(), "workloads": {}}
    for name in args.workloads:
        inputs, fn, n, tol = make_workload(name, torch, args.quick)
        on_kiln = {k: v.to("kiln") for k, v in inputs.items()}
        kiln.synchronize()

        def call(side):
            t = on_kiln if side == "kiln" else inputs
            start = time.perf_counter()
            result = fn(t)
            if side == "kiln":
                kiln.synchronize()
            return time.perf_counter() - start, result

        _, cpu_result = call("cpu")
        _, kiln_result = call("kiln")
        error = max_error(kiln_result, cpu_result, inputs)
        del kiln_result, cpu_result
        times = {"kiln": [], "cpu": []}
        for r in range(args.reps):
            for side in (("kiln", "cpu") if r % 2 == 0 else ("cpu", "kiln")):
                seconds, result = call(side)
                del result
                times[side].append(seconds)
        out["workloads"][name] = {"n": n, "times": times, "error": error, "tol": tol}
        del on_kiln
    out["fallbacks"] = sum(kiln.stats().values())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln-path", help="the folder holding the kiln package (a build's python/ folder)")
    ap.add_argument("--python", default=sys.executable, help="the Python with torch")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", "7")))
    ap.add_argument("--quick", action="store_true", help="small shapes, 2 reps: a smoke run, not a benchmark")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    for w in args.workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    if args.quick:
        args.reps = min(args.reps, 2)
    if args.worker:
        args.threads = int(args.threads)
        print(json.dumps(worker(args)), flush=True)
        return 0

    print(f"# meta bench=layers python={args.python} kiln_path={args.kiln_path} reps={args.reps} "
          f"quick={int(args.quick)} date={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", flush=True)
    failed = 0
    for threads in [int(t) for t in args.threads.split(",") if t]:
        cmd = [args.python, os.path.abspath(__file__), "--worker", "--threads", str(threads), "--reps",
               str(args.reps), "--workloads", ",".join(args.workloads)] + \
              (["--quick"] if args.quick else []) + (["--no-pin"] if args.no_pin else [])
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), KILN_RUNTIME_THREADS=str(threads))
        if args.kiln_path:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.kiln_path, env.get("PYTHONPATH")]))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
            failed += 1
            print(f"# error threads={threads}: exit {proc.returncode}; its last output:", flush=True)
            for text in (proc.stdout + proc.stderr).strip().splitlines()[-15:]:
                print(f"#   {text}", flush=True)
            continue
        result = json.loads(lines[-1])
        keys = f"cores={','.join(map(str, result['cores']))} torch_threads={result['torch_threads']} " \
               f"kiln_runtime_threads={threads} fallbacks={result['fallbacks']}"
        for name, w in result["workloads"].items():
            medians = {}
            for side, peer in (("kiln", "kiln"), ("cpu", "torch-cpu")):
                times = sorted(t * 1e9 for t in w["times"][side])
                median = statistics.median(times)
                medians[side] = median
                print(f"peer={peer} workload={name} n={w['n']} ns_per_elem={median / w['n']:.4g} gbps=0 "
                      f"threads={threads} reps={len(times)} min_ns_per_elem={times[0] / w['n']:.4g} "
                      f"ms={median / 1e6:.4g} {keys}", flush=True)
            ok = w["error"] <= w["tol"]
            failed += not ok
            print(f"# check workload={name} threads={threads} max_rel_error={w['error']:.3g} tol={w['tol']} "
                  f"ok={int(ok)}", flush=True)
            ratio = medians["kiln"] / medians["cpu"]
            target = f" max={TARGETS[name]} met={int(ratio <= TARGETS[name])}" if name in TARGETS else " max=none"
            print(f"# target workload={name} threads={threads} ratio=kiln/torch-cpu value={ratio:.3g}{target}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

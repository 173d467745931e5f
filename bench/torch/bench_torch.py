#!/usr/bin/env python3
"""kiln as a PyTorch device against PyTorch's own CPU paths, side by side in one run (issue 23).

    bench/torch/run.sh [options]                     # the release build, the project venv
    .venv/bin/python bench/torch/bench_torch.py --kiln-path build/release/python [options]

Two parts, each at every thread count of --threads (default 1,2):

  train  one training step of examples/torch/gpt.py and cnn.py (the examples' models, optimizers
         and batches; the batches are made before the clock starts): kiln (in process) against
         PyTorch CPU eager and torch.compile (inductor, CPU; the model compiled, the optimizer
         eager). Every (variant, model, threads) runs in a Python process of its own, --rounds
         times, the variants alternating (ABC BCA CAB ...) so that the shared machine's slow
         minutes fall on all of them. A process runs --warmup steps, then --steps timed steps
         (each ends with `loss.item()`, as the examples' loop does); the line reports the median
         over all rounds' timed steps. Before the rounds, one untimed kiln process per model and
         thread count fills kiln's JIT disk cache: after a new build the first processes compile
         kernels while they run, and their rounds were up to twice as slow as the later ones.
  host   the host cost of one small aten op (add of two 4-float tensors): from C++ with
         torch.ops.kiln.bench_add (an at::add loop; on kiln the ops are queued, not executed; the
         same loop on CPU tensors is CPU eager dispatch), and from Python (`a + b`, timeit-style).
         The kiln and CPU loops alternate in one process; kiln is synchronized between repeats.

Threads: a run "with t threads" pins its process to t of the cores it may use
(os.sched_setaffinity, before torch starts any thread; --no-pin leaves the mask alone), sets
torch.set_num_threads(t) and OMP_NUM_THREADS=t (inductor's kernels take torch's count at compile
time), and KILN_RUNTIME_THREADS=t (kiln's pool threads running the stream actors). kiln's CPU
kernels use as many workers as the process has cores (runtime::usable_cores(), the affinity mask):
there is no separate knob, so the pin is what limits them. Every line states what was set.

Output: the peer kit's line format (../shared/bench-peers/README.md), first six keys fixed:

  peer=kiln workload=gpt_step n=128 ns_per_elem=... gbps=0 threads=1 [extra keys]

See bench/torch/README.md for what each line means and the targets (`# target` lines).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "examples", "torch")

VARIANTS = ("kiln", "eager", "compile")
PEER = {"kiln": "kiln", "eager": "torch-eager", "compile": "torch-compile"}
MODELS = ("gpt", "cnn")
# Issue 23's targets: (workload, numerator peer, denominator peer, largest ratio).
STEP_TARGETS = (("gpt_step", "kiln", "torch-eager", 1.0), ("gpt_step", "kiln", "torch-compile", 1.5),
                ("cnn_step", "kiln", "torch-eager", 1.2))
HOST_TARGET_US = 2.0  # one small op queued on kiln from C++
FAILED = []  # the workers that failed (main exits 1 when there is one)


# --------------------------------------------------------------------------------- workers
def pin(threads, no_pin):
    """Restricts this process to `threads` of its cores (before torch starts threads); returns them."""
    cores = sorted(os.sched_getaffinity(0))
    if not no_pin and threads < len(cores):
        cores = cores[:threads]
        os.sched_setaffinity(0, cores)
    return cores


def parse_options(text):
    """'batch=8,context=16' -> {'batch': 8, 'context': 16} (ints, else floats)."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        key, value = item.split("=", 1)
        out[key] = float(value) if any(c in value for c in ".e") else int(value)
    return out


def gpt_setup(device, options, count, seed=0):
    """The model, optimizer and `count` CPU batches of examples/torch/gpt.py's train()."""
    import torch
    import gpt
    o = dict(batch=8, context=16, layers=2, width=32, heads=4, lr=3e-3)
    o.update(options)
    data, vocab = gpt.load_text()
    model = gpt.build_model(len(vocab), o["context"], o["layers"], o["width"], o["heads"], seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed + 1)
    batches = [gpt.get_batch(data, o["batch"], o["context"], generator) for _ in range(count)]
    return model, opt, batches, o["batch"] * o["context"], "tokens", o


def cnn_setup(device, options, count, seed=0):
    """The model, optimizer and `count` CPU batches of examples/torch/cnn.py's train()."""
    import torch
    import cnn
    o = dict(batch=16, size=16, channels=8, noise=1.0, lr=0.05, momentum=0.9)
    o.update(options)
    model = cnn.build_model(o["size"], o["channels"], seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"])
    generator = torch.Generator().manual_seed(seed + 1)
    batches = [cnn.make_images(o["batch"], o["size"], generator, o["noise"]) for _ in range(count)]
    return model, opt, batches, o["batch"], "images", o


def train_worker(args):
    cores = pin(args.threads, args.no_pin)
    sys.path.insert(0, EXAMPLES)
    import torch
    import torch.nn.functional as F
    import example_common
    torch.set_num_threads(args.threads)
    device = example_common.device("kiln" if args.variant == "kiln" else "cpu")
    if args.variant == "kiln":
        import kiln
        kiln.reset_stats()
    setup = gpt_setup if args.model == "gpt" else cnn_setup
    options = parse_options(args.gpt if args.model == "gpt" else args.cnn)
    model, opt, batches, items, unit, used = setup(device, options, args.warmup + args.steps)
    forward = torch.compile(model) if args.variant == "compile" else model
    feed = iter(batches)

    def step():
        x, y = next(feed)
        x, y = x.to(device), y.to(device)
        if args.model == "gpt":
            _, loss = forward(x, y)
        else:
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.sync and args.variant == "kiln":
            kiln.synchronize()
        return loss

    warm, timed = [], []
    losses = example_common.train_steps(args.warmup, step, items, unit, 0, warm)
    losses += example_common.train_steps(args.steps, step, items, unit, 0, timed)
    return {
        "cores": cores, "torch_threads": torch.get_num_threads(), "items": items, "unit": unit, "options": used,
        "first_step_s": warm[0] if warm else None, "times": timed, "losses": losses,
        "fallbacks": sum(kiln.stats().values()) if args.variant == "kiln" else 0,
    }


def host_worker(args):
    """C++ and Python loops of one add of 4 floats, kiln and CPU alternating; ns per op of each repeat."""
    cores = pin(args.threads, args.no_pin)
    import timeit
    import torch
    import kiln
    torch.set_num_threads(args.threads)
    a, b = torch.randn(4), torch.randn(4)
    ka, kb = a.to("kiln"), b.to("kiln")
    kiln.synchronize()
    bench_add = torch.ops.kiln.bench_add
    n = args.host_calls
    out = {"cores": cores, "torch_threads": torch.get_num_threads(), "calls": n}
    for key in ("kiln_cpp", "eager_cpp", "kiln_py", "eager_py", "kiln_cpp_cpu", "eager_cpp_cpu"):
        out[key] = []
    py = {"eager": timeit.Timer("a + b", globals={"a": a, "b": b}),
          "kiln": timeit.Timer("a + b", globals={"a": ka, "b": kb})}
    py["kiln"].timeit(number=min(n, 100))  # warm-up, as bench_add's own first call
    py["eager"].timeit(number=min(n, 100))
    kiln.synchronize()
    for _ in range(args.host_repeats):
        for variant, x, y in (("eager", a, b), ("kiln", ka, kb)):
            wall, caller_cpu = bench_add(x, y, n)
            out[f"{variant}_cpp"].append(wall)
            out[f"{variant}_cpp_cpu"].append(caller_cpu)
        kiln.synchronize()  # run what the loop queued before the next loop is timed
        out["eager_py"].append(py["eager"].timeit(number=n) / n * 1e9)
        out["kiln_py"].append(py["kiln"].timeit(number=n) / n * 1e9)
        kiln.synchronize()
    return out


# --------------------------------------------------------------------------------- driver
def spawn(args, part, threads, variant=None, model=None):
    """Runs one worker in a fresh Python process; returns its JSON (None if it failed)."""
    cmd = [args.python, os.path.abspath(__file__), "--worker", part, "--threads", str(threads),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--host-calls", str(args.host_calls),
           "--host-repeats", str(args.host_repeats), "--gpt", args.gpt, "--cnn", args.cnn]
    if variant:
        cmd += ["--variant", variant, "--model", model]
    for flag in ("no_pin", "sync"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               KILN_RUNTIME_THREADS=str(args.kiln_runtime_threads or threads))
    needs_kiln = part == "host" or variant == "kiln"
    if needs_kiln:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.kiln_path, env.get("PYTHONPATH")]))
        if args.kiln_preload:
            env["LD_PRELOAD"] = args.kiln_preload
            env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    seconds = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        what = f"{part} {variant or ''} {model or ''} threads={threads}".replace("  ", " ")
        FAILED.append(what)
        print(f"# error {what}: exit {proc.returncode}; its last output:", flush=True)
        for line in (proc.stdout + proc.stderr).strip().splitlines()[-15:]:
            print(f"#   {line}", flush=True)
        return None
    result = json.loads(lines[-1])
    result["process_s"] = seconds
    return result


def quantiles(values):
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(math.ceil(0.9 * len(values))) - 1)]
    return statistics.median(values), values[0], p90


def line(peer, workload, n, threads, median_ns, min_ns, p90_ns, reps, **extra):
    if os.environ.get("BENCH_PASS"):
        extra["pass"] = os.environ["BENCH_PASS"]
    tail = "".join(f" {k}={v}" for k, v in extra.items())
    print(f"peer={peer} workload={workload} n={n} ns_per_elem={median_ns / n:.4g} gbps=0 threads={threads} "
          f"reps={reps} min_ns_per_elem={min_ns / n:.4g} p90_ns_per_elem={p90_ns / n:.4g}{tail}", flush=True)


def thread_keys(result, args, threads):
    cores = result["cores"]
    return {"cores": ",".join(map(str, cores)), "pinned": int(not args.no_pin), "torch_threads": result["torch_threads"],
            "kiln_runtime_threads": args.kiln_runtime_threads or threads}


def run_train(args, threads, medians):
    if "kiln" in args.variants:
        for model in args.models:
            spawn(args, "train", threads, "kiln", model)  # untimed: fills kiln's JIT disk cache
    runs = {}  # (model, variant) -> list of worker results, one per round
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]
        for model in args.models:
            for variant in order:
                result = spawn(args, "train", threads, variant, model)
                if result is not None:
                    runs.setdefault((model, variant), []).append(result)
    for model in args.models:
        for variant in args.variants:
            results = runs.get((model, variant))
            if not results:
                continue
            times = [t * 1e9 for res in results for t in res["times"]]
            median, low, p90 = quantiles(times)
            first = results[0]
            medians[(f"{model}_step", PEER[variant], threads)] = median
            line(PEER[variant], f"{model}_step", first["items"], threads, median, low, p90, len(times),
                 unit=first["unit"], step_ms=f"{median / 1e6:.4g}",
                 round_median_ms="/".join(f"{statistics.median(res['times']) * 1e3:.4g}" for res in results),
                 first_step_ms=f"{first['first_step_s'] * 1e3:.4g}" if first["first_step_s"] is not None else "-",
                 loss_last=f"{first['losses'][-1]:.6g}", fallbacks=first["fallbacks"],
                 **thread_keys(first, args, threads))
        check_losses(runs, model, threads, args.variants)


def check_losses(runs, model, threads, variants):
    """The variants train from one seed on the same batches: their loss curves should agree closely."""
    eager = runs.get((model, "eager"))
    if not eager:
        return
    reference = eager[0]["losses"]
    for variant in variants:
        if variant == "eager" or not runs.get((model, variant)):
            continue
        losses = runs[(model, variant)][0]["losses"]
        diff = max(abs(x - y) / (1.0 + abs(y)) for x, y in zip(losses, reference))
        print(f"# check workload={model}_step threads={threads} peer={PEER[variant]} against=torch-eager "
              f"max_rel_loss_diff={diff:.3g} ok={int(diff < 1e-3)}", flush=True)


def run_host(args, threads, medians):
    rounds = [res for res in (spawn(args, "host", threads) for _ in range(args.rounds)) if res is not None]
    if not rounds:
        return
    for key in ("kiln_cpp", "eager_cpp", "kiln_py", "eager_py"):
        variant, where = key.split("_")
        values = [v for res in rounds for v in res[key]]
        median, low, p90 = quantiles(values)
        medians[(f"add_{where}", PEER[variant], threads, "min")] = low
        medians[(f"add_{where}", PEER[variant], threads)] = median
        extra = {}
        if where == "cpp":  # the calling thread's own CPU time per op (bench_add's second clock)
            cpu_median, cpu_low, _ = quantiles([v for res in rounds for v in res[f"{key}_cpu"]])
            medians[(f"add_{where}_caller_cpu", PEER[variant], threads, "min")] = cpu_low
            extra = {"caller_cpu_ns": f"{cpu_median:.4g}", "min_caller_cpu_ns": f"{cpu_low:.4g}"}
        line(PEER[variant], f"add_{where}", 1, threads, median, low, p90, len(values), calls=rounds[0]["calls"],
             elems=4, queued=int(variant == "kiln"), **extra, **thread_keys(rounds[0], args, threads))


def report_targets(medians, threads_list):
    for threads in threads_list:
        for workload, num, den, limit in STEP_TARGETS:
            a, b = medians.get((workload, num, threads)), medians.get((workload, den, threads))
            if a is None or b is None:
                continue
            print(f"# target workload={workload} threads={threads} ratio={num}/{den} value={a / b:.3g} "
                  f"max={limit} met={int(a / b <= limit)}", flush=True)
        for where in ("cpp", "py"):
            kiln_min = medians.get((f"add_{where}", "kiln", threads, "min"))
            eager_min = medians.get((f"add_{where}", "torch-eager", threads, "min"))
            if kiln_min is None:
                continue
            target = f" max_us={HOST_TARGET_US} met={int(kiln_min / 1e3 <= HOST_TARGET_US)}" if where == "cpp" else ""
            ratio = f" ratio_kiln/torch-eager={kiln_min / eager_min:.3g}" if eager_min else ""
            caller = medians.get((f"add_{where}_caller_cpu", "kiln", threads, "min"))
            caller = f" caller_cpu_us={caller / 1e3:.3g}" if caller is not None else ""
            print(f"# target workload=add_{where} threads={threads} peer=kiln stat=min value_us={kiln_min / 1e3:.3g}"
                  f"{caller}{ratio}{target}", flush=True)


def meta(args):
    import platform
    print(f"# meta bench=bench/torch python={platform.python_version()} executable={args.python} "
          f"cores_usable={len(os.sched_getaffinity(0))} loadavg={'/'.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)
    info = os.path.join(args.kiln_path or "", "kiln", "_build_info.py")
    if os.path.exists(info):
        fields = {}
        with open(info, encoding="utf-8") as f:
            exec(f.read(), fields)  # noqa: S102 (CMake's generated constants)
        sanitize = fields.get("SANITIZE") or "none"
        print(f"# meta kiln_path={args.kiln_path} kiln_sanitize={sanitize.replace(' ', '')} "
              f"kiln_torch={fields.get('TORCH_VERSION')}", flush=True)
        if sanitize != "none":
            print("# meta warning: a sanitizer build of kiln: its figures are not benchmarks", flush=True)
    else:
        print(f"# meta warning: no kiln build at {args.kiln_path} (kiln/_build_info.py missing)", flush=True)
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                   if k.startswith(("KILN_", "OMP_", "MKL_", "ATEN_", "TORCHINDUCTOR_", "BENCH_")))
    print(f"# meta env {env or '(none set)'}", flush=True)
    print(f"# meta rounds={args.rounds} steps={args.steps} warmup={args.warmup} host_calls={args.host_calls} "
          f"host_repeats={args.host_repeats} gpt={args.gpt or 'default'} cnn={args.cnn or 'default'} "
          f"sync={int(args.sync)}", flush=True)


def parse_args(argv):
    quick = os.environ.get("BENCH_QUICK", "0") == "1"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="train,host", help="train, host or both (default both)")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS), help="kiln, eager, compile (default all)")
    p.add_argument("--rounds", type=int, default=1 if quick else 3, help="processes per variant, alternating")
    p.add_argument("--steps", type=int, default=3 if quick else 30, help="timed steps per process")
    p.add_argument("--warmup", type=int, default=1 if quick else 5, help="untimed steps per process first")
    p.add_argument("--host-calls", type=int, default=200 if quick else 20000, help="ops per timed loop")
    p.add_argument("--host-repeats", type=int, default=2 if quick else 7, help="timed loops per process")
    p.add_argument("--gpt", default="", help="gpt.py sizes, e.g. batch=8,context=16,layers=2,width=32,heads=4")
    p.add_argument("--cnn", default="", help="cnn.py sizes, e.g. batch=16,size=16,channels=8")
    p.add_argument("--kiln-path", default=os.path.join(REPO, "build", "release", "python"),
                   help="the build's python folder, put on PYTHONPATH for kiln (default build/release/python)")
    p.add_argument("--kiln-preload", default="", help="LD_PRELOAD for the processes that import kiln (ASan builds)")
    p.add_argument("--kiln-runtime-threads", type=int, default=0, help="KILN_RUNTIME_THREADS (0: the thread count)")
    p.add_argument("--python", default=sys.executable, help="the Python of the worker processes")
    p.add_argument("--no-pin", action="store_true", help="leave the affinity mask alone")
    p.add_argument("--sync", action="store_true", help="kiln: synchronize at the end of every step (timed)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one worker process may take")
    p.add_argument("--worker", choices=("train", "host"), help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.threads = int(args.threads)
        return args
    args.parts = [x for x in args.parts.split(",") if x]
    args.threads = [int(x) for x in args.threads.split(",") if x]
    args.models = [x for x in args.models.split(",") if x]
    args.variants = [x for x in args.variants.split(",") if x]
    for name, allowed in (("parts", ("train", "host")), ("models", MODELS), ("variants", VARIANTS)):
        bad = set(getattr(args, name)) - set(allowed)
        if bad:
            p.error(f"--{name}: unknown {sorted(bad)} (allowed: {', '.join(allowed)})")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        result = train_worker(args) if args.worker == "train" else host_worker(args)
        sys.stdout.flush()
        print(json.dumps(result))
        return 0
    meta(args)
    medians = {}
    started = time.perf_counter()
    for threads in args.threads:
        if "train" in args.parts:
            run_train(args, threads, medians)
        if "host" in args.parts:
            run_host(args, threads, medians)
    report_targets(medians, args.threads)
    print(f"# meta total_s={time.perf_counter() - started:.0f} failed_workers={len(FAILED)}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

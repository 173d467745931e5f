"""What gpt.py and cnn.py share: the device by name, and their command line's common part."""

import argparse
import json
import sys
import time


def device(name):
    """torch.device(name), importing kiln first (which registers the device) when the name is kiln's."""
    import torch  # here, not at the top: train_workers.py's driver uses this module without torch

    if str(name).startswith("kiln"):
        import kiln  # noqa: F401  (PYTHONPATH=<build>/python)
    return torch.device(name)


def train_steps(steps, step, items_per_step, unit, log_every, timings, on_step=None):
    """Runs `step()` (one training step, returning its loss tensor) `steps` times; returns the
    losses (floats). Each step is timed with its loss read, which waits for the step to finish;
    `timings`, a list, gets the seconds; `log_every` > 0 prints step, loss and `unit`s/s;
    `on_step(i, loss, seconds)`, when given, is called after every step (train_workers.py
    reports each step to its driver through it)."""
    losses = []
    for i in range(steps):
        start = time.perf_counter()
        losses.append(step().item())
        seconds = time.perf_counter() - start
        if timings is not None:
            timings.append(seconds)
        if on_step is not None:
            on_step(i, losses[-1], seconds)
        if log_every and (i % log_every == 0 or i == steps - 1):
            print(f"step {i:5d}  loss {losses[-1]:.4f}  {items_per_step / seconds:9.0f} {unit}/s", flush=True)
    return losses


# gpt.py's train() options with their defaults: its command line's and train_workers.py's.
GPT_OPTIONS = (("batch", int, 8), ("context", int, 16), ("layers", int, 2), ("width", int, 32), ("heads", int, 4),
               ("lr", float, 3e-3))


def add_gpt_arguments(p):
    """--batch, --context, --layers, --width, --heads, --lr on an argparse parser."""
    for name, kind, default in GPT_OPTIONS:
        p.add_argument(f"--{name}", type=kind, default=default)


def gpt_options(args):
    """gpt.train()'s keyword arguments from a parser that add_gpt_arguments filled."""
    return {name: getattr(args, name) for name, _, _ in GPT_OPTIONS}


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu", help="kiln or cpu (default cpu)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="the weights' and the batches' seed")
    p.add_argument("--log-every", type=int, default=10, help="print step, loss and throughput every N steps (0: never)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--json", action="store_true",
                   help="print only one JSON object at the end: the losses, timings and kiln.stats()")
    return p


def run(args, train, options, items_per_step, unit):
    """Runs train(args.device, args.steps, seed=args.seed, **options) and prints the summary.

    Returns the summary: the losses, the first and the median step's seconds, the median
    throughput in `unit`s per second and, on kiln, kiln.stats() (the ops that ran on the CPU)."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    on_kiln = device(args.device).type == "kiln"
    if on_kiln:
        import kiln
        kiln.reset_stats()
    timings = []
    losses = train(args.device, args.steps, seed=args.seed, log_every=0 if args.json else args.log_every,
                   timings=timings, **options)
    steady = sorted(timings[1:] or timings)  # the first step includes warm-up (allocations, plans)
    median = steady[len(steady) // 2]
    summary = {
        "device": args.device,
        "steps": args.steps,
        "seed": args.seed,
        "threads": torch.get_num_threads(),
        "options": options,
        "losses": losses,
        "first_step_s": timings[0],
        "median_step_s": median,
        f"{unit}_per_s": items_per_step / median,
        "fallbacks": kiln.stats() if on_kiln else {},
    }
    if args.json:
        json.dump(summary, sys.stdout)
        print()
    else:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; first step {timings[0] * 1e3:.1f} ms, "
              f"median step {median * 1e3:.2f} ms ({items_per_step / median:.0f} {unit}/s)")
        if on_kiln:
            print(f"kiln.stats(), the ops that ran on the CPU (calls in {args.steps} steps): {summary['fallbacks']}")
    return summary

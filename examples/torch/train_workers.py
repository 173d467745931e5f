"""The main job: one kilnd, several PyTorch workers training the GPT of gpt.py through it.

    python train_workers.py --kilnd build/release/apps/kilnd --pythonpath build/release/python
    python train_workers.py --workers 2 --steps 100 --out /tmp/losses.png

It starts `kilnd` on a socket in a private temporary directory (its own --runtime-dir and
--lock-dir; `--socket PATH` uses a daemon that already runs instead), then `--workers` worker
processes. Each worker is this script again (`--worker NAME`): it calls kiln.connect(socket) before
its first kiln op, so its tensors live in the daemon, and trains gpt.py's model with gpt.train on
the `kiln` device from its own seed (`--seed` + its index: other weights, other batches, so the
curves differ). The driver prints each worker's progress (step, loss, tokens/s, prefixed by the
worker's name) and the daemon's plan-cache figures (`kilnctl status --json`: plans, cache hits,
explorations, hit rate) every `--status-every` seconds and at the end, writes a plot of every
worker's loss curve to `--out` (a PNG, with matplotlib's Agg backend), and exits 0 only if every
worker finished and its loss fell (the mean of its last steps below that of its first steps).

A worker that fails (a Python exception, a crash, a signal) stops the run: the driver names it,
prints the end of its stderr, stops the others and the daemon, and exits 1. The daemon and the
workers are stopped on every way out (an error, Ctrl-C, SIGTERM); they run in process groups of
their own, and each gets SIGTERM from the kernel if the driver itself dies (PR_SET_PDEATHSIG), so
none outlives it.

Exit status: 0 every loss fell; 1 a worker failed or its loss did not fall; 2 a usage or setup
error (no kilnd, a daemon that did not start, matplotlib missing); 128+N on signal N.
"""

import argparse
import ctypes
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import example_common

HERE = os.path.dirname(os.path.abspath(__file__))
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SetupError(Exception):
    """A usage or setup problem: exit status 2."""


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--steps", type=int, default=300, help="training steps per worker (default 300)")
    p.add_argument("--seed", type=int, default=0, help="worker i trains from seed SEED+i (default 0)")
    p.add_argument("--device", default="auto", help="kilnd's --device: auto, cpu, cuda, cuda:N (default auto)")
    p.add_argument("--kilnd", default=os.environ.get("KILN_KILND"), help="the kilnd to start (env KILN_KILND)")
    p.add_argument("--kilnctl", default=os.environ.get("KILN_KILNCTL"),
                   help="the kilnctl that reads the daemon's status (env KILN_KILNCTL; default: next to kilnd)")
    p.add_argument("--socket", help="use the kilnd that runs on this socket instead of starting one")
    p.add_argument("--pythonpath", default=os.environ.get("KILN_PYTHONPATH"),
                   help="the build's python/ folder (the `kiln` package), put first on the workers' PYTHONPATH "
                        "(env KILN_PYTHONPATH)")
    p.add_argument("--python", default=sys.executable, help="the workers' interpreter (default: this one)")
    p.add_argument("--out", help="the loss plot, a PNG (default: kiln-demo-losses.png in the build folder "
                                 "above kilnd, else the working directory)")
    p.add_argument("--no-plot", action="store_true", help="write no plot (and need no matplotlib)")
    p.add_argument("--log-every", type=int, default=25, help="print each worker's progress every N steps")
    p.add_argument("--status-every", type=float, default=10.0,
                   help="print the daemon's plan-cache figures every S seconds (0: only at the end)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each worker (default 1)")
    example_common.add_gpt_arguments(p)
    p.add_argument("--fail-worker", help="for tests: the worker of this name (w0, w1, ...) raises at --fail-step")
    p.add_argument("--fail-step", type=int, default=1, help="for tests: the step --fail-worker raises at")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run as the worker of this name
    args = p.parse_args(argv)
    if args.workers < 1 or args.steps < 1:
        p.error("--workers and --steps must be at least 1")
    if args.log_every < 1:
        p.error("--log-every must be at least 1")
    return args



# ---- the worker ----------------------------------------------------------------------------------

def emit(kind, payload):
    """One line to the driver: KIND and a JSON payload."""
    print(kind + " " + json.dumps(payload), flush=True)


def run_worker(args):
    """Trains gpt.py's model on kiln through the daemon at args.socket; reports every step."""
    import torch
    import kiln
    import gpt

    torch.set_num_threads(args.threads)
    kiln.connect(args.socket, job="demo")  # before the first kiln op: the tensors live in the daemon
    fail_step = args.fail_step if args.fail_worker == args.worker else None

    def on_step(i, loss, seconds):
        emit("STEP", {"step": i, "loss": loss, "seconds": seconds})
        if i == fail_step:
            raise RuntimeError(f"worker {args.worker}: failure injected at step {i} (--fail-worker)")

    kiln.reset_stats()
    gpt.train("kiln", args.steps, seed=args.seed, on_step=on_step, **example_common.gpt_options(args))
    emit("DONE", {"fallbacks": kiln.stats(), "client_id": kiln.device_info().get("client_id")})
    return 0


# ---- the driver ----------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM when the driver dies, however it dies; and a group of its
    own, so that a Ctrl-C at the terminal reaches the driver only, which stops the children in order."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def tool_env():
    """kilnd's and kilnctl's environment: the driver's, less an ASan preload meant for Python."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def stop_process(proc, grace=10.0):
    """SIGTERM, then SIGKILL after `grace` seconds; waits for it. Safe on a process already gone."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Daemon:
    """The kilnd the driver talks to: one it starts in `root` (stopped by stop()), or one at `socket`."""

    def __init__(self, args, root):
        self.args = args
        self.root = root
        self.proc = None
        self.log_path = os.path.join(root, "kilnd.log")
        self.kilnctl = args.kilnctl
        self.socket = os.path.abspath(args.socket) if args.socket else os.path.join(root, "run", "kilnd-demo.sock")

    def start(self):
        """Starts kilnd (or checks that the one at --socket answers) and waits until it answers."""
        args, root = self.args, self.root
        if args.socket:
            if self.status() is None:
                raise SetupError(f"no kilnd answers on {self.socket}")
            return
        self.run_dir = os.path.dirname(self.socket)
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                [args.kilnd, "--device", args.device, "--runtime-dir", self.run_dir, "--socket",
                 os.path.basename(self.socket), "--lock-dir", os.path.join(root, "locks")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=tool_env(),
                preexec_fn=_die_with_parent, start_new_session=True)
        deadline = time.monotonic() + 60
        while not (os.path.exists(self.socket) and self.status() is not None):
            if self.proc.poll() is not None:
                raise SetupError(f"kilnd exited at start (status {self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise SetupError(f"kilnd did not answer within 60 s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines=20):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def status(self):
        """`kilnctl status --json` of this daemon, parsed; None if it did not answer."""
        try:
            r = subprocess.run([self.kilnctl, "status", "--json", "--runtime-dir", os.path.dirname(self.socket),
                                "--socket", os.path.basename(self.socket)], capture_output=True, text=True,
                               timeout=30, env=tool_env(), stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout.strip().splitlines()[0])
        except (ValueError, IndexError):
            return None

    def alive(self):
        return self.proc is None or self.proc.poll() is None

    def stop(self):
        """Stops a daemon the driver started (SIGTERM drains every client); its exit status or None."""
        if self.proc is None:
            return None
        stop_process(self.proc, grace=30)
        return self.proc.returncode


def describe_status(s, clients=True):
    if s is None:
        return "kilnd: no status (kilnctl did not answer)"
    workers = sum(1 for c in s.get("clients", []) if c.get("job") == "demo")
    return (f"kilnd ({s.get('device')}): " + (f"{workers} worker(s) connected, " if clients else "")
            + f"{s.get('plans')} plans, "
            f"{s.get('cache_hits')} cache hits / {s.get('explorations')} explorations "
            f"(hit rate {100 * float(s.get('hit_rate', 0)):.1f}%), {s.get('fused_launches')} fused launches, "
            f"{int(s.get('memory_bytes', 0)) / 2**20:.1f} MiB in {s.get('device_tensors')} tensors")


class DeferredSignals:
    """Holds SIGINT, SIGTERM and SIGHUP back while the children are being stopped; one that came
    meanwhile raises Interrupted at the end (after the clean-up, not in its middle)."""

    def __enter__(self):
        self.got = None
        self.saved = {s: signal.signal(s, self.note) for s in STOP_SIGNALS}
        return self

    def note(self, signum, _frame):
        self.got = self.got or signum

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)
        if self.got is not None and exc[0] is None and callable(self.saved[self.got]):
            self.saved[self.got](self.got, None)
        return False


class Worker:
    def __init__(self, index, args, socket, root):
        self.name = f"w{index}"
        self.seed = args.seed + index
        self.losses = []
        self.seconds = []
        self.done = None  # the DONE payload
        self.eof = False
        self.stderr_path = os.path.join(root, self.name + ".stderr")
        env = dict(os.environ, KILN_SOCKET=socket, PYTHONDONTWRITEBYTECODE="1")
        # The workers run in this folder (gpt.py's): the driver's relative paths made absolute.
        path = [args.pythonpath] if args.pythonpath else []
        path += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if path:
            env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in path)
        cmd = [os.path.abspath(args.python) if os.sep in args.python else args.python, os.path.abspath(__file__), "--worker", self.name, "--socket", socket,
               "--steps", str(args.steps), "--seed", str(self.seed), "--threads", str(args.threads)]
        for name, value in example_common.gpt_options(args).items():
            cmd += [f"--{name}", repr(value)]
        if args.fail_worker:
            cmd += ["--fail-worker", args.fail_worker, "--fail-step", str(args.fail_step)]
        with open(self.stderr_path, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                         text=True, env=env, cwd=HERE, preexec_fn=_die_with_parent,
                                         start_new_session=True)
        self.mark = None  # (steps, time) at the last progress line

    def stderr_tail(self, lines=15):
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def finished(self):
        return self.eof and self.proc.poll() is not None

    def fell(self):
        """(first, last, fell): the mean loss of the first and of the last k steps (k = a quarter of
        them, at most 10), and whether every step ran and the last k are below the first k."""
        n = len(self.losses)
        if n == 0:
            return None, None, False
        k = max(1, min(10, n // 4))
        first, last = statistics.fmean(self.losses[:k]), statistics.fmean(self.losses[-k:])
        return first, last, n >= 2 and last < first


def read_lines(worker, events):
    for line in worker.proc.stdout:
        events.put((worker, line.rstrip("\n")))
    events.put((worker, None))


def on_line(worker, line, args, tokens_per_step):
    if line.startswith("STEP "):
        step = json.loads(line[5:])
        worker.losses.append(step["loss"])
        worker.seconds.append(step["seconds"])
        i = step["step"]
        if i % args.log_every == 0 or i == args.steps - 1:
            # tokens/s since the last progress line (the first: of that step alone, which
            # includes building the plans)
            now = time.monotonic()
            if worker.mark is None:
                rate = tokens_per_step / max(step["seconds"], 1e-9)
            else:
                steps, since = worker.mark
                rate = (len(worker.losses) - steps) * tokens_per_step / max(now - since, 1e-9)
            worker.mark = (len(worker.losses), now)
            print(f"{worker.name}  step {i:4d}/{args.steps}  loss {step['loss']:.4f}  {rate:7.0f} tokens/s", flush=True)
    elif line.startswith("DONE "):
        worker.done = json.loads(line[5:])
    else:
        print(f"{worker.name}  | {line}", flush=True)


def default_out(args):
    if args.kilnd:
        build = os.path.dirname(os.path.dirname(os.path.abspath(args.kilnd)))  # <build>/apps/kilnd
        if os.path.isdir(build) and os.access(build, os.W_OK):
            return os.path.join(build, "kiln-demo-losses.png")
    return os.path.abspath("kiln-demo-losses.png")


def plot(workers, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for w in workers:
        if not w.losses:
            continue
        steps = range(len(w.losses))
        line, = ax.plot(steps, w.losses, linewidth=0.8, alpha=0.35)
        k = 10  # a trailing mean over 10 steps, in the same colour
        smooth = [statistics.fmean(w.losses[max(0, i - k + 1):i + 1]) for i in steps]
        ax.plot(steps, smooth, color=line.get_color(), linewidth=2, label=f"{w.name} (seed {w.seed})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (thin: each step, thick: mean of the last 10)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)


def drive(args, root):
    if not args.socket:
        if not args.kilnd:
            raise SetupError("give --kilnd PATH (or KILN_KILND), or --socket of a running kilnd")
        if not (os.path.isfile(args.kilnd) and os.access(args.kilnd, os.X_OK)):
            raise SetupError(f"{args.kilnd} is not an executable kilnd")
    if not args.kilnctl:
        if not args.kilnd:
            raise SetupError("give --kilnctl PATH (or KILN_KILNCTL)")
        args.kilnctl = os.path.join(os.path.dirname(os.path.abspath(args.kilnd)), "kilnctl")
    if not (os.path.isfile(args.kilnctl) and os.access(args.kilnctl, os.X_OK)):
        raise SetupError(f"{args.kilnctl} is not an executable kilnctl")
    out = None
    if not args.no_plot:
        try:
            import matplotlib  # noqa: F401  (fail before training, not after it)
        except ImportError as e:
            raise SetupError(f"matplotlib does not import ({e}): scripts/setup.sh installs it into .venv "
                             "(scripts/requirements-torch.txt); or give --no-plot") from e
        out = os.path.abspath(args.out or default_out(args))

    print(f"==> starting kilnd ({args.kilnd} --device {args.device})" if not args.socket
          else f"==> using the kilnd on {args.socket}", flush=True)
    daemon = Daemon(args, root)
    workers = []
    try:
        daemon.start()
        status = daemon.status()
        print(f"==> kilnd is ready on {daemon.socket} (device {status.get('device') if status else '?'}); "
              f"{args.workers} workers x {args.steps} steps of gpt.py (batch {args.batch}, context {args.context}, "
              f"{args.layers} layers, width {args.width}), seeds {args.seed}..{args.seed + args.workers - 1}",
              flush=True)
        start = time.monotonic()
        # Every child starts before the first thread does (preexec_fn and threads do not mix).
        for i in range(args.workers):
            workers.append(Worker(i, args, daemon.socket, root))
        events = queue.Queue()
        for w in workers:
            threading.Thread(target=read_lines, args=(w, events), daemon=True).start()
        failed = None
        next_status = time.monotonic() + args.status_every if args.status_every > 0 else float("inf")
        tokens_per_step = args.batch * args.context
        while not all(w.finished() for w in workers):
            try:
                w, line = events.get(timeout=0.2)
                if line is None:
                    w.eof = True
                    w.proc.wait()
                else:
                    on_line(w, line, args, tokens_per_step)
            except queue.Empty:
                pass
            failed = next((w for w in workers if w.finished() and w.proc.returncode != 0), None)
            if failed is not None:
                break
            if not daemon.alive():
                print(f"kilnd died (status {daemon.proc.returncode}); its log ends:\n{daemon.log_tail()}", flush=True)
                return 1
            if time.monotonic() >= next_status:
                print(describe_status(daemon.status()), flush=True)
                next_status = time.monotonic() + args.status_every
        elapsed = time.monotonic() - start

        if failed is not None:
            rc = failed.proc.returncode
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
            print(f"FAILED: worker {failed.name} (seed {failed.seed}) crashed ({how}) after "
                  f"{len(failed.losses)} of {args.steps} steps; its stderr ends:\n{failed.stderr_tail()}", flush=True)
            for w in workers:
                stop_process(w.proc, grace=5)
            if out:
                plot(workers, out, f"kiln: worker {failed.name} failed")
                print(f"==> loss curves so far: {out}")
            return 1

        print(f"==> all {args.workers} workers finished in {elapsed:.1f} s", flush=True)
        final = daemon.status()
        print(describe_status(final, clients=False), flush=True)
    finally:
        with DeferredSignals():  # a Ctrl-C now waits until every child is stopped
            for w in workers:
                stop_process(w.proc, grace=5)
            daemon_rc = daemon.stop()

    ok = True
    print("==> summary")
    for w in workers:
        first, last, fell = w.fell()
        steady = sorted(w.seconds[1:] or w.seconds)
        median = steady[len(steady) // 2]
        print(f"{w.name}  seed {w.seed}  loss {first:.4f} -> {last:.4f}  "
              f"{'fell' if fell else 'DID NOT FALL'}  median step {median * 1e3:.1f} ms "
              f"({tokens_per_step / median:.0f} tokens/s)"
              + (f"  CPU fallbacks: {w.done['fallbacks']}" if w.done and w.done.get("fallbacks") else ""))
        if not fell:
            ok = False
    if final is not None:
        print(f"plan cache: {final.get('plans')} plans, {final.get('cache_hits')} hits, "
              f"{final.get('explorations')} explorations, hit rate {100 * float(final.get('hit_rate', 0)):.1f}%")
    if daemon_rc not in (None, 0):
        print(f"kilnd exited with status {daemon_rc} at stop; its log ends:\n{daemon.log_tail()}")
        ok = False
    if out:
        device = final.get("device") if final else args.device
        plot(workers, out, f"kiln: {args.workers} workers training a GPT through one kilnd ({device})")
        print(f"==> loss curves: {out}")
    bad = [w.name for w in workers if not w.fell()[2]]
    if bad:
        print(f"FAILED: the loss of {', '.join(bad)} did not fall")
    elif ok:
        print("OK: every worker's loss fell")
    return 0 if ok else 1


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        sys.path.insert(0, HERE)
        return run_worker(args)

    def interrupted(signum, _frame):
        for s in STOP_SIGNALS:  # the clean-up that follows runs to its end
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)


    for s in STOP_SIGNALS:
        signal.signal(s, interrupted)
    root = tempfile.mkdtemp(prefix="kiln-demo-", dir="/tmp" if os.path.isdir("/tmp") else None)  # short socket path
    try:
        return drive(args, root)
    except SetupError as e:
        print(f"train_workers: {e}", file=sys.stderr, flush=True)
        return 2
    except Interrupted as e:
        print(f"train_workers: {e}: stopped the workers and the daemon", file=sys.stderr, flush=True)
        shutil.rmtree(root, ignore_errors=True)
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)  # die of the signal, so that a calling shell sees it
        return 128 + e.signum
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Tensors in a running kilnd (KILN_SOCKET, kiln.connect): results, several workers on one daemon,
each worker's fallbacks in the daemon's status, a daemon that dies, and kiln.connect's rules.

The device is process-wide, so every scenario runs in a Python process of its own (a worker,
below), against a kilnd this module starts for each test: the one of the same build, which
tests/torch/CMakeLists.txt passes as KILN_KILND (and its kilnctl as KILN_KILNCTL), on a socket in
a temporary directory. Every wait has a bound, so a hang fails the test instead of stalling it.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

KILND = os.environ.get("KILN_KILND")
KILNCTL = os.environ.get("KILN_KILNCTL")
WORKER_TIMEOUT = 180  # seconds; a worker imports torch (ASan build: a few seconds on 2 busy cores)

# What every worker starts with: torch, kiln, and `emit`, which prints the worker's result as the
# one line the test reads.
PRELUDE = """
import json, os, sys, time
import torch
import kiln

def emit(result):
    print("RESULT " + json.dumps(result), flush=True)

def mlp_steps(device, steps):
    # A small MLP trained with SGD for `steps` steps on `device`; the final loss and parameters.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 8, generator=g).to(device), torch.randn(10, 2, generator=g).to(device)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return loss.item(), [p.detach().cpu() for p in model.parameters()]

def wait_for(paths, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit("worker: timed out waiting for " + what)
        time.sleep(0.02)
"""


def tool_env():
    """The environment for kilnd and kilnctl: the test's, without the ASan preload meant for Python."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


class Daemon:
    """A kilnd on the CPU in `root`/run (socket kilnd-cpu.sock), with its own lock directory so
    that it does not meet the daemons of other tests."""

    def __init__(self, root, flags=()):
        self.root = root
        self.run_dir = os.path.join(root, "run")
        self.socket = os.path.join(self.run_dir, "kilnd-cpu.sock")
        self.log_path = os.path.join(root, "kilnd.log")
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                [KILND, "--device", "cpu", "--runtime-dir", self.run_dir, "--lock-dir", os.path.join(root, "locks"),
                 *flags],
                stdout=log, stderr=subprocess.STDOUT, env=tool_env())
        deadline = time.monotonic() + 60
        while not (os.path.exists(self.socket) and self.status() is not None):
            if self.proc.poll() is not None:
                raise AssertionError("kilnd exited at start:\n" + self.log())
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError("kilnd did not answer within 60 s:\n" + self.log())
            time.sleep(0.05)

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def status(self):
        """kilnctl status --json, parsed; None if it did not answer."""
        r = subprocess.run([KILNCTL, "status", "--json", "--runtime-dir", self.run_dir], capture_output=True,
                           text=True, timeout=60, env=tool_env(), check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self):
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def result_of(stdout):
    """The worker's RESULT line, parsed."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError("the worker printed no result:\n" + stdout)


@unittest.skipUnless(KILND and KILNCTL, "KILN_KILND and KILN_KILNCTL name the build's kilnd and kilnctl (ctest sets them)")
class RemoteTest(unittest.TestCase):
    def setUp(self):
        # Short: a Unix socket path has at most 107 bytes.
        self.root = tempfile.mkdtemp(prefix="kiln-remote-", dir="/tmp" if os.path.isdir("/tmp") else None)
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        self.daemon = Daemon(self.root)
        self.addCleanup(self.daemon.stop)

    def worker_env(self, socket=None):
        env = dict(os.environ, KILN_TEST_DIR=self.root)
        env.pop("KILN_SOCKET", None)
        if socket:
            env["KILN_SOCKET"] = socket
        return env

    def start_worker(self, code, socket=None, args=()):
        return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.worker_env(socket))

    def finish(self, proc, timeout=WORKER_TIMEOUT):
        """Waits for a worker (a hang fails the test), checks its exit status, returns its result."""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.fail(f"the worker hung ({timeout} s):\n{out}\n{err}\nkilnd:\n{self.daemon.log()}")
        self.assertEqual(proc.returncode, 0, f"the worker failed:\n{out}\n{err}\nkilnd:\n{self.daemon.log()}")
        return result_of(out)

    def run_worker(self, code, socket=None):
        return self.finish(self.start_worker(code, socket))

    def test_ops_in_the_daemon_give_the_cpus_results(self):
        r = self.run_worker(
            """
            before = kiln.device_info()
            torch.manual_seed(0)
            a, b = torch.randn(4, 5), torch.randn(5, 3)
            ka, kb = a.to("kiln"), b.to("kiln")
            torch.testing.assert_close(((ka @ kb).exp() * 2 + 1).sum(1).cpu(), ((a @ b).exp() * 2 + 1).sum(1))
            torch.testing.assert_close(torch.cumprod(ka, 1).cpu(), torch.cumprod(a, 1))  # a CPU fallback
            big = torch.arange(1 << 20, dtype=torch.float32)
            torch.testing.assert_close((big.to("kiln") * 3).cpu(), big * 3)
            cpu_loss, cpu_params = mlp_steps("cpu", 3)
            loss, params = mlp_steps("kiln", 3)
            assert abs(loss - cpu_loss) < 1e-4 * max(1.0, abs(cpu_loss)), (loss, cpu_loss)
            for p, q in zip(params, cpu_params):
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
            kiln.synchronize()
            status = json.loads(kiln.daemon_status(True))
            emit({"before": before, "after": kiln.device_info(), "status": status})
            """, socket=self.daemon.socket)
        self.assertEqual(r["before"], {"started": False, "where": "kilnd", "socket": self.daemon.socket,
                                       "client_id": None})
        after = r["after"]
        self.assertEqual((after["started"], after["where"], after["socket"]), (True, "kilnd", self.daemon.socket))
        mine = [c for c in r["status"]["clients"] if c["id"] == after["client_id"]]
        self.assertEqual(len(mine), 1, r["status"])
        self.assertEqual(mine[0]["job"], "pytorch")
        self.assertGreater(mine[0]["ops"], 0, r["status"])

    def test_two_workers_feed_one_daemon(self):
        # Both train the same MLP at once. Each waits for the other before reading the daemon's
        # status (both connected) and before leaving (so that neither status misses the other).
        code = """
            me, other = sys.argv[1], sys.argv[2]
            d = os.environ["KILN_TEST_DIR"]
            cpu_loss, _ = mlp_steps("cpu", 5)
            loss, _ = mlp_steps("kiln", 5)
            assert abs(loss - cpu_loss) < 1e-4 * max(1.0, abs(cpu_loss)), (loss, cpu_loss)
            open(os.path.join(d, "trained-" + me), "w").close()
            wait_for([os.path.join(d, "trained-" + other)], "the other worker's training")
            status = json.loads(kiln.daemon_status(True))
            open(os.path.join(d, "read-" + me), "w").close()
            wait_for([os.path.join(d, "read-" + other)], "the other worker's status")
            emit({"info": kiln.device_info(), "status": status})
            """
        workers = [self.start_worker(code, self.daemon.socket, args=(me, other)) for me, other in (("0", "1"),
                                                                                                   ("1", "0"))]
        results = [self.finish(w) for w in workers]
        ids = {r["info"]["client_id"] for r in results}
        self.assertEqual(len(ids), 2, results)
        for r in results:
            live = {c["id"] for c in r["status"]["clients"] if c["job"] == "pytorch"}
            self.assertEqual(live, ids, r["status"])  # both workers were connected at once
        status = self.daemon.status()
        self.assertIsNotNone(status)
        # One plan store for both: the training steps' programs were planned once and then found.
        self.assertGreater(status["plans"], 0, status)
        self.assertGreater(status["cache_hits"], 0, status)

    def test_the_daemons_status_shows_each_workers_fallbacks(self):
        # The worker's fallbacks reach the daemon at a sync point (at most one report per 0.5 s):
        # the test reads them with kilnctl while the worker waits, then the worker reads its own
        # status (text and JSON), resets its counts, and leaves, which takes them out.
        worker = self.start_worker(
            """
            d = os.environ["KILN_TEST_DIR"]
            x = torch.arange(6.0).to("kiln")
            for _ in range(3):
                y = torch.roll(x, 1, 0)  # a CPU fallback, counted at each call
            torch.testing.assert_close(y.cpu(), torch.tensor([5.0, 0.0, 1.0, 2.0, 3.0, 4.0]))
            time.sleep(0.6)  # past the report interval
            kiln.synchronize()  # a sync point: the counts are in the daemon once it returns
            stats = kiln.stats()
            with open(os.path.join(d, "stats.json"), "w") as f:
                json.dump({"stats": stats, "client_id": kiln.device_info()["client_id"]}, f)
            os.rename(os.path.join(d, "stats.json"), os.path.join(d, "synced"))
            wait_for([os.path.join(d, "looked")], "the test's kilnctl status")
            status = json.loads(kiln.daemon_status(True))
            text = kiln.daemon_status(False)
            kiln.reset_stats()  # reported at once: an empty snapshot
            after_reset = json.loads(kiln.daemon_status(True))
            emit({"stats": stats, "info": kiln.device_info(), "status": status, "text": text,
                  "after_reset": after_reset})
            """, socket=self.daemon.socket)
        synced = os.path.join(self.root, "synced")
        deadline = time.monotonic() + WORKER_TIMEOUT
        while not os.path.exists(synced):
            if worker.poll() is not None or time.monotonic() > deadline:
                self.finish(worker, timeout=1)
                self.fail("the worker never synced")
            time.sleep(0.02)
        with open(synced, encoding="utf-8") as f:
            seen = json.load(f)
        stats, client_id = seen["stats"], seen["client_id"]
        rolls = [name for name in stats if name.startswith("aten::roll")]
        self.assertEqual(len(rolls), 1, stats)
        self.assertEqual(stats[rolls[0]], 3, stats)
        # kilnctl status --json, from another process: the worker's client lists its fallbacks.
        status = self.daemon.status()
        open(os.path.join(self.root, "looked"), "w").close()
        self.assertIsNotNone(status)
        mine = [c for c in status["clients"] if c["id"] == client_id]
        self.assertEqual(len(mine), 1, status)
        self.assertEqual(mine[0]["fallbacks"], stats, status)
        self.assertEqual(mine[0]["fallbacks_omitted"], 0, status)
        # And from the worker itself, text and JSON; after kiln.reset_stats(), none.
        r = self.finish(worker)
        mine = [c for c in r["status"]["clients"] if c["id"] == client_id]
        self.assertEqual(mine[0]["fallbacks"], r["stats"], r["status"])
        self.assertIn(f"      fallbacks: {rolls[0]} 3", r["text"])
        mine = [c for c in r["after_reset"]["clients"] if c["id"] == client_id]
        self.assertEqual(mine[0]["fallbacks"], {}, r["after_reset"])
        # The report goes with its client.
        deadline = time.monotonic() + 60
        while True:
            status = self.daemon.status()
            if status is not None and all(c["id"] != client_id for c in status["clients"]):
                break
            self.assertLess(time.monotonic(), deadline, status)
            time.sleep(0.05)

    def test_a_daemon_that_dies_raises_kiln_error_in_the_worker(self):
        ready = os.path.join(self.root, "ready")
        worker = self.start_worker(
            """
            x = torch.ones(64, 64, device="kiln")
            (x * 2).sum().item()
            open(os.path.join(os.environ["KILN_TEST_DIR"], "ready"), "w").close()
            deadline = time.monotonic() + 120
            error = None
            while error is None and time.monotonic() < deadline:
                try:
                    y = (x @ x).exp().sum()
                    kiln.synchronize()
                    y.item()
                except kiln.KilnError as e:
                    error = e
            failed_at = time.monotonic()
            assert error is not None, "no KilnError within 120 s of the daemon's start"
            # The device stays broken, and says so at once: the next op raises too.
            try:
                (x + 1).cpu()
                again = None
            except kiln.KilnError as e:
                again = str(e)
            emit({"error": str(error), "failed_at": failed_at, "again": again,
                  "again_s": time.monotonic() - failed_at, "info": kiln.device_info()})
            """, socket=self.daemon.socket)
        deadline = time.monotonic() + WORKER_TIMEOUT
        while not os.path.exists(ready):
            if worker.poll() is not None or time.monotonic() > deadline:
                self.finish(worker, timeout=1)
                self.fail("the worker never got going")
            time.sleep(0.02)
        time.sleep(0.2)  # mid-run: the worker is in its loop of ops and syncs
        killed_at = time.monotonic()  # CLOCK_MONOTONIC: the same clock in both processes
        self.daemon.kill()
        r = self.finish(worker, timeout=60)
        self.assertIn("daemon", r["error"])
        self.assertTrue(r["error"].startswith("kiln: "), r["error"])
        self.assertLess(r["failed_at"] - killed_at, 5.0, r)
        self.assertIsNotNone(r["again"], r)
        self.assertLess(r["again_s"], 5.0, r)
        self.assertEqual(r["info"]["socket"], self.daemon.socket)

    def test_connect_after_the_first_op_raises(self):
        r = self.run_worker(
            f"""
            assert torch.ones(2, device="kiln").sum().item() == 2.0  # no KILN_SOCKET: in process
            try:
                kiln.connect({self.daemon.socket!r})
                error = None
            except kiln.KilnError as e:
                error = str(e)
            emit({{"error": error, "info": kiln.device_info(), "still": torch.ones(3, device="kiln").sum().item()}})
            """)
        self.assertIsNotNone(r["error"])
        self.assertIn("already started in process", r["error"])
        self.assertIn("before any kiln op", r["error"])
        self.assertEqual(r["info"], {"started": True, "where": "in process", "socket": None, "client_id": None})
        self.assertEqual(r["still"], 3.0)  # the device goes on in process

    def test_connect_before_the_first_op(self):
        r = self.run_worker(
            f"""
            socket = {self.daemon.socket!r}
            missing = os.path.join(os.path.dirname(socket), "nobody.sock")
            try:
                kiln.connect(missing)  # no daemon there: an error, and the device stays unstarted
                no_daemon = None
            except kiln.KilnError as e:
                no_daemon = str(e)
            unstarted = kiln.device_info()
            kiln.connect(socket)
            connected = kiln.device_info()
            kiln.connect(socket)  # the same socket again: nothing happens
            got = (torch.arange(6.0).to("kiln") * 2).sum().item()
            try:
                kiln.connect(missing)
                elsewhere = None
            except kiln.KilnError as e:
                elsewhere = str(e)
            emit({{"no_daemon": no_daemon, "unstarted": unstarted, "connected": connected, "got": got,
                   "elsewhere": elsewhere}})
            """)
        self.assertIsNotNone(r["no_daemon"])
        self.assertIn("daemon not running at", r["no_daemon"])
        self.assertFalse(r["unstarted"]["started"], r)
        self.assertEqual(r["unstarted"]["where"], "in process")
        self.assertEqual((r["connected"]["started"], r["connected"]["socket"]), (True, self.daemon.socket))
        self.assertIsNotNone(r["connected"]["client_id"])
        self.assertEqual(r["got"], 30.0)
        self.assertIsNotNone(r["elsewhere"])
        self.assertIn("already started in the kilnd at " + self.daemon.socket, r["elsewhere"])

    def test_kiln_socket_without_a_daemon_raises_at_the_first_op(self):
        missing = os.path.join(self.daemon.run_dir, "nobody.sock")
        r = self.run_worker(
            """
            errors = []
            for _ in range(2):  # the start is tried again, and fails again, promptly
                try:
                    torch.ones(2, device="kiln").sum().item()
                except kiln.KilnError as e:
                    errors.append(str(e))
            emit({"errors": errors, "info": kiln.device_info()})
            """, socket=missing)
        self.assertEqual(len(r["errors"]), 2, r)
        self.assertIn("daemon not running at " + missing, r["errors"][0])
        self.assertIn("KILN_SOCKET", r["errors"][0])
        self.assertFalse(r["info"]["started"])


if __name__ == "__main__":
    unittest.main()

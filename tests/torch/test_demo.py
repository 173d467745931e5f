"""The main job's driver, examples/torch/train_workers.py: kilnd and PyTorch workers training the
GPT through it, per-worker progress, the loss plot, and no process left behind on any way out.

The driver runs as `./quickstart.sh demo` runs it, at tiny sizes: this build's kilnd and kilnctl
(KILN_KILND, KILN_KILNCTL from tests/torch/CMakeLists.txt), the package on PYTHONPATH (which the
workers inherit, with the ASan preload of a dev build). Each run names its daemon's socket in a
temporary directory of its own (/tmp/kiln-demo-XXXX/run/kilnd-demo.sock): a process whose command
line still names it after the driver exited (kilnd or a worker) is an orphan.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

KILND = os.environ.get("KILN_KILND")
KILNCTL = os.environ.get("KILN_KILNCTL")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "examples", "torch",
                      "train_workers.py")
TIMEOUT = 150  # seconds for one driver run (ASan build, 2 busy cores)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def processes_naming(text):
    """The pids of the processes whose command line contains `text`."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if text in cmdline and not zombie:
            pids.append(int(pid))
    return pids


@unittest.skipUnless(KILND and KILNCTL, "KILN_KILND and KILN_KILNCTL name the build's kilnd and kilnctl (ctest sets them)")
class DemoTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kiln-demo-test-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.png = os.path.join(self.dir, "out", "losses.png")

    def start(self, *options):
        cmd = [sys.executable, DRIVER, "--kilnd", KILND, "--kilnctl", KILNCTL, "--device", "cpu", "--workers", "2",
               "--log-every", "2", "--status-every", "2", "--out", self.png, *options]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(self, proc):
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            self.fail(f"the driver hung ({TIMEOUT} s):\n{out}")
        return out

    def assert_nothing_left(self, out):
        """No kilnd or worker of this run outlives the driver, and its temporary directory is gone."""
        m = re.search(r"kilnd is ready on (\S+)", out)
        self.assertIsNotNone(m, "the driver named no socket:\n" + out)
        socket = m.group(1)
        deadline = time.monotonic() + 10  # a SIGKILLed child is reaped by its parent (the driver) only
        while processes_naming(socket) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = processes_naming(socket)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        self.assertEqual(left, [], f"processes outlived the driver:\n{out}")
        self.assertFalse(os.path.exists(os.path.dirname(os.path.dirname(socket))), "the driver left its directory")

    def test_two_workers_train_and_plot(self):
        proc = self.start("--steps", "6")
        out = self.finish(proc)
        print(out)
        self.assertEqual(proc.returncode, 0, out)
        for name in ("w0", "w1"):
            self.assertRegex(out, rf"(?m)^{name}  step    0/6  loss \d+\.\d+ +\d+ tokens/s$")
            self.assertRegex(out, rf"(?m)^{name}  step    5/6  loss \d+\.\d+ +\d+ tokens/s$")
            self.assertRegex(out, rf"(?m)^{name}  seed \d  loss \d+\.\d+ -> \d+\.\d+  fell")
        self.assertRegex(out, r"(?m)^plan cache: \d+ plans, \d+ hits, \d+ explorations, hit rate \d+\.\d%$")
        self.assertIn("OK: every worker's loss fell", out)
        self.assertIn(f"==> loss curves: {self.png}", out)
        with open(self.png, "rb") as f:
            png = f.read()
        self.assertEqual(png[:8], PNG_SIGNATURE)
        self.assertEqual(png[12:16], b"IHDR")
        self.assertEqual(png[-8:-4], b"IEND")
        self.assert_nothing_left(out)

    def test_a_failing_worker_fails_the_run(self):
        proc = self.start("--steps", "40", "--fail-worker", "w1", "--fail-step", "1")
        out = self.finish(proc)
        print(out)
        self.assertEqual(proc.returncode, 1, out)
        self.assertIn("FAILED: worker w1 (seed 1) crashed (exit status 1)", out)
        self.assertIn("failure injected at step 1", out)
        self.assertNotIn("OK: every worker's loss fell", out)
        self.assert_nothing_left(out)

    def test_ctrl_c_stops_everything(self):
        proc = self.start("--steps", "400")
        lines = []
        deadline = time.monotonic() + TIMEOUT
        for line in proc.stdout:  # until both workers have trained a step
            lines.append(line)
            if sum(1 for s in lines if re.match(r"w\d  step", s)) >= 2 or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        out = "".join(lines) + self.finish(proc)
        print(out)
        self.assertEqual(proc.returncode, -signal.SIGINT, out)  # died of the signal, as a shell expects
        self.assertIn("SIGINT: stopped the workers and the daemon", out)
        self.assert_nothing_left(out)


if __name__ == "__main__":
    unittest.main()

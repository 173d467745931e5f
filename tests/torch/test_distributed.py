"""kiln.all_reduce across daemons (docs/distributed.md): two kilnd of one distributed job, a
PyTorch worker on each. The values of every reduction, and a data-parallel training run (each
worker on half of every batch, gradients averaged with kiln.all_reduce) against one CPU model on
the whole batch. In process, kiln.all_reduce is the identity.
"""

import os
import re
import shutil
import tempfile
import time
import unittest

from test_remote import KILNCTL, KILND, Daemon, result_of, WORKER_TIMEOUT, PRELUDE  # noqa: F401

import subprocess
import sys
import textwrap

WORKER = PRELUDE + """
rank, socket = int(sys.argv[1]), sys.argv[2]
kiln.connect(socket, job="train")
"""


def served_port(daemon, timeout=60):
    """The rendezvous port rank 0's kilnd took (it was given port 0), from its start-up line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"rendezvous tcp:127\.0\.0\.1:(\d+) \(served here\)", daemon.log())
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise AssertionError("rank 0 did not report its rendezvous port:\n" + daemon.log())


@unittest.skipUnless(KILND and KILNCTL, "KILN_KILND and KILN_KILNCTL name the build's kilnd and kilnctl (ctest sets them)")
class DistributedTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="kiln-dist-", dir="/tmp" if os.path.isdir("/tmp") else None)
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        flags = lambda rank, port: ("--dist-job", "train", "--dist-rank", str(rank), "--dist-world-size", "2",
                                    "--dist-rendezvous", f"tcp:127.0.0.1:{port}", "--dist-timeout-ms", "20000")
        for sub in ("r0", "r1"):
            os.mkdir(os.path.join(self.root, sub))
        self.daemons = [Daemon(os.path.join(self.root, "r0"), flags(0, 0))]
        self.addCleanup(self.daemons[0].stop)
        port = served_port(self.daemons[0])
        self.daemons.append(Daemon(os.path.join(self.root, "r1"), flags(1, port)))
        self.addCleanup(self.daemons[1].stop)

    def run_workers(self, code):
        env = dict(os.environ)
        env.pop("KILN_SOCKET", None)
        procs = [subprocess.Popen([sys.executable, "-c", WORKER + textwrap.dedent(code), str(r), d.socket],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for r, d in enumerate(self.daemons)]
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=WORKER_TIMEOUT)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                self.fail("a worker hung:\n" + "\n".join(d.log() for d in self.daemons))
            self.assertEqual(p.returncode, 0, f"a worker failed:\n{out}\n{err}")
            results.append(result_of(out))
        return results

    def test_every_reduction(self):
        results = self.run_workers("""
            out = {}
            for op in ("sum", "mean", "min", "max", "prod"):
                t = (torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1) * (rank + 1)
                k = t.to("kiln")
                assert kiln.all_reduce(k, op) is k  # in place, as torch.distributed.all_reduce
                out[op] = k.cpu().tolist()
            ints = torch.tensor([5, -7, 9], dtype=torch.int64).to("kiln") * (rank + 2)
            out["int_mean"] = kiln.all_reduce(ints, "mean").cpu().tolist()
            emit(out)
            """)
        base = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
        expected = {"sum": [[3 * v for v in r] for r in base], "mean": [[1.5 * v for v in r] for r in base],
                    "min": base, "max": [[2 * v for v in r] for r in base], "prod": [[2 * v * v for v in r] for r in base],
                    "int_mean": [12, -17, 22]}  # (2x + 3x) / 2, truncated toward zero
        for r in results:
            self.assertEqual(r, expected)

    def test_data_parallel_training_matches_one_model_on_the_whole_batch(self):
        code = """
            def train(device, rows, reduce):
                torch.manual_seed(0)
                model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
                g = torch.Generator().manual_seed(1)
                losses = []
                for _ in range(8):
                    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
                    x, y = x[rows].to(device), y[rows].to(device)
                    opt.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    if reduce:
                        for p in model.parameters():
                            kiln.all_reduce(p.grad, "mean")
                        loss = kiln.all_reduce(loss.detach(), "mean")
                    opt.step()
                    losses.append(loss.item())
                return losses, [p.detach().cpu().flatten().tolist() for p in model.parameters()]
            half = slice(8 * rank, 8 * rank + 8)
            mine = train("kiln", half, True)
            whole = train("cpu", slice(0, 16), False)
            emit({"kiln": mine, "cpu": whole})
            """
        results = self.run_workers(code)
        for r in results:
            kiln_losses, kiln_params = r["kiln"]
            cpu_losses, cpu_params = r["cpu"]
            for a, b in zip(kiln_losses, cpu_losses):
                self.assertAlmostEqual(a, b, delta=1e-4 * max(1.0, abs(b)))
            for p, q in zip(kiln_params, cpu_params):
                for a, b in zip(p, q):
                    self.assertAlmostEqual(a, b, delta=1e-4)
        self.assertEqual(results[0]["kiln"][1], results[1]["kiln"][1])  # the replicas agree exactly


class InProcessTest(unittest.TestCase):
    def test_all_reduce_in_process_is_the_identity(self):
        code = """
            import torch, kiln
            t = torch.tensor([1.0, -2.0]).to("kiln")
            kiln.all_reduce(t, "sum")
            assert t.cpu().tolist() == [1.0, -2.0], t.cpu()
            try:
                kiln.all_reduce(t, "median")
                raise SystemExit("no error for an unknown op")
            except RuntimeError as e:
                assert "not one of sum, mean, min, max, prod" in str(e), e
            """
        env = dict(os.environ)
        env.pop("KILN_SOCKET", None)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                           timeout=WORKER_TIMEOUT, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()

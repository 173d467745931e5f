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

    def test_torch_distributed_process_group(self):
        store = os.path.join(self.root, "torch-store")
        results = self.run_workers(f"""
            import torch.distributed as dist
            dist.init_process_group("kiln", store=dist.FileStore({store!r}, 2), rank=rank, world_size=2)
            assert dist.get_backend() == "kiln", dist.get_backend()
            out = {{}}
            for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX),
                             ("min", dist.ReduceOp.MIN), ("product", dist.ReduceOp.PRODUCT)):
                t = torch.tensor([1.0, -2.0, 3.5]).to("kiln") * (rank + 1)
                dist.all_reduce(t, op=op)
                out[name] = t.cpu().tolist()
            ints = torch.tensor([[4, -6]], dtype=torch.int32).to("kiln") + rank
            dist.all_reduce(ints)
            out["ints"] = ints.cpu().tolist()
            b = torch.full((2, 2), float(rank + 10)).to("kiln")
            dist.broadcast(b, src=1)
            out["broadcast"] = b.cpu().tolist()
            flags = torch.tensor([rank == 0, False]).to("kiln")
            dist.broadcast(flags, src=0)
            out["broadcast_bool"] = flags.cpu().tolist()
            parts = [torch.zeros(3, dtype=torch.float64).to("kiln") for _ in range(2)]
            dist.all_gather(parts, (torch.arange(3, dtype=torch.float64) + 10 * rank).to("kiln"))
            out["all_gather"] = [p.cpu().tolist() for p in parts]
            flat = torch.empty(4, dtype=torch.int64).to("kiln")
            dist.all_gather_into_tensor(flat, torch.tensor([rank, -rank], dtype=torch.int64).to("kiln"))
            out["all_gather_into_tensor"] = flat.cpu().tolist()
            dist.barrier()
            mine = torch.empty(2).to("kiln")
            dist.reduce_scatter_tensor(mine, (torch.arange(4.0) + 100 * rank).to("kiln"))
            out["reduce_scatter_tensor"] = mine.cpu().tolist()
            part = torch.empty(2, 2, dtype=torch.int64).to("kiln")
            dist.reduce_scatter(part, [torch.full((2, 2), 10 * r + rank, dtype=torch.int64).to("kiln")
                                       for r in range(2)], op=dist.ReduceOp.MAX)
            out["reduce_scatter"] = part.cpu().tolist()
            any_flag = torch.empty(2, dtype=torch.bool).to("kiln")
            dist.reduce_scatter_tensor(any_flag, torch.tensor([rank == 0, False, False, rank == 1]).to("kiln"))
            out["reduce_scatter_bool"] = any_flag.cpu().tolist()
            try:
                dist.all_to_all_single(torch.empty(2).to("kiln"), torch.ones(2).to("kiln"))
                out["alltoall"] = "no error"
            except NotImplementedError as e:
                out["alltoall"] = str(e)
            try:
                kiln.distributed.KilnProcessGroup(1 - rank, 2)
                out["wrong_rank"] = "no error"
            except ValueError as e:
                out["wrong_rank"] = str(e)
            dist.destroy_process_group()
            emit(out)
            """)
        for rank, r in enumerate(results):
            self.assertEqual(r["sum"], [3.0, -6.0, 10.5])
            self.assertEqual(r["avg"], [1.5, -3.0, 5.25])
            self.assertEqual(r["max"], [2.0, -2.0, 7.0])
            self.assertEqual(r["min"], [1.0, -4.0, 3.5])
            self.assertEqual(r["product"], [2.0, 8.0, 24.5])
            self.assertEqual(r["ints"], [[9, -11]])
            self.assertEqual(r["broadcast"], [[11.0, 11.0], [11.0, 11.0]])
            self.assertEqual(r["broadcast_bool"], [True, False])
            self.assertEqual(r["all_gather"], [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]])
            self.assertEqual(r["all_gather_into_tensor"], [0, 0, 1, -1])
            # rank r's part of [0, 1, 2, 3] + [100, 101, 102, 103]
            self.assertEqual(r["reduce_scatter_tensor"], [[100.0, 102.0], [104.0, 106.0]][rank])
            self.assertEqual(r["reduce_scatter"], [[10 * rank + 1] * 2] * 2)  # max over ranks of 10 r' + rank'
            self.assertEqual(r["reduce_scatter_bool"], [[True, False], [False, True]][rank])  # sum of bools: any
            self.assertIn("alltoall is not supported", r["alltoall"])
            self.assertIn(f"this worker's kilnd job is rank {rank} of 2", r["wrong_rank"])

    def test_a_dead_peer_is_a_kiln_error_in_torch_distributed(self):
        # Rank 1's daemon is SIGKILLed after the job met: rank 0's next dist.all_reduce fails at its
        # read, naming rank 1, well within the timeout (20 s); the worker goes on.
        store = os.path.join(self.root, "torch-store")
        gone = os.path.join(self.root, "rank1-daemon-gone")
        env = dict(os.environ)
        env.pop("KILN_SOCKET", None)
        code = WORKER + textwrap.dedent(f"""
            import torch.distributed as dist
            dist.init_process_group("kiln", store=dist.FileStore({store!r}, 2), rank=rank, world_size=2)
            t = torch.ones(4).to("kiln")
            dist.all_reduce(t)
            first = t.cpu().tolist()
            if rank == 1:
                emit({{"first": first}})
                sys.exit(0)
            wait_for([{gone!r}], "rank 1's daemon to be killed")
            start = time.monotonic()
            try:
                dist.all_reduce(t)
                t.cpu()
                emit({{"first": first, "error": None}})
            except kiln.KilnError as e:
                after = torch.ones(2).to("kiln") * 3  # the worker goes on
                emit({{"first": first, "error": str(e), "seconds": time.monotonic() - start,
                       "after": after.cpu().tolist()}})
            """)
        procs = [subprocess.Popen([sys.executable, "-c", code, str(r), d.socket], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for r, d in enumerate(self.daemons)]
        try:
            out1, err1 = procs[1].communicate(timeout=WORKER_TIMEOUT)
            self.assertEqual(procs[1].returncode, 0, out1 + err1)
            self.daemons[1].kill()
            with open(gone, "w", encoding="utf-8"):
                pass
            out0, err0 = procs[0].communicate(timeout=WORKER_TIMEOUT)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        self.assertEqual(procs[0].returncode, 0, out0 + err0)
        r = result_of(out0)
        self.assertEqual(r["first"], [2.0] * 4)
        self.assertIsNotNone(r["error"], "no error after the peer's daemon died")
        self.assertIn("rank(s) 1 of job 'train' left", r["error"])
        self.assertLess(r["seconds"], 20 + 1)
        self.assertEqual(r["after"], [3.0, 3.0])

    def test_distributed_data_parallel_matches_one_model_on_the_whole_batch(self):
        # DistributedDataParallel unchanged on the kiln backend: its parameter check (all-gather,
        # broadcast, a read back into a CPU tensor from C++), the broadcast of rank 0's state (the
        # ranks start from different weights) and the reducer's bucketed all-reduces.
        store = os.path.join(self.root, "torch-store")
        results = self.run_workers(f"""
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel
            dist.init_process_group("kiln", store=dist.FileStore({store!r}, 2), rank=rank, world_size=2)

            def model(seed):
                torch.manual_seed(seed)
                return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))

            def train(net, device, rows):
                opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
                g = torch.Generator().manual_seed(3)
                losses = []
                for _ in range(6):
                    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
                    opt.zero_grad()
                    loss = torch.nn.functional.mse_loss(net(x[rows].to(device)), y[rows].to(device))
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                return losses

            local = model(seed=rank).to("kiln")
            ddp = DistributedDataParallel(local, bucket_cap_mb=0.0001)  # several buckets
            mine = train(ddp, "kiln", slice(4 * rank, 4 * rank + 4))
            whole = model(seed=0)
            train(whole, "cpu", slice(0, 8))
            emit({{"losses": mine, "params": [p.detach().cpu().flatten().tolist() for p in local.parameters()],
                   "cpu": [p.detach().flatten().tolist() for p in whole.parameters()]}})
            dist.destroy_process_group()
            """)
        self.assertEqual(results[0]["params"], results[1]["params"])  # the replicas agree exactly
        for r in results:
            for p, q in zip(r["params"], r["cpu"], strict=True):
                for a, b in zip(p, q, strict=True):
                    self.assertAlmostEqual(a, b, delta=1e-5)
        self.assertNotEqual(results[0]["losses"], results[1]["losses"])  # each rank saw its own half

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
    def run_in_process(self, code):
        """Runs `code` in a Python process of its own, its kiln tensors in process (no KILN_SOCKET)."""
        env = dict(os.environ)
        env.pop("KILN_SOCKET", None)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                           timeout=WORKER_TIMEOUT, check=False)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_process_group_in_process_is_a_world_of_one(self):
        code = """
            import torch, kiln
            import torch.distributed as dist
            dist.init_process_group("kiln", store=dist.HashStore(), rank=0, world_size=1)
            t = torch.tensor([1.0, -2.0]).to("kiln")
            dist.all_reduce(t)
            dist.broadcast(t, src=0)
            assert t.cpu().tolist() == [1.0, -2.0], t.cpu()
            try:
                dist.all_reduce(torch.ones(2))
                raise SystemExit("no error for a CPU tensor")
            except ValueError as e:
                assert "a tensor is on cpu, not kiln" in str(e), e
            dist.destroy_process_group()
            try:
                kiln.distributed.KilnProcessGroup(0, 2)
                raise SystemExit("no error for a world of two in process")
            except ValueError as e:
                assert "this worker's kilnd job is rank 0 of 1" in str(e), e
            """
        self.run_in_process(code)

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
        self.run_in_process(code)


if __name__ == "__main__":
    unittest.main()

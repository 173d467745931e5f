"""The benchmark scripts still run: bench/layers/bench_layers.py --quick (small shapes, not a
benchmark) with this build's package, every workload measured on both sides, its outputs checked
against PyTorch's, and no op falling back to the CPU.

bench/torch/bench_torch.py is left out here: its torch.compile variant compiles the models with
inductor, minutes on 2 cores; its smoke run is `bench/torch/run.sh --quick`."""

import os
import re
import subprocess
import sys
import unittest

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
LAYERS = os.path.join(REPO, "bench", "layers", "bench_layers.py")
WORKLOADS = ("conv2d_fwd", "conv2d_bwd", "maxpool_fwd", "maxpool_bwd", "layernorm_fwd", "layernorm_bwd",
             "batchnorm_eval", "embedding_bwd", "sort")


class LayerBenchmark(unittest.TestCase):
    def test_quick_run_measures_and_checks_every_workload(self):
        # The package comes from PYTHONPATH (tests/torch/CMakeLists.txt); the worker inherits it.
        proc = subprocess.run([sys.executable, LAYERS, "--quick", "--threads", "1"], capture_output=True, text=True,
                              timeout=240)
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
        lines = proc.stdout.splitlines()
        for workload in WORKLOADS:
            for peer in ("kiln", "torch-cpu"):
                found = [line for line in lines if line.startswith(f"peer={peer} workload={workload} ")]
                self.assertEqual(len(found), 1, f"{peer} {workload}: {proc.stdout[-2000:]}")
                self.assertRegex(found[0], r" ns_per_elem=[0-9.e+-]+ gbps=0 threads=1 ")
                self.assertIn(" fallbacks=0", found[0])
            self.assertTrue(any(re.match(rf"# check workload={workload} threads=1 .* ok=1$", line) for line in lines),
                            f"{workload}: no passing check line in {proc.stdout[-2000:]}")
            self.assertTrue(any(line.startswith(f"# target workload={workload} threads=1 ") for line in lines))


if __name__ == "__main__":
    unittest.main()

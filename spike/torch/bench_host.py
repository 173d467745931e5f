"""Host cost of one small aten op (a + b, 4 floats) called from C++ (torch.ops.kiln_spike.bench_add,
20000 calls a round, 9 rounds interleaved): CPU eager, kiln, and (lazy) kiln's inner tensors with
functionalization skipped. python bench_host.py strided|lazy"""

import sys
import warnings

import torch

import kiln_spike

warnings.simplefilter("ignore")
variant = sys.argv[1] if len(sys.argv) > 1 else "lazy"
kiln_spike.load(variant)
a, b = torch.randn(4), torch.randn(4)
ka, kb = a.to("kiln"), b.to("kiln")
res = {"cpu": [], "kiln": [], "kiln inner": []}
for _ in range(9):
    res["cpu"].append(torch.ops.kiln_spike.bench_add(a, b, 20000))
    res["kiln"].append(torch.ops.kiln_spike.bench_add(ka, kb, 20000))
    if variant == "lazy":
        res["kiln inner"].append(torch.ops.kiln_spike.bench_add_inner(ka, kb, 20000))
for k, x in res.items():
    if x:
        x.sort()
        print(f"[{variant}] {k:10}: min {x[0]:6.0f} ns/op, median {x[len(x) // 2]:6.0f} ns/op")

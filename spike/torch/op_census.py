"""Which aten ops reach the backend in one training step of a small MLP (Linear-ReLU-Linear,
cross-entropy, AdamW), as CPU fallbacks: the list kiln must lower for zero fallbacks.
python op_census.py strided|lazy"""

import sys
import warnings

import torch

import kiln_spike

variant = sys.argv[1] if len(sys.argv) > 1 else "lazy"
kiln_spike.load(variant)
warnings.simplefilter("ignore")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
model.to("kiln")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(16, 32).to("kiln")
y = torch.randint(0, 8, (16,)).to("kiln")
for step in range(2):  # step 0 creates the optimizer state; count step 1 only
    kiln_spike.reset_stats()
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
stats = kiln_spike.fallback_stats()
print(f"[{variant}] one MLP+AdamW step: {len(stats)} ops fell back, {sum(stats.values())} calls "
      f"(loss {loss.item():.4f})")
for k, v in sorted(stats.items()):
    print(f"    {v:4d}  {k}")

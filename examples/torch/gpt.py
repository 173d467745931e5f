"""A small character-level GPT that trains on the `kiln` device or on the CPU from the same seed.

    python gpt.py --device kiln --steps 200          # PYTHONPATH=<build>/python for `import kiln`
    python gpt.py --device cpu --steps 200

The model is written out here (no nn.MultiheadAttention, no scaled_dot_product_attention): a token
embedding plus a learned position embedding, `--layers` pre-LayerNorm blocks of causal
self-attention (matmul, masked_fill, softmax) and a GELU MLP, a final LayerNorm and a linear head;
dropout 0. It trains with AdamW and cross-entropy on data/play.txt (a generated text, see
data/make_text.py), one character a token.

Both devices start from identical weights and see identical batches: the weights are drawn on the
CPU from `--seed` and the model is then moved (`.to(device)`); the batches come from a CPU
generator seeded from `--seed` and are moved each step. The only difference between the runs is
then the arithmetic (float32 sums in another order), so the loss curves agree closely.

Importable: `build_model(...)`, `get_batch(...)` and `train(device, steps, seed, ...)`, which
returns the list of losses (one per step); `--json` prints them with the timings and, on kiln,
`kiln.stats()` (the ops that ran on the CPU).
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import example_common

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "play.txt")


def load_text(path=DATA):
    """The corpus as a 1-D int64 tensor of character ids, and the vocabulary (a sorted string)."""
    with open(path, encoding="ascii") as f:
        text = f.read()
    vocab = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.int64), vocab


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        assert width % heads == 0, "--width must be a multiple of --heads"
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        # True above the diagonal: position t may not look at positions after t. A buffer, so
        # that it moves with the model and the forward pass makes no tensor of its own.
        self.register_buffer("future", torch.ones(context, context).triu(1).bool(), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, h, c // h).transpose(1, 2)  # (b, h, t, c/h)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))  # (b, h, t, t)
        scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
        y = torch.matmul(F.softmax(scores, dim=-1), v)  # (b, h, t, c/h)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, context, layers, width, heads):
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.Sequential(*[Block(width, heads, context) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)
        for name, p in self.named_parameters():  # GPT-2's initialisation, scaled down
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions[:t]
        logits = self.head(self.ln(self.blocks(x)))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(vocab_size, context=16, layers=2, width=32, heads=4, seed=0):
    """A GPT with weights drawn on the CPU from `seed` (the same weights whatever device it goes to)."""
    torch.manual_seed(seed)
    return GPT(vocab_size, context, layers, width, heads)


def get_batch(data, batch, context, generator):
    """`batch` random windows of `context` characters and the characters that follow them (CPU)."""
    starts = torch.randint(len(data) - context, (batch,), generator=generator)
    x = torch.stack([data[s:s + context] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + context] for s in starts.tolist()])
    return x, y


def train(device, steps, seed=0, batch=8, context=16, layers=2, width=32, heads=4, lr=3e-3, log_every=0,
          timings=None, on_step=None):
    """Trains a fresh model for `steps` steps on `device`; returns the loss of each step (floats).

    `log_every` > 0 prints step, loss and tokens/s every that many steps. `timings`, a list, gets
    each step's seconds (the loss read included: it waits for the step to finish). `on_step(i,
    loss, seconds)` is called after every step."""
    device = example_common.device(device)
    data, vocab = load_text()
    model = build_model(len(vocab), context, layers, width, heads, seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed + 1)

    def step():
        x, y = get_batch(data, batch, context, generator)
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return example_common.train_steps(steps, step, batch * context, "tokens", log_every, timings, on_step)


def main(argv=None):
    p = example_common.parser(__doc__.split("\n\n")[0])
    example_common.add_gpt_arguments(p)
    args = p.parse_args(argv)
    return example_common.run(args, train, example_common.gpt_options(args), args.batch * args.context, "tokens")


if __name__ == "__main__":
    main()

"""A small CNN that trains on the `kiln` device or on the CPU from the same seed.

    python cnn.py --device kiln --steps 200          # PYTHONPATH=<build>/python for `import kiln`
    python cnn.py --device cpu --steps 200

Two Conv2d-BatchNorm2d-ReLU-MaxPool2d stages and a Linear classifier, trained with SGD (momentum)
and cross-entropy on synthetic images: noisy stripes in one of four orientations (horizontal,
vertical, and the two diagonals), with a random period and phase; the class is the orientation.
The images are generated on the CPU from the seed, so the data set is the same on every machine.

As in gpt.py, the weights are drawn on the CPU from `--seed` before the model moves to the device,
and each batch comes from a CPU generator, so both devices see the same numbers and only the
float32 arithmetic differs. Importable: `build_model(...)`, `make_images(...)` and
`train(device, steps, seed, ...)`, which returns the loss of each step.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import example_common

CLASSES = 4  # stripe orientations: horizontal, vertical, diagonal, anti-diagonal


def make_images(n, size, generator, noise=1.0):
    """n images (n, 1, size, size) of noisy stripes and their orientation classes (n,), on the CPU."""
    labels = torch.randint(CLASSES, (n,), generator=generator)
    period = 2.5 + 3.0 * torch.rand(n, generator=generator)           # pixels per stripe pair
    phase = 2 * math.pi * torch.rand(n, generator=generator)
    rows = torch.arange(size, dtype=torch.float32).view(1, size, 1)
    cols = torch.arange(size, dtype=torch.float32).view(1, 1, size)
    # The coordinate along which the stripes vary, per class: y, x, x + y, x - y.
    dy = torch.tensor([1.0, 0.0, 1.0, -1.0])[labels].view(n, 1, 1)
    dx = torch.tensor([0.0, 1.0, 1.0, 1.0])[labels].view(n, 1, 1)
    along = (rows * dy + cols * dx) / dy.abs().add(dx.abs()).sqrt()  # unit speed along the normal
    images = torch.sin(2 * math.pi * along / period.view(n, 1, 1) + phase.view(n, 1, 1))
    images = images + noise * torch.randn(n, size, size, generator=generator)
    return images.unsqueeze(1), labels


class CNN(nn.Module):
    def __init__(self, size=16, channels=8):
        super().__init__()
        assert size % 4 == 0, "--size must be a multiple of 4 (two 2x2 poolings)"
        c1, c2 = channels, 2 * channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(c2 * (size // 4) ** 2, CLASSES)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def build_model(size=16, channels=8, seed=0):
    """A CNN with weights drawn on the CPU from `seed` (the same weights whatever device it goes to)."""
    torch.manual_seed(seed)
    return CNN(size, channels)


def train(device, steps, seed=0, batch=16, size=16, channels=8, noise=1.0, lr=0.05, momentum=0.9, log_every=0,
          timings=None):
    """Trains a fresh model for `steps` steps on `device`; returns the loss of each step (floats).

    `log_every` > 0 prints step, loss and images/s every that many steps. `timings`, a list, gets
    each step's seconds (the loss read included: it waits for the step to finish)."""
    device = example_common.device(device)
    model = build_model(size, channels, seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed + 1)

    def step():
        x, y = make_images(batch, size, generator, noise)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return example_common.train_steps(steps, step, batch, "images", log_every, timings)


def main(argv=None):
    p = example_common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=16, help="image side in pixels (a multiple of 4)")
    p.add_argument("--channels", type=int, default=8, help="channels of the first convolution (the second has twice)")
    p.add_argument("--noise", type=float, default=1.0, help="the pixel noise's standard deviation (the stripes': 0.7)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    args = p.parse_args(argv)
    options = dict(batch=args.batch, size=args.size, channels=args.channels, noise=args.noise, lr=args.lr,
                   momentum=args.momentum)
    return example_common.run(args, train, options, args.batch, "images")


if __name__ == "__main__":
    main()

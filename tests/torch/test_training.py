"""Autograd and torch.optim on kiln: a small MLP's gradients and optimizer steps match the CPU's."""

import copy
import unittest

import torch

import kiln
from kiln_testing import KILN, KilnTestCase


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 2))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(10, 8, generator=g), torch.randn(10, 2, generator=g)


class TrainingTest(KilnTestCase):
    def setUp(self):
        kiln.reset_stats()

    def run_steps(self, make_optimizer, steps):
        """The parameters after `steps` optimizer steps, on the CPU and on kiln."""
        cpu_model = mlp()
        kiln_model = copy.deepcopy(cpu_model).to(KILN)
        x, y = data()
        kx, ky = x.to(KILN), y.to(KILN)
        for model, inp, target in ((cpu_model, x, y), (kiln_model, kx, ky)):
            opt = make_optimizer(model.parameters())
            for _ in range(steps):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(inp), target)
                loss.backward()
                opt.step()
        return cpu_model, kiln_model, opt

    def test_gradients_match(self):
        cpu_model = mlp()
        kiln_model = copy.deepcopy(cpu_model).to(KILN)
        x, y = data()
        cpu_loss = torch.nn.functional.mse_loss(cpu_model(x), y)
        kiln_loss = torch.nn.functional.mse_loss(kiln_model(x.to(KILN)), y.to(KILN))
        cpu_loss.backward()
        kiln_loss.backward()
        self.assertAlmostEqual(kiln_loss.item(), cpu_loss.item(), places=5)
        for (name, p), q in zip(kiln_model.named_parameters(), cpu_model.parameters()):
            self.assertIsNotNone(p.grad, name)
            self.assertEqual(p.grad.device.type, "kiln", name)
            self.assertClose(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
        self.assertEqual(kiln.stats(), {}, "the MLP's forward and backward fell back to the CPU")

    def test_cross_entropy_gradients_match(self):
        torch.manual_seed(0)
        cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
        kiln_model = copy.deepcopy(cpu_model).to(KILN)
        x, classes = torch.randn(12, 8), torch.randint(0, 5, (12,))
        classes[3] = -100  # the default ignore_index: counts for nothing
        cpu_loss = torch.nn.functional.cross_entropy(cpu_model(x), classes)
        kiln_loss = torch.nn.functional.cross_entropy(kiln_model(x.to(KILN)), classes.to(KILN))
        cpu_loss.backward()
        kiln_loss.backward()
        self.assertAlmostEqual(kiln_loss.item(), cpu_loss.item(), places=5)
        for p, q in zip(kiln_model.parameters(), cpu_model.parameters()):
            self.assertClose(p.grad, q.grad, rtol=1e-4, atol=1e-6)
        self.assertEqual(kiln.stats(), {}, "cross-entropy fell back to the CPU")

    def test_sgd_momentum_step(self):
        cpu_model, kiln_model, _ = self.run_steps(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 2)
        for p, q in zip(kiln_model.parameters(), cpu_model.parameters()):
            self.assertClose(p.detach(), q.detach(), rtol=1e-4, atol=1e-6)

    def test_adamw_step(self):
        cpu_model, kiln_model, opt = self.run_steps(lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1), 2)
        for p, q in zip(kiln_model.parameters(), cpu_model.parameters()):
            self.assertClose(p.detach(), q.detach(), rtol=1e-4, atol=1e-6)
        # The optimizer's state stays on the device between steps.
        state = opt.state[next(kiln_model.parameters())]
        self.assertEqual(state["exp_avg"].device.type, "kiln")
        self.assertEqual(state["exp_avg_sq"].device.type, "kiln")

    def test_loss_falls(self):
        _, kiln_model, _ = self.run_steps(lambda p: torch.optim.Adam(p, lr=0.01), 0)
        opt = torch.optim.Adam(kiln_model.parameters(), lr=0.01)
        x, y = (t.to(KILN) for t in data())
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(kiln_model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertLess(losses[-1], losses[0])


if __name__ == "__main__":
    unittest.main()

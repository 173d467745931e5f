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



class FusedOptimizerTest(KilnTestCase):
    """torch.optim's fused Adam and AdamW (fused=True) on kiln against the CPU's fused kernels."""

    def setUp(self):
        kiln.reset_stats()

    def compare(self, make_optimizer, steps=3):
        cpu_model = mlp()
        kiln_model = copy.deepcopy(cpu_model).to(KILN)
        x, y = data()
        opts = []
        for model, inp, target in ((cpu_model, x, y), (kiln_model, x.to(KILN), y.to(KILN))):
            opt = make_optimizer(model.parameters())
            for _ in range(steps):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(inp), target).backward()
                opt.step()
            opts.append(opt)
        for (name, p), q in zip(kiln_model.named_parameters(), cpu_model.parameters()):
            self.assertClose(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
            kiln_state, cpu_state = opts[1].state[p], opts[0].state[q]
            self.assertEqual(set(kiln_state), set(cpu_state), name)
            for key, value in cpu_state.items():
                self.assertEqual(kiln_state[key].device.type, "kiln", f"{name} {key}")
                self.assertClose(kiln_state[key], value, rtol=1e-5, atol=1e-7, msg=f"{name} {key}")
        self.assertEqual(kiln.stats(), {}, "the fused optimizer fell back to the CPU")
        return kiln_model

    def test_adamw(self):
        self.compare(lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True))

    def test_adam_with_weight_decay(self):
        self.compare(lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.05, fused=True))

    def test_amsgrad(self):
        self.compare(lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.9), amsgrad=True, fused=True), steps=4)
        self.compare(lambda p: torch.optim.AdamW(p, lr=0.02, amsgrad=True, fused=True), steps=4)

    def test_maximize(self):
        self.compare(lambda p: torch.optim.AdamW(p, lr=0.01, maximize=True, fused=True))

    def test_tensor_lr(self):
        self.compare(lambda p: torch.optim.AdamW(p, lr=torch.tensor(0.01), fused=True))

    def test_a_view_of_a_parameter_sees_the_step(self):
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 3).to(KILN)
        row = layer.weight.detach()[1]  # a view, taken before the step
        opt = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True)
        layer(torch.randn(5, 4).to(KILN)).sum().backward()
        before = layer.weight.detach().cpu()
        opt.step()
        after = layer.weight.detach().cpu()
        self.assertFalse(torch.equal(before, after), "the step changed nothing")
        self.assertTrue(torch.equal(row.cpu(), after[1]), "a view of the parameter kept the old value")

    def grad_scaler_inputs(self, device):
        g = torch.Generator().manual_seed(3)
        tensors = [[torch.randn(5, 3, generator=g), torch.randn(7, generator=g)] for _ in range(4)]
        tensors[3] = [t.abs() for t in tensors[3]]  # exp_avg_sqs: a running mean of squares
        steps = [torch.tensor(2.0), torch.tensor(2.0)]
        return [[t.to(device) for t in ts] for ts in tensors] + [[s.to(device) for s in steps]]

    def test_grad_scale_and_found_inf(self):
        """GradScaler's arguments: grads divided by grad_scale (and written back); found_inf != 0 skips the step."""
        for found in (0.0, 1.0):
            results = []
            for device in ("cpu", KILN):
                params, grads, exp_avgs, exp_avg_sqs, steps = self.grad_scaler_inputs(device)
                torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=0.01, beta1=0.9,
                                    beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                                    grad_scale=torch.tensor(4.0).to(device), found_inf=torch.tensor(found).to(device))
                results.append(params + grads + exp_avgs + exp_avg_sqs)
            untouched = self.grad_scaler_inputs("cpu")
            for i, (k, c) in enumerate(zip(results[1], results[0])):
                self.assertFalse(c.isnan().any(), f"tensor {i}")
                self.assertClose(k, c, rtol=1e-5, atol=1e-7, msg=f"found_inf={found} tensor {i}")
                if found:
                    self.assertTrue(torch.equal(c, sum(untouched[:4], [])[i]), "the CPU skipped the step")

    def test_list_lengths_are_checked(self):
        params, grads, exp_avgs, exp_avg_sqs, steps = self.grad_scaler_inputs(KILN)
        with self.assertRaisesRegex(RuntimeError, "differ in length"):
            torch._fused_adam_(params, grads[:1], exp_avgs, exp_avg_sqs, [], steps, lr=0.01, beta1=0.9, beta2=0.999,
                               weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)

    def test_functionalized_cpu_tensors_keep_working(self):
        """kiln replaces PyTorch's Functionalize kernel of these ops process-wide: CPU tensors under
        torch.func.functionalize still get the CPU's result (and no longer the assertion PyTorch's own
        kernel raised for an empty max_exp_avg_sqs)."""
        def step(params, grads, exp_avgs, exp_avg_sqs, steps):
            torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=0.01, beta1=0.9, beta2=0.999,
                                weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
            return params, exp_avgs, exp_avg_sqs

        eager = self.grad_scaler_inputs("cpu")
        before = self.grad_scaler_inputs("cpu")
        untouched = [before[0], before[2], before[3]]
        step(*eager)
        functional = self.grad_scaler_inputs("cpu")
        out = torch.func.functionalize(step)(*functional)
        for got, want, before in zip(sum(out, []), eager[0] + eager[2] + eager[3], sum(untouched, [])):
            self.assertTrue(torch.equal(got, want))
            self.assertFalse(torch.equal(got, before), "the step changed nothing")

if __name__ == "__main__":
    unittest.main()

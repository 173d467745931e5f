"""Device basics: the device registers as "kiln", factories, transfers both ways, modules."""

import copy
import io
import unittest

import torch

import kiln
from kiln_testing import KILN, KilnTestCase


class DeviceTest(KilnTestCase):
    def test_registered(self):
        self.assertEqual(torch.device("kiln").type, "kiln")
        self.assertTrue(torch.kiln.is_available())
        self.assertEqual(torch.kiln.device_count(), 1)
        self.assertEqual(torch._C._get_privateuse1_backend_name(), "kiln")

    def test_factories(self):
        x = torch.ones(3, device="kiln")
        self.assertEqual(x.device, torch.device("kiln", 0))
        self.assertTrue(x.is_kiln)
        self.assertEqual(x.cpu().tolist(), [1.0, 1.0, 1.0])
        self.assertEqual(torch.zeros(2, 2, device=KILN).cpu().tolist(), [[0, 0], [0, 0]])
        self.assertEqual(torch.full((2,), 7, dtype=torch.int32, device=KILN).cpu().tolist(), [7, 7])
        self.assertEqual(torch.empty(4, 5, device=KILN).shape, (4, 5))

    def test_to_and_back(self):
        a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        k = a.to("kiln")
        self.assertEqual(k.device.type, "kiln")
        self.assertTrue(torch.equal(k.cpu(), a))
        self.assertTrue(torch.equal(a.kiln().to("cpu"), a))

    def test_inference_mode(self):
        # Under torch.inference_mode, PyTorch's functionalization cannot wrap views
        # ("Cannot set version_counter for inference tensor") nor copy a kiln tensor into a CPU
        # one; kiln runs the calls that touch it outside inference mode, under no_grad.
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
        x = torch.randn(4, 5)
        with torch.no_grad():
            want = model(x)
        on_kiln = copy.deepcopy(model).to(KILN)
        with torch.inference_mode():
            self.assertTrue(torch.is_inference_mode_enabled())
            k = x.to(KILN)
            y = on_kiln(k)
            self.assertEqual(y.device.type, "kiln")
            self.assertFalse(y.requires_grad)
            got = torch.empty(4, 3)  # an inference tensor, written in inference mode
            got.copy_(y)
            self.assertTrue(got.is_inference())
            k.mul_(2).add_(1)  # in place on a tensor moved to kiln inside the block
            t = k.t().contiguous()
            self.assertTrue(torch.is_inference_mode_enabled(), "the block's mode is intact")
        self.assertFalse(torch.is_inference_mode_enabled())
        self.assertTrue(torch.allclose(got, want, atol=1e-6))
        self.assertTrue(torch.allclose(y.cpu(), want, atol=1e-6))
        self.assertTrue(torch.equal(t.cpu(), (x * 2 + 1).t()))

        @torch.inference_mode()
        def predict(inp):
            return on_kiln(inp.to(KILN)).cpu()

        self.assertTrue(torch.allclose(predict(x), want, atol=1e-6))
        # Tensors and modules of the block itself, moved to kiln inside it.
        with torch.inference_mode():
            x_in = x.clone()
            self.assertTrue(x_in.is_inference())
            inner = torch.nn.Linear(5, 2)
            inner_want = inner(x_in)
            inner = inner.to(KILN)
            k_in = x_in.to(KILN)
            self.assertTrue(torch.allclose(inner(k_in).cpu(), inner_want, atol=1e-6))
            self.assertTrue(torch.equal((k_in.t() * 3).cpu(), x_in.t() * 3))
        # Nothing leaks out of the block: training afterwards records gradients as usual.
        out = on_kiln(x.to(KILN)).sum()
        out.backward()
        self.assertIsNotNone(on_kiln[0].weight.grad)

    def test_scalar_tensors(self):
        s = torch.tensor(2.5).to(KILN)
        self.assertEqual(s.shape, ())
        self.assertEqual(s.item(), 2.5)
        self.assertEqual((s * 2).item(), 5.0)

    def test_module_to(self):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        x = torch.randn(3, 4)
        want = model(x)
        model.to("kiln")
        self.assertEqual(model.weight.device.type, "kiln")
        self.assertClose(model(x.to("kiln")), want.detach(), rtol=1e-5, atol=1e-6)

    def test_print(self):
        s = repr(torch.tensor([1.0, 2.0], device="kiln"))
        self.assertIn("device='kiln:0'", s)
        self.assertIn("1.", s)

    def test_save_load_deepcopy(self):
        t = torch.tensor([1.0, 2.0, 3.0]).to(KILN)
        buf = io.BytesIO()
        torch.save(t, buf)
        buf.seek(0)
        back = torch.load(buf)
        self.assertEqual(back.device.type, "kiln")
        self.assertTrue(torch.equal(back.cpu(), t.cpu()))
        self.assertTrue(torch.equal(copy.deepcopy(t).cpu(), t.cpu()))

    def test_synchronize(self):
        x = torch.ones(2, device=KILN) + 1
        torch.kiln.synchronize()
        kiln.synchronize()
        self.assertEqual(x.cpu().tolist(), [2.0, 2.0])

    def test_backward_runs_on_the_calling_thread(self):
        # A backward (or autograd.grad) from kiln roots runs on the thread that called it (so on
        # the forward's kiln stream, python/kiln/_patches.py), with the right gradients; the
        # caller's multithreading setting is restored afterwards.
        import threading

        def threads_of(run):
            seen = set()
            x = torch.randn(3, 4, device=KILN, requires_grad=True)
            y = (x * x).exp()
            y.register_hook(lambda g: seen.add(threading.current_thread().name))
            run(y.sum(), x)
            return seen, x

        seen, x = threads_of(lambda loss, x: loss.backward())
        self.assertEqual(seen, {threading.current_thread().name})
        want = x.detach().cpu()
        self.assertClose(x.grad, 2 * want * (want * want).exp(), rtol=1e-5, atol=1e-5)
        seen, _ = threads_of(lambda loss, x: torch.autograd.grad(loss, [x]))
        self.assertEqual(seen, {threading.current_thread().name})
        self.assertTrue(torch._C._is_multithreading_enabled())

        # From another Python thread too: its own stream carries forward and backward.
        result = {}
        worker = threading.Thread(target=lambda: result.update(seen=threads_of(lambda loss, x: loss.backward())[0]),
                                  name="kiln-test-worker")
        worker.start()
        worker.join()
        self.assertEqual(result["seen"], {"kiln-test-worker"})

        # With multithreading already off, it stays off.
        with torch.autograd.set_multithreading_enabled(False):
            threads_of(lambda loss, x: loss.backward())
            self.assertFalse(torch._C._is_multithreading_enabled())
        self.assertTrue(torch._C._is_multithreading_enabled())


if __name__ == "__main__":
    unittest.main()

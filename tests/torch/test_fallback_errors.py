"""The CPU fallback (counted, warned once per op) and how errors reach Python."""

import copy
import unittest
import warnings

import torch

import kiln
from kiln_testing import KILN, KilnTestCase


class FallbackTest(KilnTestCase):
    def setUp(self):
        kiln.reset_stats()

    def test_unlowered_op_runs_on_the_cpu_and_is_counted(self):
        cpu = torch.tensor([[3.0, 1.0, 2.0], [0.5, -1.0, 4.0]])
        k = cpu.to(KILN)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.cumprod(k, 1)
            torch.cumprod(k, 0)
        self.assertClose(got, torch.cumprod(cpu, 1))
        stats = kiln.stats()  # counted under the overload that ran: cumprod's out= form
        self.assertEqual(stats.get("aten::cumprod.out"), 2, stats)
        messages = [str(w.message) for w in caught if "cumprod" in str(w.message)]
        self.assertEqual(len(messages), 1, messages)  # warned once per op name
        self.assertIn("not lowered", messages[0])
        kiln.reset_stats()
        self.assertEqual(kiln.stats(), {})

    def test_fallback_result_stays_on_kiln_and_feeds_lowered_ops(self):
        cpu = torch.randn(4, 4)
        k = cpu.to(KILN)
        self.assertClose(torch.cumprod(k, 1) * 2, torch.cumprod(cpu, 1) * 2)

    def test_convolution_kiln_cannot_express_runs_on_the_cpu_forward_and_backward(self):
        # aten::convolution's last step for an out-of-tree device is convolution_overrideable,
        # whose default kernel raises; kiln's kernel runs what kiln cannot express on the CPU,
        # counted: here a transposed convolution whose output_padding reaches its stride.
        torch.manual_seed(0)
        conv = torch.nn.ConvTranspose2d(2, 3, 3, stride=1, dilation=2, output_padding=1)
        x = torch.randn(2, 2, 5, 5)
        kconv = copy.deepcopy(conv).to(KILN)
        want = conv(x)
        got = kconv(x.to(KILN))
        self.assertClose(got, want.detach(), atol=1e-5)
        want.sum().backward()
        got.sum().backward()
        self.assertClose(kconv.weight.grad, conv.weight.grad, atol=1e-5)
        self.assertClose(kconv.bias.grad, conv.bias.grad, atol=1e-5)
        stats = kiln.stats()
        self.assertEqual(stats.get("aten::convolution_overrideable"), 1, stats)
        self.assertEqual(stats.get("aten::convolution_backward_overrideable"), 1, stats)


class ErrorTest(KilnTestCase):
    def test_kiln_error_is_a_runtime_error_with_kilns_message(self):
        self.assertTrue(issubclass(kiln.KilnError, RuntimeError))
        a = torch.ones(2, 3, device=KILN)
        b = torch.ones(4, 5, device=KILN)
        # Shapes kiln's builder rejects when the op is queued: its message, its error code.
        with self.assertRaises(kiln.KilnError) as ctx:
            torch.mm(a, b)
        self.assertIn("kiln: mm:", str(ctx.exception))
        self.assertIn("Matmul", str(ctx.exception))
        self.assertIsInstance(ctx.exception.error_code, int)

    def test_unsupported_dtype(self):
        with self.assertRaises(kiln.KilnError) as ctx:
            torch.ones(2, dtype=torch.complex64, device=KILN)
        self.assertIn("Unsupported", str(ctx.exception))

    def test_lazy_failure_is_reported_at_the_read(self):
        # An op kiln accepts when queued but fails to run: no error until something waits on it.
        x = torch.ones(3, device=KILN)
        y = torch.ops.kiln._failing_op(x)
        with self.assertRaises(kiln.KilnError) as ctx:
            y.cpu()
        self.assertIn("kiln_test_failure", str(ctx.exception))

    def test_mixing_devices_is_an_error(self):
        with self.assertRaisesRegex(RuntimeError, "same device"):
            torch.ones(3, device=KILN) + torch.ones(3)

    def test_process_goes_on_after_an_error(self):
        with self.assertRaises(kiln.KilnError):
            torch.ones(2, dtype=torch.complex64, device=KILN)
        with self.assertRaises(kiln.KilnError):
            torch.ops.kiln._failing_op(torch.ones(3, device=KILN)).cpu()
        self.assertEqual((torch.ones(2, device=KILN) * 3).cpu().tolist(), [3.0, 3.0])


if __name__ == "__main__":
    unittest.main()

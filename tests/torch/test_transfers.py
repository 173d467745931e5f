"""Transfers: every dtype kiln holds, both ways, and the casts on the way."""

import unittest

import torch

import kiln
from kiln_testing import KILN, KilnTestCase

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
DTYPES = FLOATS + INTS + [torch.bool]


def sample(dtype):
    values = torch.tensor([[0, 1, 2, 3], [5, 7, 11, 100]])
    if dtype == torch.bool:
        return values % 2 == 1
    if dtype.is_floating_point:
        return (values.to(torch.float64) / 4 - 3).to(dtype)
    return values.to(dtype)


class TransferTest(KilnTestCase):
    def test_round_trip_every_dtype(self):
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                cpu = sample(dtype)
                k = cpu.to(KILN)
                self.assertEqual(k.dtype, dtype)
                back = k.cpu()
                self.assertEqual(back.dtype, dtype)
                self.assertTrue(torch.equal(back, cpu))

    def test_cast_on_the_way_in_and_out(self):
        for src in DTYPES:
            for dst in DTYPES:
                with self.subTest(src=src, dst=dst):
                    cpu = sample(src)
                    self.assertTrue(torch.equal(cpu.to(KILN, dtype=dst).cpu(), cpu.to(dst)))
                    self.assertTrue(torch.equal(cpu.to(KILN).to("cpu", dtype=dst), cpu.to(dst)))

    def test_cast_on_kiln(self):
        for src in DTYPES:
            for dst in DTYPES:
                with self.subTest(src=src, dst=dst):
                    cpu = sample(src)
                    if src.is_floating_point and dst == torch.uint8:
                        cpu = cpu.abs()  # a negative float to uint8 is undefined in PyTorch
                    got = cpu.to(KILN).to(dst)
                    self.assertEqual(got.device.type, "kiln")
                    self.assertClose(got, cpu.to(dst), rtol=0, atol=0)

    def test_a_cast_on_kiln_is_tracked_like_any_result(self):
        # PyTorch's functionalization wrapped _to_copy's result only for XLA and Lazy: a kiln
        # tensor from .to(dtype) came back untracked, and an in-place op on it with a tracked
        # operand failed ("mutating a non-functional tensor with a functional tensor").
        ints = torch.tensor([1, 2], dtype=torch.int32).to(KILN)
        for cast in (ints.float(), ints.to(torch.float64), ints.to(KILN, dtype=torch.float32), ints.bool().to(torch.uint8)):
            with self.subTest(dtype=cast.dtype):
                self.assertTrue(torch._is_functional_tensor(cast))
                before = cast.cpu()
                cast.add_(torch.ones(2, dtype=cast.dtype).to(KILN))
                self.assertEqual(cast.cpu().tolist(), (before + 1).tolist())
        view = ints.float()[1:]
        view.mul_(torch.full((1,), 3.0).to(KILN))
        self.assertEqual(view.cpu().tolist(), [6.0])
        self.assertEqual(ints.cpu().tolist(), [1, 2])  # the cast is a copy
        self.assertFalse(torch._is_functional_tensor(ints.float().cpu()))

    def test_non_contiguous_source(self):
        cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
        self.assertTrue(torch.equal(cpu.to(KILN).cpu(), cpu))

    def test_copy_into_existing(self):
        k = torch.zeros(2, 3, device=KILN)
        k.copy_(torch.ones(3))  # broadcast from the CPU
        self.assertEqual(k.cpu().tolist(), [[1, 1, 1], [1, 1, 1]])
        cpu = torch.empty(2, 3, dtype=torch.float64)
        cpu.copy_(k * 2)
        self.assertEqual(cpu.tolist(), [[2, 2, 2], [2, 2, 2]])

    def test_item_every_dtype(self):
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                cpu = sample(dtype)[1, 2]
                self.assertEqual(cpu.to(KILN).item(), cpu.item())

    def test_unsupported_dtype_is_a_kiln_error(self):
        with self.assertRaises(kiln.KilnError) as ctx:
            torch.zeros(2, dtype=torch.complex64).to(KILN)
        self.assertIn("complex", str(ctx.exception).lower())
        self.assertIsInstance(ctx.exception, RuntimeError)


if __name__ == "__main__":
    unittest.main()

"""Lowered ops against the CPU: arithmetic, promotion, broadcasting, reductions, matmul, softmax."""

import unittest

import torch
import torch.nn.functional as F

import kiln
from kiln_testing import KILN, KilnTestCase


def to_kiln(x):
    return x.to(KILN) if isinstance(x, torch.Tensor) else x


class OpsTest(KilnTestCase):
    def setUp(self):
        torch.manual_seed(0)
        kiln.reset_stats()

    def check(self, fn, *args, rtol=1e-5, atol=1e-6, lowered=True):
        want = fn(*args)
        got = fn(*[to_kiln(a) for a in args])
        if isinstance(want, tuple):
            for g, w in zip(got, want):
                self.assertClose(g, w, rtol=rtol, atol=atol)
        else:
            self.assertClose(got, want, rtol=rtol, atol=atol)
        if lowered:
            self.assertEqual(kiln.stats(), {}, "an op fell back to the CPU")

    def check_grad(self, fn, *args, rtol=1e-4, atol=1e-5):
        """fn(*args) and the gradients of (fn(*args) · a fixed random tensor).sum() with respect to
        every floating-point argument, on kiln and on the CPU; no fallback."""
        cpu = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
        kin = [a.detach().to(KILN).requires_grad_(a.is_floating_point()) for a in args]
        want, got = fn(*cpu), fn(*kin)
        self.assertClose(got.detach(), want.detach(), rtol=rtol, atol=atol)
        weight = torch.randn(want.shape)
        (want * weight).sum().backward()
        (got * weight.to(KILN)).sum().backward()
        for k, c in zip(kin, cpu):
            if c.requires_grad:
                self.assertClose(k.grad, c.grad, rtol=rtol, atol=atol)
        self.assertEqual(kiln.stats(), {}, "an op fell back to the CPU")

    def test_binary_arithmetic_with_broadcasting(self):
        a, b, row = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
        self.check(lambda x, y: x + y, a, b)
        self.check(lambda x, y: x - y, a, row)
        self.check(lambda x, y: x * y, row, a)
        self.check(lambda x, y: x / y, a, b.abs() + 0.5)
        self.check(lambda x, y: torch.add(x, y, alpha=2.5), a, b)
        self.check(lambda x, y: torch.sub(x, y, alpha=-3), a, row)
        self.check(lambda x, y: x + y, torch.randn(2, 1, 3), torch.randn(4, 1))

    def test_scalars_and_promotion(self):
        a = torch.randn(5)
        i = torch.tensor([1, -2, 3, 4, -7])
        self.check(lambda x: x * 2 + 1, a)
        self.check(lambda x: 3 - x, a)
        self.check(lambda x: 1 / (x.abs() + 1), a)
        self.check(lambda x: x * 2, i)
        self.check(lambda x: x * 2.5, i)          # int tensor, float number: float result
        self.check(lambda x: x / 2, i)            # true division of ints: float
        self.check(lambda x, y: x + y, i, a)      # int + float tensors: float
        self.check(lambda x, y: x * y, a, torch.tensor(3.0))  # a 0-dim tensor
        self.check(lambda x: x + torch.tensor(2.0), a)        # a CPU 0-dim operand

    def test_div_rounding_modes(self):
        a, b = torch.tensor([7.0, -7.0, 5.5, -5.5]), torch.tensor([2.0, 2.0, -2.0, 2.0])
        ia, ib = torch.tensor([7, -7, 5, -5]), torch.tensor([2, 2, -2, 2])
        for mode in ("trunc", "floor"):
            self.check(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b)
            self.check(lambda x, y: torch.div(x, y, rounding_mode=mode), ia, ib)

    def test_unary(self):
        a = torch.randn(4, 3)
        pos = a.abs() + 0.1
        for fn in (torch.neg, torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.abs):
            self.check(fn, a, rtol=1e-5, atol=1e-6)
        for fn in (torch.log, torch.sqrt, torch.rsqrt):
            self.check(fn, pos, rtol=1e-5, atol=1e-6)
        self.check(lambda x: x ** 2, a)
        self.check(lambda x: x ** 0.5, pos)
        self.check(lambda x: x ** -1, pos)
        self.check(lambda x, y: x ** y, pos, a)
        self.check(torch.exp, torch.tensor([0, 1, 2]))  # int input: default float result
        self.check(lambda x: x.clamp(-0.5, 0.5), a)
        self.check(lambda x: x.clamp(min=0.1), a)
        self.check(torch.maximum, a, pos)

    def test_clamp_with_tensor_bounds(self):
        # clamp.Tensor, clamp_min.Tensor, clamp_max.Tensor and clamp_max (a number): broadcast,
        # promoted; where min > max the result is max.
        a, lo, hi = torch.randn(3, 4), torch.randn(4) - 0.5, torch.randn(3, 1) + 0.5
        self.check(lambda x, l, h: torch.clamp(x, l, h), a, lo, hi)
        self.check(lambda x, l: torch.clamp(x, min=l), a, lo)
        self.check(lambda x, h: torch.clamp(x, max=h), a, hi)
        self.check(torch.clamp_min, a, lo)
        self.check(torch.clamp_max, a, hi)
        self.check(lambda x: torch.clamp_max(x, 0.25), a)
        self.check(lambda x, l, h: torch.clamp(x, l, h), a, torch.ones(4), -torch.ones(4))
        self.check(lambda x, l: torch.clamp(x, min=l), torch.tensor([1, -5, 7]), torch.tensor([0.5, 0.5, 0.5]))
        self.check(lambda x, h: torch.clamp(x, max=h), torch.tensor([1, -5, 7]), torch.tensor([2, 0, 9]))
        self.check_grad(lambda x, l, h: torch.clamp(x, l, h), a, lo, hi)
        self.check_grad(torch.clamp_min, a, lo)
        self.check_grad(torch.clamp_max, a, hi)
        self.check_grad(lambda x: torch.clamp_max(x, 0.25), a)

    def test_lerp_with_tensor_weight(self):
        # lerp.Tensor: PyTorch's two forms (|weight| < 0.5 and not), all three broadcast
        a, b = torch.randn(3, 4), torch.randn(4)
        w = torch.tensor([[-0.3], [0.2], [0.9]])
        self.check(torch.lerp, a, b, w)
        self.check(torch.lerp, a, b, torch.rand(3, 4) * 3 - 1)
        self.check(torch.lerp, torch.randn(4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64),
                   torch.tensor(1.0, dtype=torch.float64))
        self.check_grad(torch.lerp, a, b, w)
        self.check_grad(torch.lerp, a, b, torch.rand(3, 4) * 3 - 1)

    def test_logical_isnan_sign(self):
        x = torch.tensor([[0.0, -1.5, float("nan")], [2.0, 0.0, -0.25]])
        i = torch.tensor([1, 0, 3])
        m = torch.tensor([True, False, True])
        for fn in (torch.logical_and, torch.logical_or, torch.logical_xor):
            self.check(fn, x, i)
            self.check(fn, x > 0, m)
            self.check(fn, i, torch.tensor(0.0))
        self.check(torch.logical_not, x)
        self.check(torch.logical_not, i)
        self.check(torch.logical_not, m)
        for t in (x, i, m):
            self.check(torch.isnan, t)
            self.check(torch.sign, t)
            self.check(torch.sgn, t)
        self.check(lambda t: t.clone().logical_and_(t > 1), x)  # the in-place form keeps its dtype
        self.check_grad(torch.abs, torch.randn(3, 4))            # abs's backward: sgn

    def test_comparisons_and_where(self):
        a, b = torch.randn(3, 4), torch.randn(3, 4)
        for fn in (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge):
            self.check(fn, a, b)
            self.check(lambda x: fn(x, 0.25), a)
        self.check(lambda x, y: torch.where(x > 0, x, y), a, b)
        self.check(lambda x, y: torch.where(x > y, x, 0.0), a, torch.randn(4))
        self.check(lambda x: x.masked_fill(x < 0, -1.0), a)

    def test_reductions(self):
        a = torch.randn(3, 4, 5)
        self.check(torch.sum, a, rtol=1e-5, atol=1e-5)
        self.check(torch.mean, a)
        self.check(lambda x: x.sum(1), a, atol=1e-5)
        self.check(lambda x: x.sum((0, 2), keepdim=True), a, atol=1e-5)
        self.check(lambda x: x.mean(-1, keepdim=True), a)
        self.check(lambda x: x.mean((1, 2)), a)
        self.check(lambda x: x.sum(), torch.tensor([1, 2, 3], dtype=torch.int32))  # int sums in int64
        # Every dim named (one whole-tensor reduction on kiln), with and without keepdim, in any
        # order; integers and bools in int64; a tensor without elements (per-dim reductions).
        self.check(lambda x: x.sum((2, 0, 1)), a, atol=1e-5)
        self.check(lambda x: x.mean((-1, 0, 1), keepdim=True), a)
        self.check(lambda x: x.sum(dim=(0, 1, 2), keepdim=True), a, atol=1e-5)
        self.check(lambda x: x.sum(), torch.randint(-5, 5, (3, 4), dtype=torch.int32))
        self.check(lambda x: x.sum(), torch.rand(3, 4) > 0.5)
        self.check(lambda x: x.sum(), torch.randn(3, 0, 2))
        self.check(lambda x: x.mean((0, 1), keepdim=True), torch.randn(0, 2))
        self.check(lambda x: x.max(), a)
        self.check(lambda x: x.max(1), a)
        self.check(lambda x: x.max(-1, keepdim=True), a)

    def test_matmul_family(self):
        a, b = torch.randn(5, 3), torch.randn(3, 4)
        self.check(torch.mm, a, b, atol=1e-5)
        self.check(torch.matmul, a, b, atol=1e-5)
        self.check(lambda x, y: x @ y, a, b, atol=1e-5)
        self.check(torch.bmm, torch.randn(2, 5, 3), torch.randn(2, 3, 4), atol=1e-5)
        self.check(lambda bias, x, y: torch.addmm(bias, x, y), torch.randn(4), a, b, atol=1e-5)
        self.check(lambda bias, x, y: torch.addmm(bias, x, y, beta=0.5, alpha=2), torch.randn(5, 4), a, b, atol=1e-5)
        self.check(torch.matmul, torch.randn(2, 5, 3), torch.randn(3, 4), atol=1e-5)

    def test_dot_and_mv(self):
        v, w, m = torch.randn(5), torch.randn(5), torch.randn(3, 5)
        self.check(torch.dot, v, w, atol=1e-5)
        self.check(torch.mv, m, v, atol=1e-5)
        self.check(torch.matmul, v, w, atol=1e-5)                    # dot
        self.check(torch.matmul, m, v, atol=1e-5)                    # mv
        self.check(torch.matmul, torch.randn(2, 3, 5), v, atol=1e-5)  # batched matrix @ vector
        self.check(torch.matmul, v, torch.randn(2, 5, 3), atol=1e-5)  # vector @ batched matrix
        self.check(torch.dot, torch.tensor([1, 2, 3]), torch.tensor([4, -5, 6]))
        self.check(torch.mv, torch.arange(6).reshape(2, 3), torch.tensor([1, 0, -1]))
        self.check(torch.dot, torch.randn(0), torch.randn(0))      # no element: 0
        self.check(torch.mv, torch.randn(2, 0), torch.randn(0))    # zeros
        self.check_grad(torch.dot, v, w)
        self.check_grad(torch.mv, m, v)
        self.check_grad(torch.matmul, v, m.t())
        self.check_grad(torch.matmul, torch.randn(2, 3, 5), v)

    def test_softmax_and_losses(self):
        a = torch.randn(4, 6)
        self.check(lambda x: torch.softmax(x, 1), a)
        self.check(lambda x: torch.log_softmax(x, -1), a)
        self.check(torch.nn.functional.mse_loss, a, torch.randn(4, 6))
        self.check(lambda x, y: torch.nn.functional.mse_loss(x, y, reduction="sum"), a, torch.randn(4, 6), atol=1e-5)
        target = torch.tensor([0, 5, 2, 5])
        for reduction in ("mean", "sum", "none"):
            self.check(lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction=reduction), a, target)
        self.check(lambda x, t: torch.nn.functional.cross_entropy(x, t, ignore_index=5), a, target)
        self.check(lambda x, t: torch.nn.functional.nll_loss(x, t), torch.log_softmax(a[0], 0), torch.tensor(3))

    def test_spatial_nll_loss(self):
        # targets [N, d1, ...]: nll_loss2d (PyTorch views every such input as [N, C, H, W])
        x = torch.randn(2, 4, 3, 5)
        t = torch.randint(0, 4, (2, 3, 5))
        t[0, 1, 2] = 1
        for reduction in ("mean", "sum", "none"):
            self.check_grad(lambda x: F.cross_entropy(x, t.to(x.device), reduction=reduction), x)
        self.check_grad(lambda x: F.cross_entropy(x, t.to(x.device), ignore_index=1), x)
        self.check_grad(lambda x: F.cross_entropy(x, t.to(x.device), ignore_index=1, reduction="none"), x)
        self.check_grad(lambda x: F.nll_loss(F.log_softmax(x, 1), t[:, 0].to(x.device)), torch.randn(2, 4, 5))
        self.check_grad(lambda x: F.cross_entropy(x, t[..., None].to(x.device)), torch.randn(2, 4, 3, 5, 1))
        # class weights run on the CPU, counted
        w = torch.rand(4)
        want = F.cross_entropy(x, t, weight=w)
        self.assertClose(F.cross_entropy(x.to(KILN), t.to(KILN), weight=w.to(KILN)), want)
        self.assertEqual(kiln.stats(), {"aten::nll_loss2d_forward (with weight)": 1})


class ViewsAndInPlaceTest(KilnTestCase):
    """A write through a view is seen by its base and by every other view (functionalization)."""

    def setUp(self):
        kiln.reset_stats()

    def tearDown(self):
        self.assertEqual(kiln.stats(), {}, "a view op fell back to the CPU")

    def test_view_write_reaches_base(self):
        base = torch.zeros(2, 3, device=KILN)
        v = base.view(6)
        v.add_(1)
        self.assertEqual(base.cpu().tolist(), [[1, 1, 1], [1, 1, 1]])

    def test_select_fill_reaches_base_and_other_views(self):
        base = torch.zeros(3, 4, device=KILN)
        other = base.t()
        base[1].fill_(5)
        self.assertEqual(base.cpu()[1].tolist(), [5, 5, 5, 5])
        self.assertEqual(other.cpu()[:, 1].tolist(), [5, 5, 5, 5])
        self.assertEqual(float(base.sum().item()), 20.0)

    def test_transpose_select_write(self):
        cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        k = cpu.to(KILN)
        k.t()[2].mul_(10)
        cpu.t()[2].mul_(10)
        self.assertClose(k, cpu)

    def test_slice_writes(self):
        cpu = torch.arange(10, dtype=torch.float32)
        k = cpu.to(KILN)
        for t in (cpu, k):
            t[2:8:2] = -1
            t[-2:].zero_()
        self.assertClose(k, cpu)

    def test_views_of_views(self):
        cpu = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
        k = cpu.to(KILN)
        for t in (cpu, k):
            v = t.permute(2, 0, 1)[1:3].unsqueeze(0)
            v.sub_(100)
            w = t.reshape(6, 4)[::2].squeeze()
            w.mul_(-1)
        self.assertClose(k, cpu)
        self.assertClose(k.expand(3, 2, 3, 4) + 1, cpu.expand(3, 2, 3, 4) + 1)

    def test_split_unbind_narrow(self):
        cpu = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        k = cpu.to(KILN)
        for got, want in zip(k.split(3), cpu.split(3)):
            self.assertClose(got, want)
        for got, want in zip(k.unbind(1), cpu.unbind(1)):
            self.assertClose(got, want)
        self.assertClose(k.narrow(0, 1, 2), cpu.narrow(0, 1, 2))

    def test_as_strided_windows(self):
        # A contiguous window of the flat values (DistributedDataParallel's gradient buckets) is a
        # Slice on kiln, read and written through; a view that is no window runs on the CPU.
        cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        k = cpu.to(KILN)
        windows = [((2, 3), (3, 1), 5), ((3,), (1,), 0), ((2, 1, 3), (3, 7, 1), 2), ((0,), (1,), 3), ((4, 6), (6, 1), 0)]
        for size, stride, offset in windows:
            with self.subTest(size=size, stride=stride, offset=offset):
                self.assertClose(torch.as_strided_copy(k, size, stride, offset),
                                 torch.as_strided_copy(cpu, size, stride, offset))
                src = -torch.arange(1, 1 + int(torch.Size(size).numel()), dtype=torch.float32).reshape(size)
                self.assertClose(torch.as_strided_scatter(k, src.to(KILN), size, stride, offset),
                                 torch.as_strided_scatter(cpu, src, size, stride, offset))
        bucket_k, bucket = torch.zeros(10, device=KILN), torch.zeros(10)
        for b in (bucket_k, bucket):
            b.as_strided((2, 2), (2, 1), 3).add_(torch.ones(2, 2, device=b.device))
        self.assertClose(bucket_k, bucket)
        self.assertEqual(kiln.stats(), {})
        self.assertClose(torch.as_strided_copy(k, (3, 2), (1, 3), 0), torch.as_strided_copy(cpu, (3, 2), (1, 3), 0))
        self.assertEqual(kiln.stats(), {"aten::as_strided_copy": 1})
        kiln.reset_stats()

    def test_empty_slices(self):
        # t[3:3] and its kin hold no elements: empty tensors; a write through one reaches no slot,
        # and the gradient through one is zeros.
        cpu = torch.arange(12, dtype=torch.float32).reshape(4, 3)
        k = cpu.to(KILN)
        for t in (cpu, k):
            e = t[3:3]
            e.add_(100)
            t[:, 2:2].fill_(-1)
        self.assertClose(k, cpu)
        self.assertEqual(tuple(k[3:3].shape), (0, 3))
        self.assertEqual(tuple(k[:, 5:].shape), (4, 0))
        self.assertEqual(tuple(k.narrow(1, 1, 0).shape), (4, 0))
        for got, want in zip(k.split_with_sizes([2, 0, 2]), cpu.split_with_sizes([2, 0, 2])):
            self.assertClose(got, want)
        self.assertClose(torch.cat([k[1:1], k[2:]]), torch.cat([cpu[1:1], cpu[2:]]))
        w = k.clone().requires_grad_()
        (w[3:3].sum() + w[1:].sum()).backward()
        want = torch.ones(4, 3)
        want[0] = 0
        self.assertClose(w.grad, want)
        self.assertEqual(kiln.stats(), {}, "an op fell back to the CPU")

    def test_in_place_arithmetic(self):
        cpu = torch.randn(3, 3)
        k = cpu.to(KILN)
        for t in (cpu, k):
            t.add_(1).mul_(2).div_(3).sub_(t.sum())
            t.clamp_(min=-1)
        self.assertClose(k, cpu, atol=1e-5)

    def test_optimizer_in_place_ops(self):
        # The in-place ops whose meta reference kiln runs in C++ (python/csrc/inplace_meta.cc),
        # every overload, against the CPU; no fallback.
        cpu = torch.randn(4, 3)
        other, weight = torch.randn(4, 3), torch.rand(3)
        k, k_other, k_weight = cpu.to(KILN), other.to(KILN), weight.to(KILN)
        for t, o, w in ((cpu, other, weight), (k, k_other, k_weight)):
            t.lerp_(o, 0.3).lerp_(o, w).addcmul_(o, o, value=0.1).addcdiv_(o, o.abs() + 1, value=2)
            t.mul_(o).mul_(3).div_(o.abs() + 1).div_(2).sub_(o, alpha=2).sub_(1).add_(o, alpha=0.5).add_(4)
            t.abs_().sqrt_()
            torch._foreach_lerp_([t], [o], 0.2)
            torch._foreach_addcmul_([t], [o], [o], 0.5)
        self.assertClose(k, cpu, atol=1e-5)
        self.assertEqual(kiln.stats(), {}, "an op fell back to the CPU")

    def test_in_place_errors_are_pytorchs(self):
        # An in-place op refuses what its functional form accepts: a result of another shape, a
        # result type self cannot hold, a mismatched lerp dtype, integer addcdiv. PyTorch raises
        # these from the meta reference functionalization runs; the same message on kiln.
        cases = [
            (lambda d: torch.ones(3, device=d).add_(torch.ones(2, 3, device=d)), "doesn't match the broadcast shape"),
            (lambda d: torch.ones(3, device=d).mul_(torch.ones(2, 3, device=d)), "doesn't match the broadcast shape"),
            (lambda d: torch.ones(3, device=d).lerp_(torch.ones(2, 3, device=d), 0.5), "doesn't match the broadcast shape"),
            (lambda d: torch.ones(3, device=d).addcmul_(torch.ones(2, 3, device=d), torch.ones(3, device=d)),
             "doesn't match the broadcast shape"),
            (lambda d: torch.ones(3, dtype=torch.int64, device=d).mul_(1.5), "can't be cast to the desired output type"),
            (lambda d: torch.ones(3, dtype=torch.int64, device=d).div_(torch.ones(3, device=d)),
             "can't be cast to the desired output type"),
            (lambda d: torch.ones(3, device=d).lerp_(torch.ones(3, dtype=torch.float64, device=d), 0.5),
             "expected dtype float for `end`"),
            (lambda d: torch.ones(3, dtype=torch.int64, device=d).addcdiv_(
                torch.ones(3, dtype=torch.int64, device=d), torch.ones(3, dtype=torch.int64, device=d)),
             "Integer division with addcdiv is no longer supported"),
        ]
        for make, message in cases:
            for device in ("cpu", "meta", KILN):
                with self.subTest(message=message, device=device):
                    with self.assertRaisesRegex(RuntimeError, message):
                        make(device)
        # The kiln tensor is usable after the refusal and holds its value.
        t = torch.ones(3, device=KILN)
        with self.assertRaises(RuntimeError):
            t.add_(torch.ones(2, 3, device=KILN))
        self.assertClose(t.add_(1), torch.full((3,), 2.0))

    def test_in_place_meta_kernels_are_kilns(self):
        # The meta reference of these ops runs kiln's registration of PyTorch's C++ kernels, not
        # the Python meta functions `import torch` registers (the reason: their cost per op).
        for op in ("add_.Tensor", "add_.Scalar", "sub_.Tensor", "sub_.Scalar", "mul_.Tensor", "mul_.Scalar",
                   "div_.Tensor", "div_.Scalar", "lerp_.Scalar", "lerp_.Tensor", "addcmul_", "addcdiv_", "sqrt_"):
            active = [line for line in torch._C._dispatch_dump("aten::" + op).splitlines() if line.startswith("Meta:")]
            self.assertEqual(len(active), 1, op)
            self.assertIn("inplace_meta.cc", active[0], op)


if __name__ == "__main__":
    unittest.main()

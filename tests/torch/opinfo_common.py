"""What test_opinfo_forward.py and test_opinfo_backward.py share: PyTorch's OpInfo database
(torch.testing._internal.common_methods_invocations.op_db), the OpInfos chosen for the aten ops
kiln lowers, the tables of expected fallbacks and of skipped samples, and the runner that takes
one OpInfo's samples on kiln and on the CPU and compares them."""

import sys
import types
import unittest

import torch
import torch.utils._pytree as pytree

import kiln
from kiln_testing import KILN

# torch.testing._internal.common_utils imports expecttest (a test-only dependency of PyTorch that
# the project venv does not install); only its TestCase base class and ACCEPT flag are used there,
# and nothing here uses expect-tests.
try:
    import expecttest  # noqa: F401
except ImportError:
    _stub = types.ModuleType("expecttest")
    _stub.TestCase = unittest.TestCase
    _stub.ACCEPT = False
    sys.modules["expecttest"] = _stub

from torch.testing._internal.common_device_type import toleranceOverride  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

OPS_BY_NAME = {(o.name + "." + o.variant_test_name) if o.variant_test_name else o.name: o for o in op_db}


F32, F64, I64, BOOL = torch.float32, torch.float64, torch.int64, torch.bool

# ---- the OpInfos run: those whose samples reach the aten ops of docs/pytorch.md "What is lowered"
# (by name in op_db; "name.variant" for a variant). amax, amin and the like are left out: kiln
# lowers none of them, so their samples would only exercise the fallback.
OPS = [
    # arithmetic
    "add", "sub", "rsub", "mul", "div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding",
    "true_divide", "neg", "abs", "reciprocal", "pow", "maximum", "minimum", "max.binary", "min.binary",
    "clamp", "clamp_min", "clamp_max", "addcmul", "addcdiv", "lerp", "sign",
    # float functions
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "nn.functional.relu",
    # comparisons, logical ops, selection
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "isnan",
    "where", "masked_fill",
    # reductions
    "sum", "mean", "max.reduction_no_dim", "max.reduction_with_dim",
    # matrix products
    "mm", "bmm", "addmm", "addmm.decomposed", "matmul", "nn.functional.linear", "dot", "mv",
    # softmax, losses
    "softmax", "softmax.with_dtype", "log_softmax", "log_softmax.with_dtype", "_softmax_backward_data",
    "nn.functional.mse_loss", "nn.functional.cross_entropy", "nn.functional.nll_loss",
    # layers
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d", "nn.functional.batch_norm",
    "native_batch_norm", "nn.functional.layer_norm", "native_layer_norm", "nn.functional.max_pool2d",
    "max_pool2d_with_indices_backward", "nn.functional.gelu", "nn.functional.embedding",
    # indexing, joining, scans
    "index_select", "index_add", "gather", "scatter", "scatter_add", "flip", "cat", "cumsum", "sort", "arange",
    # views and view writes
    "reshape", "reshape_as", "view", "view_as", "flatten", "permute", "transpose", "t", "expand", "expand_as",
    "narrow", "select", "slice", "split", "split.list_args", "split_with_sizes", "chunk", "unbind", "squeeze",
    "squeeze.multiple", "unsqueeze", "__getitem__", "view_copy", "permute_copy", "transpose_copy", "t_copy",
    "expand_copy", "narrow_copy", "squeeze_copy", "unsqueeze_copy", "unbind_copy", "split_with_sizes_copy",
    "alias_copy", "select_scatter", "slice_scatter",
    # factories and copies
    "fill", "zero_", "clone", "contiguous",
]

# The dtypes run (where the OpInfo supports them on the CPU): f32 forward and backward
# (test_opinfo_backward.py), f64, int64 and bool forward (test_opinfo_forward.py). f16/bf16 and
# the narrow integer types are not run.
FORWARD_DTYPES = (F64, I64, BOOL)
BACKWARD_DTYPE = F32

# At most this many samples per (OpInfo, dtype), taken evenly from the OpInfo's list (a fixed
# stride, so the same ones on every run): max_pool2d's samples (1440) would otherwise be most of
# the run time.
MAX_SAMPLES = 100

# The OpInfos whose backward is checked with torch.autograd.gradcheck in f64 (the backward
# lowerings), and how many of their samples.
GRADCHECK_OPS = [
    "softmax", "log_softmax", "nn.functional.mse_loss", "nn.functional.nll_loss", "nn.functional.cross_entropy",
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d", "nn.functional.batch_norm",
    "nn.functional.layer_norm", "nn.functional.max_pool2d", "nn.functional.gelu", "nn.functional.embedding",
    "nn.functional.relu", "sigmoid", "tanh", "narrow", "select", "slice", "__getitem__", "lerp", "dot", "mv",
    "index_select", "index_add", "gather", "scatter", "scatter_add", "flip", "cumsum",
]
GRADCHECK_SAMPLES = 4


# ---- fallbacks that the samples are allowed: per OpInfo, the aten ops (as kiln.stats() names them)
# that its samples' arguments make run on the CPU, with why. Anything else in kiln.stats() after a
# sample (forward or backward) fails the test.
_DOCUMENTED_NORM = ("empty input: norms of empty tensors run on the CPU (as for the other lowered layers); "
                    "a negative eps (kiln's LayerNorm refuses it) too")
_CONV = {
    "aten::convolution_overrideable": "non-float convolutions, transposed output_padding >= stride (documented)",
    "aten::convolution_backward_overrideable": "as the forward",
}
EXPECTED_FALLBACKS = {
    "masked_fill": {"aten::masked_fill_.Tensor": "a 0-dim tensor value: masked_fill.Tensor is not lowered",
                    "aten::as_strided": "masked_fill.Tensor where the mask broadcasts the input (its composite "
                                        "expands through a real view; the result is right)"},
    "nn.functional.cross_entropy": {
        "aten::nll_loss_forward (with weight)": "class weights (documented)",
        "aten::nll_loss_backward (with weight)": "class weights (documented)",
        "aten::nll_loss2d_forward (with weight)": "class weights with spatial targets (N, C, d1, ...) (documented)",
        "aten::nll_loss2d_backward (with weight)": "the same"},
    "nn.functional.conv1d": _CONV, "nn.functional.conv2d": _CONV, "nn.functional.conv3d": _CONV,
    "nn.functional.conv_transpose1d": _CONV, "nn.functional.conv_transpose2d": _CONV,
    "nn.functional.conv_transpose3d": _CONV,
    "nn.functional.layer_norm": {"aten::native_layer_norm": _DOCUMENTED_NORM,
                                 "aten::native_layer_norm_backward": _DOCUMENTED_NORM},
    "nn.functional.max_pool2d": {"aten::max_pool2d_with_indices": "non-float pools (documented)"},
    "nn.functional.embedding": {"aten::embedding_renorm_": "max_norm renormalises the weight in place: not lowered"},
    "sort": {"aten::sort.stable": "sorting bools, empty input (documented)"},
    "unbind": {"aten::as_strided": "unbind's backward (stack of the gradients) through real views; the result "
                                   "is right", "aten::view": "the same"},
    "__getitem__": {"aten::index.Tensor_out": "advanced indexing (documented: index.Tensor)",
                    "aten::_index_put_impl_": "its backward", "aten::nonzero": "a bool index",
                    "aten::as_strided": "the backward of advanced indexing through real views; the result is right",
                    "aten::view": "the same"},
}
EXPECTED_FALLBACKS["nn.functional.nll_loss"] = EXPECTED_FALLBACKS["nn.functional.cross_entropy"]
EXPECTED_FALLBACKS["native_layer_norm"] = EXPECTED_FALLBACKS["nn.functional.layer_norm"]
EXPECTED_FALLBACKS["unbind_copy"] = EXPECTED_FALLBACKS["unbind"]


# ---- skipped samples: (OpInfo, dtypes (None: all), which samples, phase, reason). `which` is None
# (every sample), a sample's key (sample_key: its shapes and arguments, without dtypes) or a
# predicate on the sample; phase is "forward", "backward" (the f32 gradient comparison only),
# "gradcheck" (the f64 gradcheck only) or None (all). Reasons: "kiln bug: ..." (kiln is wrong: the
# lead fixes and unskips), "documented: ..." (docs/pytorch.md "Known differences").
def _asymmetric_same(s):
    """conv with padding='same' whose total padding is odd in some dim: PyTorch pads the input with
    constant_pad_nd (F.pad) first."""
    if s.kwargs.get("padding") != "same":
        return False
    w = s.args[0]
    dil = s.kwargs.get("dilation", 1)
    dil = [dil] * (w.dim() - 2) if isinstance(dil, int) else list(dil)
    return any(d * (k - 1) % 2 for d, k in zip(dil, w.shape[2:]))


SKIPS = []


# ---- tolerances beyond the dtype's defaults: (OpInfo, dtype, phase) -> (rtol, atol, why).
_F32_SUMS = (1e-5, 1e-4, "f32 sums of up to ~100 products added in another order than the CPU's "
             "(measured: 8e-5 absolute on values ~50, 2.6e-5 on a 3-d transposed convolution)")
_CONVS = ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
          "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d")
_F32_CONV_GRADS = (1e-5, 5e-4, "the weight gradient sums batch x positions products (1,320 in conv3d's samples, "
                   "of values up to 9) in f32 on both sides, in different orders (measured: 1.1e-4 absolute on "
                   "values ~0.15; against f64, kiln's and the CPU's errors are alike, 1e-5 to 2.5e-5 on values ~60)")
TOLERANCES = {
    **{(op, F32, phase): _F32_SUMS
       for op in ("mm", "bmm", "addmm", "addmm.decomposed", "matmul", "nn.functional.linear", "dot", "mv") + _CONVS
       for phase in ("forward", "backward")},
    **{(op, F32, "backward"): _F32_CONV_GRADS for op in _CONVS},
    ("pow", F32, "backward"): (1e-5, 1e-4, "the exponent's gradient sums x^y * log(x) over a broadcast dim"),
    ("nn.functional.layer_norm", F32, "backward"): (1e-5, 1e-4, "a row of one element: the gradient is 0 but "
                                                    "rounding noise is scaled by rstd = eps^-1/2 ~ 316"),
    ("native_layer_norm", F32, "backward"): (1e-5, 1e-4, "as layer_norm"),
}


def sample_key(sample):
    """A sample's shapes and arguments without dtypes, as SKIPS names them: "[5, 5, 0], [0, 5]"."""
    def d(x):
        if isinstance(x, torch.Tensor):
            return str(list(x.shape))
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(d(y) for y in x) + ")"
        return repr(x)
    return ", ".join([d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()])


def describe(sample):
    """A sample's tensors with dtypes and shapes and its other arguments, for messages."""
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(d(y) for y in x) + ")"
        return repr(x)
    return ", ".join([d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()])


def skip_reason(name, dtype, sample, phase):
    for op, dtypes, which, ph, reason in SKIPS:
        if op != name or (dtypes is not None and dtype not in dtypes) or (ph is not None and ph != phase):
            continue
        if which is None or (isinstance(which, str) and which == sample_key(sample)) or \
           (callable(which) and which(sample)):
            return reason
    return None


def tolerance(op, dtype):
    """(rtol, atol) for comparing op's results in dtype with the CPU's: the OpInfo's own override
    for its device-vs-CPU test (TestCommon.test_compare_cpu) where it states one, else None
    (torch.testing.assert_close's defaults for the dtype)."""
    for info in op.decorators:
        if getattr(info, "test_name", None) != "test_compare_cpu":
            continue
        if info.dtypes is not None and dtype not in info.dtypes:
            continue
        if info.device_type not in (None, "cpu"):
            continue
        for d in info.decorators:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                return d.d[dtype].rtol, d.d[dtype].atol
    return None


def opinfo(name):
    return OPS_BY_NAME[name]


def samples(op, dtype, requires_grad):
    """op's samples for dtype on the CPU, from a fixed seed, at most MAX_SAMPLES (a fixed stride)."""
    torch.manual_seed(0)
    all_samples = list(op.sample_inputs("cpu", dtype, requires_grad=requires_grad))
    step = max(1, -(-len(all_samples) // MAX_SAMPLES))
    return all_samples[::step]


def to_kiln(t):
    if isinstance(t, torch.Tensor):
        return t.detach().to(KILN).requires_grad_(t.requires_grad)
    return t


def float_tensors(sample):
    """The floating-point tensors of a sample that require grad (its differentiable inputs)."""
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]


def outputs(result):
    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]


def assert_close(got, want, rtol_atol, msg):
    """got (a kiln tensor) equals want (the CPU's) in dtype, shape and values: assert_close with the
    dtype's defaults unless rtol_atol says otherwise."""
    if got.device.type != "kiln":
        raise AssertionError(f"{msg}: a result on {got.device}, not kiln")
    got = got.detach().cpu()
    want = want.detach()
    if rtol_atol is None:
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{msg}: {m}")
    else:
        torch.testing.assert_close(got, want, rtol=rtol_atol[0], atol=rtol_atol[1], equal_nan=True,
                                   msg=lambda m: f"{msg}: {m}")


def tol_for(name, op, dtype, phase):
    t = TOLERANCES.get((name, dtype, phase))
    return t[:2] if t else tolerance(op, dtype)


COUNTS = {"run": 0, "skipped": 0, "ops": set()}


def check_fallbacks(test, name, msg):
    allowed = EXPECTED_FALLBACKS.get(name, {})
    unexpected = {k: v for k, v in kiln.stats().items() if k not in allowed}
    test.assertEqual(unexpected, {}, f"{msg}: ops fell back to the CPU")


def run_sample(test, name, op, dtype, sample, backward):
    """One sample on kiln and on the CPU: the results, then (backward) the gradients of a weighted
    sum of the float outputs with respect to the float inputs; the fallbacks."""
    msg = f"{name} {str(dtype).replace('torch.', '')} ({describe(sample)})"
    reason = skip_reason(name, dtype, sample, "forward")
    if reason:
        COUNTS["skipped"] += 1
        test.skipTest(reason)
    kiln.reset_stats()
    ks = sample.transform(to_kiln)
    if name == "arange":  # a factory: the kiln call names the device
        ks.kwargs["device"] = KILN
    want = op(sample.input, *sample.args, **sample.kwargs)
    got = op(ks.input, *ks.args, **ks.kwargs)
    want_out, got_out = outputs(want), outputs(got)
    test.assertEqual(len(got_out), len(want_out), msg)
    for g, w in zip(got_out, want_out):
        assert_close(g, w, tol_for(name, op, dtype, "forward"), msg)
    check_fallbacks(test, name, msg + " forward")
    COUNTS["run"] += 1
    COUNTS["ops"].add(name)
    if not backward:
        return
    reason = skip_reason(name, dtype, sample, "backward")
    if reason:
        COUNTS["skipped"] += 1
        test.skipTest(reason)
    want_out = [o for o in outputs(sample.output_process_fn_grad(want)) if o.is_floating_point() and o.requires_grad]
    got_out = [o for o in outputs(ks.output_process_fn_grad(got)) if o.is_floating_point() and o.requires_grad]
    want_in, got_in = float_tensors(sample), float_tensors(ks)
    if not want_out or not want_in:
        return
    kiln.reset_stats()
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in want_out]
    want_grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want_out, weights)), want_in,
                                     allow_unused=True)
    got_grads = torch.autograd.grad(sum((o * w.to(KILN)).sum() for o, w in zip(got_out, weights)), got_in,
                                    allow_unused=True)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        if w is None:
            test.assertTrue(g is None or not g.cpu().any(), f"{msg}: a gradient where the CPU has none")
            continue
        test.assertIsNotNone(g, f"{msg}: no gradient for input {i}")
        assert_close(g, w, tol_for(name, op, dtype, "backward"), f"{msg} gradient {i}")
    check_fallbacks(test, name, msg + " backward")


def add_op_tests(cls, dtypes, backward):
    """One test method per OpInfo of OPS on cls, each running its samples for dtypes as subtests."""
    for name in OPS:
        def test(self, name=name):
            op = opinfo(name)
            supported = op.supported_dtypes("cpu")
            for dtype in dtypes:
                if dtype not in supported:
                    continue
                rg = backward and op.supports_autograd and dtype.is_floating_point
                for i, sample in enumerate(samples(op, dtype, rg)):
                    with self.subTest(dtype=str(dtype).replace("torch.", ""), sample=i):
                        run_sample(self, name, op, dtype, sample, rg)
        setattr(cls, "test_" + name.replace(".", "_").strip("_"), test)


def run_gradcheck(test, name, op, sample):
    """torch.autograd.gradcheck in f64 of op on kiln: the function takes the CPU inputs, moves them to
    kiln, runs op and returns its float outputs on the CPU, so that gradcheck's own arithmetic stays
    on the CPU while the forward and backward ops run on kiln."""
    msg = f"{name} float64 ({describe(sample)})"
    reason = skip_reason(name, F64, sample, "forward") or skip_reason(name, F64, sample, "gradcheck")
    if reason:
        COUNTS["skipped"] += 1
        test.skipTest(reason)
    inputs = float_tensors(sample)

    def fn(*ts):
        it = iter(ts)
        args = pytree.tree_map(
            lambda t: next(it) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad else t,
            (sample.input, sample.args, sample.kwargs))
        args = pytree.tree_map(lambda t: t.to(KILN) if isinstance(t, torch.Tensor) else t, args)
        out = op(args[0], *args[1], **args[2])
        return tuple(o.cpu() for o in outputs(sample.output_process_fn_grad(out)) if o.is_floating_point())

    kiln.reset_stats()
    test.assertTrue(torch.autograd.gradcheck(fn, tuple(inputs), fast_mode=True, check_undefined_grad=False,
                                             check_batched_grad=False), msg)
    check_fallbacks(test, name, msg + " gradcheck")
    COUNTS["run"] += 1


def add_gradcheck_tests(cls):
    for name in GRADCHECK_OPS:
        def test(self, name=name):
            op = opinfo(name)
            torch.manual_seed(0)
            n = 0
            for i, sample in enumerate(op.sample_inputs("cpu", F64, requires_grad=True)):
                if n == GRADCHECK_SAMPLES:
                    break
                if not float_tensors(sample):
                    continue
                n += 1
                with self.subTest(sample=i):
                    run_gradcheck(self, name, op, sample)
        setattr(cls, "test_gradcheck_" + name.replace(".", "_").strip("_"), test)


def report():
    """A line for the end of a module's run: what ran, what was skipped."""
    return (f"opinfo: {len(COUNTS['ops'])} OpInfos, {COUNTS['run']} samples compared, "
            f"{COUNTS['skipped']} skipped")

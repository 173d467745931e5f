"""Conformance from PyTorch's own tests, f32 forward and backward: the OpInfo samples
(torch.testing._internal.common_methods_invocations.op_db) of every OpInfo that maps onto an aten op
kiln lowers, on kiln against the CPU with PyTorch's tolerances; for each sample with float inputs,
the gradients of a weighted sum of its float outputs with respect to those inputs against the
CPU's; no fallback beyond the ones the sample's arguments are documented to need. Then
torch.autograd.gradcheck in f64 for the backward lowerings (softmax, losses, convolutions, norms,
pooling, GELU, embedding, slice/select gradients). Tables: opinfo_common.py."""

import sys
import unittest
import warnings

import opinfo_common as oc
from kiln_testing import KilnTestCase


class OpInfoBackwardTest(KilnTestCase):
    def setUp(self):
        warnings.simplefilter("ignore")  # the fallback's once-per-op warnings


oc.add_op_tests(OpInfoBackwardTest, (oc.BACKWARD_DTYPE,), backward=True)
oc.add_gradcheck_tests(OpInfoBackwardTest)


def tearDownModule():
    print(oc.report(), file=sys.stderr)


if __name__ == "__main__":
    unittest.main()

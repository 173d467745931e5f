"""Conformance from PyTorch's own tests, forward in f64, int64 and bool: the OpInfo samples
(torch.testing._internal.common_methods_invocations.op_db) of every OpInfo that maps onto an aten op
kiln lowers, on kiln against the CPU with PyTorch's tolerances (assert_close's defaults for the
dtype, or the OpInfo's own override for its device-vs-CPU test), and no fallback beyond the ones the
sample's arguments are documented to need. The OpInfos, the expected fallbacks, the skipped samples
(each with its reason) and the tolerances are the tables of opinfo_common.py; f32 with gradients and
the f64 gradchecks are test_opinfo_backward.py."""

import sys
import unittest
import warnings

import opinfo_common as oc
from kiln_testing import KilnTestCase


class OpInfoForwardTest(KilnTestCase):
    def setUp(self):
        warnings.simplefilter("ignore")  # the fallback's once-per-op warnings


oc.add_op_tests(OpInfoForwardTest, oc.FORWARD_DTYPES, backward=False)


def tearDownModule():
    print(oc.report(), file=sys.stderr)


if __name__ == "__main__":
    unittest.main()

"""What the kiln device's test modules share: `import kiln` once, and comparisons with the CPU."""

import unittest

import torch

import kiln  # noqa: F401  (registers the device)

KILN = torch.device("kiln")


class KilnTestCase(unittest.TestCase):
    def assertClose(self, kiln_tensor, cpu_tensor, rtol=1e-5, atol=1e-6, msg=None):
        """kiln_tensor (on kiln) equals cpu_tensor in dtype, shape and values, within tolerance."""
        self.assertEqual(kiln_tensor.device.type, "kiln", msg)
        got = kiln_tensor.cpu()
        self.assertEqual(got.dtype, cpu_tensor.dtype, msg)
        self.assertEqual(tuple(got.shape), tuple(cpu_tensor.shape), msg)
        torch.testing.assert_close(got, cpu_tensor, rtol=rtol, atol=atol, equal_nan=True, msg=msg)

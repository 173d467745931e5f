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


if __name__ == "__main__":
    unittest.main()

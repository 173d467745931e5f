"""The torch spike's Python side: load one variant's library and register the "kiln" device.

    import kiln_spike
    kiln_spike.load("strided")        # or "lazy"; once per process (PrivateUse1 is one slot)
    x = torch.ones(3, device="kiln")

The library is found in $KILN_SPIKE_BUILD (default: ../build relative to this package).
"""

import os
import types

import torch

_loaded = None


def _library_path(variant):
    build = os.environ.get(
        "KILN_SPIKE_BUILD", os.path.join(os.path.dirname(__file__), "..", "build"))
    return os.path.join(build, f"libkiln_spike_{variant}.so")


def _device_module():
    # What torch._register_device_module expects of torch.<name>: is_available etc. are
    # looked up by torch.accelerator, AMP and the RNG helpers.
    m = types.ModuleType("torch.kiln")
    m.is_available = lambda: True
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m.manual_seed_all = lambda seed: None
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    m.synchronize = lambda device=None: None  # kiln: flush the lazy graph here

    class device:  # torch.load(map_location=None) restores kiln storages inside this
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    m.device = device
    return m


def _patch_printing():
    # torch._tensor_str moves xla/lazy/ipu/mtia tensors to the CPU before formatting, but not
    # a PrivateUse1 device: it would run ~15 ops on the device (min, max, masked_select, ...)
    # and, for a functional wrapper, print the inner tensor with a "_to_functional_tensor("
    # prefix (through a raw aten::view on it). Format a CPU copy instead; keep the suffixes.
    import torch._tensor_str as ts

    orig = ts._str

    def _str(self, *, tensor_contents=None):
        if self.device.type != "kiln":
            return orig(self, tensor_contents=tensor_contents)
        with torch.no_grad():
            s = orig(self.detach().cpu(), tensor_contents=tensor_contents)
        extra = [f"device='{self.device}'"]
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        return s[:-1] + ", " + ", ".join(extra) + ")"

    ts._str = _str


def _patch_serialization():
    # torch.save / deepcopy send a PrivateUse1 tensor through the CPU only when it has no
    # storage; a FunctionalTensorWrapper has one (a FunctionalStorageImpl without data), so
    # torch.save fails on it. Serialize kiln tensors as a CPU copy plus the device, as
    # torch/_tensor.py does for xla/mtia.
    orig = torch.Tensor._reduce_ex_internal

    def _reduce_ex_internal(self, proto):
        if self.device.type == "kiln" and torch._is_functional_tensor(self):
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))
        return orig(self, proto)

    torch.Tensor._reduce_ex_internal = _reduce_ex_internal


def load(variant):
    global _loaded
    if _loaded is not None:
        if _loaded != variant:
            raise RuntimeError(f"kiln_spike: {_loaded} already loaded (one backend a process)")
        return
    torch.ops.load_library(_library_path(variant))
    torch.utils.rename_privateuse1_backend("kiln")
    torch._register_device_module("kiln", _device_module())
    # tensor.kiln(), tensor.is_kiln, module.kiln(): convenience only.
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    _patch_printing()
    _patch_serialization()
    _loaded = variant


def fallback_stats():
    """{"aten::op.overload": calls} of the ops that ran through the CPU fallback."""
    names, counts = torch.ops.kiln_spike.fallback_stats()
    return dict(zip(names, counts))


def reset_stats():
    torch.ops.kiln_spike.reset_stats()

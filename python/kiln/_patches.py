"""Four patches of torch functions that a storage-less PrivateUse1 device needs
(docs/pytorch-spike.md §3). They touch torch internals: recheck them on every torch upgrade
(tests/torch/ prints and saves kiln tensors, so a break shows there)."""

import torch


def _patch_printing():
    # torch._tensor_str moves xla/lazy/mtia tensors to the CPU before formatting, but not a
    # PrivateUse1 device: it would run ~15 ops on kiln and print the functional wrapper's inner
    # tensor ("_to_functional_tensor(...)"). Format a CPU copy instead; keep the suffixes.
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
    # torch.save and copy.deepcopy send a PrivateUse1 tensor through the CPU only when it has no
    # storage; the functional wrapper has one (without data), so they would fail. Serialize kiln
    # tensors as a CPU copy plus the device, as torch/_tensor.py does for xla and mtia.
    orig = torch.Tensor._reduce_ex_internal

    def _reduce_ex_internal(self, proto):
        if self.device.type == "kiln" and torch._is_functional_tensor(self):
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))
        return orig(self, proto)

    torch.Tensor._reduce_ex_internal = _reduce_ex_internal


def _patch_deepcopy():
    # Tensor.__deepcopy__ clones a storage-less PrivateUse1 tensor but copies the storage of any
    # other, and the functional wrapper's storage has no data (a crash in StorageImpl). Clone a
    # plain kiln tensor instead, as torch does for xla and lazy tensors. (nn.Parameter has its own
    # __deepcopy__, which clones.)
    import copy

    orig = torch.Tensor.__deepcopy__

    def __deepcopy__(self, memo):
        if (type(self) is not torch.Tensor or self.device.type != "kiln" or not self.is_leaf
                or not torch._is_functional_tensor(self)):
            return orig(self, memo)
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        new.__dict__ = copy.deepcopy(self.__dict__, memo)
        memo[id(self)] = new
        return new

    torch.Tensor.__deepcopy__ = __deepcopy__


def _patch_copy():
    # cpu_tensor.copy_(kiln_tensor): functionalization refuses to mutate a tensor it does not
    # track (the CPU one) with one it does ("mutating a non-functional tensor with a functional
    # tensor is not allowed"). From Python, read the kiln tensor back first; a C++ caller still
    # gets the error (docs/pytorch.md, "Known differences").
    orig = torch.Tensor.copy_

    def copy_(self, src, non_blocking=False):
        if isinstance(src, torch.Tensor) and src.device.type == "kiln" and self.device.type != "kiln":
            src = src.cpu()
        return orig(self, src, non_blocking)

    torch.Tensor.copy_ = copy_


def apply():
    _patch_printing()
    _patch_serialization()
    _patch_deepcopy()
    _patch_copy()

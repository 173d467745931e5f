"""Patches of torch functions: three that a storage-less PrivateUse1 device needs
(docs/pytorch-spike.md §3) and one that keeps a backward pass on its caller's kiln stream. They
touch torch internals: recheck them on every torch upgrade (tests/torch/ prints and saves kiln
tensors and checks where backward runs, so a break shows there)."""

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


def _patch_backward_thread():
    # PyTorch's autograd engine runs a device's backward ops on a worker thread of its own. On
    # kiln that thread is another kiln stream: every saved tensor the backward reads becomes a
    # shared view (a blocking round trip to the forward's stream: 74 in one step of the example
    # GPT), and the forward's buffers are freed from a foreign thread. A backward whose roots are
    # kiln tensors runs with multithreaded backward off (torch.autograd.set_multithreading_enabled),
    # so the engine runs it on the calling thread, on the stream the forward used. Others are
    # untouched, and a caller who turned multithreading off keeps it off.
    import torch.autograd
    import torch.autograd.graph

    orig = torch.autograd.graph._engine_run_backward

    def _engine_run_backward(t_outputs, *args, **kwargs):
        if torch._C._is_multithreading_enabled() and any(
                isinstance(t, torch.Tensor) and t.device.type == "kiln" for t in t_outputs):
            with torch.autograd.set_multithreading_enabled(False):
                return orig(t_outputs, *args, **kwargs)
        return orig(t_outputs, *args, **kwargs)

    # torch.autograd imported the name from torch.autograd.graph: both places.
    torch.autograd.graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward


def apply():
    _patch_printing()
    _patch_serialization()
    _patch_deepcopy()
    _patch_backward_thread()

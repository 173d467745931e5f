"""Patches of torch functions: three that a storage-less PrivateUse1 device needs
(docs/pytorch-spike.md §3), one that keeps a backward pass on its caller's kiln stream, and one
that lets kiln tensors through torch.inference_mode. They
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


def _touches_kiln(x):
    if isinstance(x, torch.Tensor):
        return x.device.type == "kiln"
    if isinstance(x, torch.device):
        return x.type == "kiln"
    if isinstance(x, str):
        return x.startswith("kiln")
    if isinstance(x, (list, tuple)):
        return any(_touches_kiln(y) for y in x)
    return False


def _patch_inference_mode():
    # kiln sees every op through PyTorch's functionalization, which fails under inference mode:
    # a view of a tensor from outside the block becomes an inference tensor whose version counter
    # it then sets ("Cannot set version_counter for inference tensor": nn.Linear's weight.t()),
    # and cpu_tensor.copy_(kiln) trips its "mutating a non-functional tensor" assert. PyTorch's
    # own fix for its functional tensors (torch.compile) is to leave inference mode, under
    # no_grad, around them. Here a TorchFunctionMode, pushed only while an inference_mode block is
    # open, does that for every call that names kiln (a kiln tensor, or "kiln" as the device):
    # no gradient is recorded, as in the block; kiln's results are ordinary tensors, not
    # inference ones, except a tensor of the block moved to kiln (nn.Parameter wraps a module's
    # moved tensors in inference mode). An inference tensor written with a kiln source (the
    # block's CPU outputs) stays in inference mode and reads the source through .cpu() first. Calls that do not touch
    # kiln run as before, at a mode's cost of ~1 µs each, inside such blocks only.
    from torch.autograd import grad_mode
    from torch.overrides import TorchFunctionMode

    class _KilnOutsideInferenceMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not torch.is_inference_mode_enabled() or not (
                    _touches_kiln(args) or _touches_kiln(tuple(kwargs.values()))):
                return func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if first is not None and first.is_inference() and not _touches_kiln(first):
                if name == "copy_" and len(args) >= 2:
                    return func(first, args[1].cpu() if _touches_kiln(args[1]) else args[1], *args[2:], **kwargs)
                if name == "to":  # a tensor of the block moved to kiln stays an inference tensor
                    return func(*args, **kwargs)
            with torch.inference_mode(False), torch.no_grad():
                return func(*args, **kwargs)

    cls = grad_mode.inference_mode
    orig_enter, orig_exit = cls.__enter__, cls.__exit__

    def __enter__(self):
        orig_enter(self)
        if self.mode:
            mode = _KilnOutsideInferenceMode()
            mode.__enter__()
            self._kiln_mode = mode

    def __exit__(self, exc_type, exc_value, traceback):
        mode = self.__dict__.pop("_kiln_mode", None)
        if mode is not None:
            mode.__exit__(exc_type, exc_value, traceback)
        return orig_exit(self, exc_type, exc_value, traceback)

    cls.__enter__ = __enter__
    cls.__exit__ = __exit__


def apply():
    _patch_printing()
    _patch_serialization()
    _patch_deepcopy()
    _patch_backward_thread()
    _patch_inference_mode()

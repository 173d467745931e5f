"""Edge checks beyond demo.py (what a real training script also touches):
python misc_checks.py strided|lazy"""

import io
import sys
import warnings

import torch

import kiln_spike

variant = sys.argv[1] if len(sys.argv) > 1 else "strided"
kiln_spike.load(variant)
warnings.simplefilter("ignore")


def attempt(name, fn):
    try:
        print(f"  ok    {name}: {fn()}")
    except Exception as e:  # noqa: BLE001
        print(f"  FAIL  {name}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}")


def randn():
    torch.manual_seed(1)
    a = torch.randn(3, device="kiln").cpu()
    torch.manual_seed(1)
    b = torch.randn(3)
    return f"same numbers as the CPU: {torch.equal(a, b)}"


def save_load():
    m = torch.nn.Linear(2, 2).to("kiln")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, map_location="cpu")
    return f"state_dict round trip via map_location=cpu: {torch.equal(sd['weight'], m.weight.detach().cpu())}"


def save_load_device():
    t = torch.arange(4.0, device="kiln")
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    u = torch.load(buf)
    return f"loaded on {u.device}, equal: {torch.equal(u.cpu(), t.cpu())}"


def deepcopy_model():
    import copy
    m = torch.nn.Linear(2, 2).to("kiln")
    before = m.weight.detach().cpu().clone()
    c = copy.deepcopy(m)
    equal = torch.equal(c.weight.detach().cpu(), before)
    with torch.no_grad():
        c.weight.add_(1)
    independent = torch.equal(m.weight.detach().cpu(), before)
    return f"copy equal: {equal}, original unchanged by a write to the copy: {independent}"


def mixed_device():
    try:
        torch.ones(3, device="kiln") + torch.ones(3)
    except RuntimeError as e:
        return "raises: " + str(e).splitlines()[0][:90]
    return "no error (!)"


def module_roundtrip():
    m = torch.nn.Linear(3, 1)
    w = m.weight.detach().clone()
    m.to("kiln").cpu()
    return f"model.to('kiln').cpu() keeps weights: {torch.equal(m.weight, w)}, is_leaf {m.weight.is_leaf}"


def generated_methods():
    x = torch.ones(2).kiln()
    return f"tensor.kiln() -> {x.device}, x.is_kiln={x.is_kiln}"


def in_place_on_view_of_leaf_param():
    p = torch.nn.Parameter(torch.zeros(2, 2).to("kiln"))
    with torch.no_grad():
        p[0].add_(1)
    return f"param after p[0].add_(1) under no_grad: {p.detach().cpu().tolist()}"


def contiguous_and_strides():
    x = torch.zeros(2, 3, device="kiln").t()
    return f"t(): stride {x.stride()}, is_contiguous {x.is_contiguous()}, .contiguous().stride() {x.contiguous().stride()}"


def numpy():
    return torch.ones(2, device="kiln").cpu().numpy().tolist()


def sync():
    torch.kiln.synchronize()
    return f"torch.kiln.synchronize() ok; torch.accelerator.current_accelerator()={torch.accelerator.current_accelerator()}"


for n, f in [("torch.randn(device='kiln') with manual_seed", randn), ("torch.save/load state_dict", save_load),
             ("torch.save/load a kiln tensor", save_load_device), ("copy.deepcopy(model)", deepcopy_model), ("kiln + cpu tensor", mixed_device),
             ("module .to('kiln').cpu()", module_roundtrip), ("generated methods", generated_methods),
             ("in-place through a view of a Parameter", in_place_on_view_of_leaf_param),
             ("strides of a transposed tensor", contiguous_and_strides), (".cpu().numpy()", numpy),
             ("synchronize / accelerator", sync)]:
    attempt(n, f)
print(f"[{variant}] fallbacks: {sum(kiln_spike.fallback_stats().values())} calls")

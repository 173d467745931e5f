"""The spike's checklist, run against one variant: python demo.py strided|lazy"""

import sys
import time
import warnings

import torch

import kiln_spike

variant = sys.argv[1] if len(sys.argv) > 1 else "strided"
t0 = time.perf_counter()
kiln_spike.load(variant)
print(f"[{variant}] loaded in {time.perf_counter() - t0:.3f}s, "
      f"library says {torch.ops.kiln_spike.variant()!r}")
warnings.simplefilter("always")  # show each once-per-op warning as it comes (C++ warns once)

results = []


def check(name, fn):
    try:
        detail = fn()
        results.append((name, True, detail))
        print(f"  ok    {name}: {detail}")
    except Exception as e:  # noqa: BLE001 - a spike reports every failure and goes on
        msg = str(e).strip().splitlines()[0][:300]
        results.append((name, False, msg))
        print(f"  FAIL  {name}: {type(e).__name__}: {msg}")


def ones():
    x = torch.ones(3, device="kiln")
    assert x.device.type == "kiln", x.device
    return f"{x.device}, {x.cpu().tolist()}"


def to_and_back():
    a = torch.arange(6.0).reshape(2, 3)
    k = a.to("kiln")
    assert torch.equal(k.cpu(), a)
    return f"{k.device} -> cpu equal"


def add_mul():
    a, b = torch.randn(4), torch.randn(4)
    r = ((a.to("kiln") + b.to("kiln")) * b.to("kiln")).cpu()
    torch.testing.assert_close(r, (a + b) * b)
    return "(a+b)*b matches the CPU"


def scalar_ops():
    a = torch.randn(4)
    r = (a.to("kiln") * 2 + 1).cpu()
    torch.testing.assert_close(r, a * 2 + 1)
    return "k*2+1 (wrapped CPU scalars) matches"


def view_write():
    base = torch.zeros(2, 3, device="kiln")
    v = base.view(3, 2)
    v.add_(1)                          # in place through a view
    t = base.transpose(0, 1)           # a second view
    t[0].mul_(5)                       # write through a view of a view (select + in place)
    row = base[1]
    row.fill_(7)                       # write through a select view
    expect = torch.zeros(2, 3)
    expect.view(3, 2).add_(1)
    expect.transpose(0, 1)[0].mul_(5)
    expect[1].fill_(7)
    assert torch.equal(base.cpu(), expect), (base.cpu(), expect)
    assert torch.equal(v.cpu(), expect.view(3, 2))
    assert torch.equal(t.cpu(), expect.t())
    return f"base sees view writes: {base.cpu().tolist()}"


def autograd():
    xc = torch.randn(3, requires_grad=True)
    x = xc.detach().to("kiln").requires_grad_()
    y = ((x * x + x) * 3).sum()
    y.backward()
    ref = xc * xc + xc
    (ref * 3).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad)
    return f"grad {x.grad.device} matches the CPU"


def sgd_linear():
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    model = torch.nn.Linear(4, 2)
    model.load_state_dict(ref.state_dict())
    model.to("kiln")
    assert model.weight.device.type == "kiln"
    x = torch.randn(8, 4)
    y = torch.randn(8, 2)
    out = {}
    for m, dev in ((ref, "cpu"), (model, "kiln")):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
        out[dev] = (loss.item(), m.weight.detach().cpu())
    torch.testing.assert_close(out["kiln"][1], out["cpu"][1])
    return f"3 SGD steps, loss {out['kiln'][0]:.5f} == cpu {out['cpu'][0]:.5f}, weights equal"


def optimizers():
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    done = []
    for name, make in (("Adam", lambda p: torch.optim.Adam(p, lr=0.01)),
                       ("AdamW", lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1))):
        ref = torch.nn.Linear(4, 2)
        model = torch.nn.Linear(4, 2)
        model.load_state_dict(ref.state_dict())
        model.to("kiln")
        for m, dev in ((ref, "cpu"), (model, "kiln")):
            opt = make(m.parameters())
            for _ in range(3):
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(x.to(dev)), y.to(dev)).backward()
                opt.step()
        torch.testing.assert_close(model.weight.detach().cpu(), ref.weight.detach())
        state = opt.state[model.weight]
        assert state["exp_avg"].device.type == "kiln", state["exp_avg"].device
        done.append(name)
    return f"{', '.join(done)}: 3 steps match the CPU; optimizer state on kiln"


def printing():
    s = repr(torch.arange(3.0).to("kiln"))
    assert "kiln" in s, s
    return s.replace("\n", " ")


def printing_grad():
    x = torch.ones(2, device="kiln", requires_grad=True)
    s = repr(x * 2)
    assert "grad_fn=<MulBackward0>" in s and "kiln" in s, s
    return s


def item():
    return f"{torch.tensor(2.5).to('kiln').item()}"


def data_ptr():
    return f"data_ptr={torch.ones(2, device='kiln').data_ptr():#x}"


def storage():
    s = torch.ones(2, device="kiln").untyped_storage()
    return f"untyped_storage nbytes={s.nbytes()} device={s.device}"


def functional_flag():
    x = torch.ones(2, device="kiln")
    return f"torch._is_functional_tensor(x)={torch._is_functional_tensor(x)}"


for name, fn in [("torch.ones(3, device='kiln')", ones), ("x.to('kiln') / .cpu()", to_and_back),
                 ("add/mul lowered", add_mul), ("tensor-scalar ops", scalar_ops),
                 ("views written in place", view_write), ("autograd backward", autograd),
                 ("nn.Linear + SGD(momentum) on kiln", sgd_linear),
                 ("Adam / AdamW", optimizers), ("repr()", printing),
                 ("repr() with grad_fn", printing_grad),
                 (".item()", item), (".data_ptr()", data_ptr), (".untyped_storage()", storage),
                 ("functional wrapper?", functional_flag)]:
    check(name, fn)

stats = kiln_spike.fallback_stats()
print(f"[{variant}] CPU fallbacks ({len(stats)} ops, {sum(stats.values())} calls):")
for k, v in sorted(stats.items(), key=lambda kv: -kv[1]):
    print(f"    {v:5d}  {k}")

# Host cost of one small op (4 floats): C++ loop (torch.ops.kiln_spike.bench_add) and Python.
import timeit  # noqa: E402

kiln_spike.reset_stats()
for dev in ("cpu", "kiln"):
    a, b = torch.randn(4).to(dev), torch.randn(4).to(dev)
    cxx = torch.ops.kiln_spike.bench_add(a, b, 20000)
    py = min(timeit.repeat(lambda: a + b, number=20000, repeat=3)) / 20000 * 1e9
    print(f"[{variant}] host cost of a + b on {dev:4}: C++ {cxx:7.0f} ns/op, Python {py:7.0f} ns/op")
    if dev == "kiln" and hasattr(torch.ops.kiln_spike, "bench_add_inner"):
        inner = torch.ops.kiln_spike.bench_add_inner(a, b, 20000)
        print(f"[{variant}]   same, inner tensors, functionalization skipped: C++ {inner:7.0f} ns/op")
stats = kiln_spike.fallback_stats()
assert not stats, stats  # add is lowered: nothing fell back

bad = [n for n, ok, _ in results if not ok]
print(f"[{variant}] {len(results) - len(bad)} passed, {len(bad)} failed")
sys.exit(1 if bad else 0)

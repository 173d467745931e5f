#!/usr/bin/env python3
"""kiln's performance targets, computed from peer-kit result lines (reported, never asserted).

usage: targets.py RESULTS.txt [MORE.txt ...] > targets.md

Like the kit's summarize.py, a cell (peer, workload, n, threads) seen in several passes keeps
its lowest median (best of passes). Targets (docs/benchmarks.md):
  T1  fused W1 and W3 at 2^24 at least as fast as numexpr with the same threads
  T2  fused W1 and W3 at 2^24 within 1.3x of Eigen (same threads)
  T3  fused W2 at 2^24 at least 3x faster than kiln unfused (same threads)
  T4  fp32 matmul 1024x1024 at least half of Eigen's GFLOP/s (same threads)
Also: the fused-over-unfused speed-up of every cell.
"""
import sys

N24 = 1 << 24
SIZE_NAME = {1 << 16: "2^16", 1 << 20: "2^20", 1 << 24: "2^24"}
FUSED, UNFUSED = "kiln-cpu-fused", "kiln-cpu-unfused"


def parse(paths):
    best = {}
    for path in paths:
        with open(path) as fh:
            for line in fh:
                if not line.startswith("peer="):
                    continue
                kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
                try:
                    key = (kv["peer"], kv["workload"], int(kv["n"]), int(kv["threads"]))
                    ns = float(kv["ns_per_elem"])
                except (KeyError, ValueError):
                    continue
                if key not in best or ns < best[key][0]:
                    best[key] = (ns, kv)
    return best


def verdict(ok):
    return "met" if ok else "**missed**"


def main(paths):
    rec = parse(paths)
    threads = sorted({k[3] for k in rec if k[0] == FUSED})
    out = ["## kiln targets (best of passes; ratios > 1 favour kiln unless stated)\n"]
    rows = []

    def ns(peer, w, n, t):
        v = rec.get((peer, w, n, t))
        return v[0] if v else None

    for w in ("W1", "W3"):
        for t in threads:
            k, ne, ei = ns(FUSED, w, N24, t), ns("numexpr", w, N24, t), ns("eigen", w, N24, t)
            if k and ne:
                r = ne / k
                rows.append(f"| T1 | {w} 2^24 t{t}: numexpr / kiln fused | {ne:.3g} / {k:.3g} ns | "
                            f"{r:.2f}× (≥ 1) | {verdict(r >= 1)} |")
            if k and ei:
                r = k / ei
                rows.append(f"| T2 | {w} 2^24 t{t}: kiln fused / eigen | {k:.3g} / {ei:.3g} ns | "
                            f"{r:.2f}× (≤ 1.3) | {verdict(r <= 1.3)} |")
    for t in threads:
        f, u = ns(FUSED, "W2", N24, t), ns(UNFUSED, "W2", N24, t)
        if f and u:
            r = u / f
            rows.append(f"| T3 | W2 2^24 t{t}: kiln unfused / kiln fused | {u:.3g} / {f:.3g} ns | "
                        f"{r:.2f}× (≥ 3) | {verdict(r >= 3)} |")
    for t in threads:
        kv = rec.get((FUSED, "matmul1024", 1 << 20, t))
        ev = rec.get(("eigen", "matmul1024", 1 << 20, t))
        if kv and ev and "gflops" in kv[1] and "gflops" in ev[1]:
            kg, eg = float(kv[1]["gflops"]), float(ev[1]["gflops"])
            r = kg / eg
            rows.append(f"| T4 | matmul 1024² t{t}: kiln / eigen GFLOP/s | {kg:.1f} / {eg:.1f} | "
                        f"{r:.2f}× (≥ 0.5) | {verdict(r >= 0.5)} |")
    if rows:
        out.append("| target | comparison | values | ratio (goal) | |")
        out.append("|---|---|---:|---:|---|")
        out += rows
    else:
        out.append("(no kiln lines with the cells the targets need)")

    cells = sorted({(k[1], k[2], k[3]) for k in rec if k[0] == FUSED and (UNFUSED, *k[1:]) in rec})
    if cells:
        out.append("\n### Fused over unfused (kiln unfused ns / kiln fused ns)\n")
        out.append("| workload | n | " + " | ".join(f"t{t}" for t in threads) + " |")
        out.append("|---|---|" + "---:|" * len(threads))
        for w, n in sorted({(c[0], c[1]) for c in cells}):
            row = [w, SIZE_NAME.get(n, str(n))]
            for t in threads:
                f, u = ns(FUSED, w, n, t), ns(UNFUSED, w, n, t)
                row.append(f"{u / f:.2f}×" if f and u else "–")
            out.append("| " + " | ".join(row) + " |")

    mm = sorted(k for k in rec if k[1] == "matmul1024")
    if mm:
        out.append("\n### matmul1024 (C = A·B, f32, 1024×1024)\n")
        out.append("| peer | threads | ms per call | GFLOP/s |")
        out.append("|---|---:|---:|---:|")
        for k in mm:
            v, kv = rec[k]
            out.append(f"| {k[0]} | {k[3]} | {v * k[2] / 1e6:.2f} | {kv.get('gflops', '–')} |")
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])

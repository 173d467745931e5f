// Matmul programs: a packed, register-blocked GEMM (the BLIS / GotoBLAS loop structure) with the
// fused elementwise epilogue applied to each block of rows right after it is computed, while it
// is still in L2.
//
// Why our own kernel and not a BLAS library: Debian's reference BLAS (libblas3) is an unblocked
// triple loop, ~20x slower than a tuned kernel; OpenBLAS or BLIS would be fast but add a
// dependency (and their own thread pools, which fight oneTBB's workers for the cores), and none
// fuses an epilogue or reads f16 / bf16 operands. The kernel below is ~250 lines, uses the
// caller's TBB arena, converts any float dtype while packing, and reaches most of the core's
// FMA peak on the shapes that matter (~100 GFLOP/s single-threaded on 1024^3 f32 on Zen 4,
// Eigen 3.4: ~82; docs/cpu-backend.md).
//
// Loops (per batch matrix, C[M, N] = A[M, K] x B[K, N]):
//   jc over N by NC:     pack B[:, jc:jc+NC] into NR-wide column panels (K x NR each), shared;
//   ic over M by MC:     (parallel) for pc over K by KC: pack A[ic:ic+MC, pc:pc+KC] into
//                        MR-tall row panels, then for each NR panel and MR panel run the
//                        micro-kernel (an MR x NR tile of C in vector registers, KC rank-1
//                        updates); then, when NC covers N, the epilogue on rows [ic, ic+MC).
// Micro-kernel tiles: 12 x 32 floats with AVX-512 (24 zmm accumulators), 6 x 16 with AVX2;
// the same in f64 with half the lanes; GCC vector extensions, so the portable build works too.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "fast_program.h"

namespace kiln::cpu::fast {
namespace {

#if defined(__AVX512F__)
constexpr std::size_t kVecBytes = 64;
constexpr int kMR = 12;
#elif defined(__AVX__)
constexpr std::size_t kVecBytes = 32;
constexpr int kMR = 6;
#else
constexpr std::size_t kVecBytes = 16;
constexpr int kMR = 4;
#endif
constexpr int kNV = 2;  // vectors per tile row

template <class T>
struct Vec {
  typedef T type __attribute__((vector_size(kVecBytes)));
  typedef T utype __attribute__((vector_size(kVecBytes), aligned(alignof(T))));
  static constexpr int W = static_cast<int>(kVecBytes / sizeof(T));
};

template <class T>
struct Tile {
  static constexpr int MR = kMR;
  static constexpr int W = Vec<T>::W;
  static constexpr int NR = kNV * W;
  // KC: the depth of one pass of the micro-kernel over a KC x NR sliver of B and an MR x KC panel
  // of A (f32, AVX-512: 32 KiB + 12 KiB, streaming through L1 from L2). Measured on 1024^3 f32,
  // one thread: KC = 128 / 256 / 384 gave ~93 / ~98 / ~96 GFLOP/s. MC: an MC x KC block of A
  // stays in L2 (f32: 144 x 256 x 4 = 144 KiB of the 1 MiB L2).
  static constexpr std::size_t KC = std::is_same_v<T, float> ? 256 : 128;
  static constexpr std::size_t MC = static_cast<std::size_t>(MR) * 12;
  // Most bytes of packed B shared at once (all of K for NC columns): beyond it N is split.
  static constexpr std::size_t kPackedBBudget = std::size_t{8} << 20;
  // NC: the columns of B packed at once for a K-deep product (all of N within the budget).
  static std::size_t column_block(std::size_t k, std::size_t n) {
    if (k * n * sizeof(T) <= kPackedBBudget) return n;
    return std::max<std::size_t>(NR, (kPackedBBudget / (k * sizeof(T))) / NR * NR);
  }
  // Rows of one packed A block: an MC block, or the whole of a smaller matrix, in MR panels.
  static std::size_t packed_a_rows(std::size_t m) { return (std::min(MC, m) + MR - 1) / MR * MR; }
};

// C[0:MR, 0:NR] (+)= A_panel (MR x kc, packed k-major) x B_panel (kc x NR, packed k-major).
template <class T>
void micro_kernel(std::size_t kc, const T* __restrict a, const T* __restrict b, T* __restrict c, std::size_t ldc,
                  bool accumulate) {
  using V = typename Vec<T>::type;
  using U = typename Vec<T>::utype;
  constexpr int MR = Tile<T>::MR;
  constexpr int W = Tile<T>::W;
  constexpr int NR = Tile<T>::NR;
  V acc[MR][kNV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[i][v] = V{};
  for (std::size_t p = 0; p < kc; ++p) {
    V bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = *reinterpret_cast<const U*>(b + p * NR + static_cast<std::size_t>(v * W));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T s = a[p * MR + static_cast<std::size_t>(i)];
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] += s * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      U* dst = reinterpret_cast<U*>(c + static_cast<std::size_t>(i) * ldc + static_cast<std::size_t>(v * W));
      if (accumulate)
        *dst = *dst + acc[i][v];
      else
        *dst = acc[i][v];
    }
}

// One batch matrix's operands.
struct Operand {
  const std::byte* base = nullptr;
  ir::DType dtype;
  std::size_t esize = 0;
};

// Packs rows [i0, i0 + mc) x cols [p0, p0 + kc) of A (row-major, leading dim lda) into MR-tall
// panels: panel r, column p, row i at [r * MR * kc + p * MR + i]; rows beyond mc are zero.
template <class T>
void pack_a(const Operand& a, std::size_t lda, std::size_t i0, std::size_t mc, std::size_t p0, std::size_t kc, T* out,
            T* row) {
  constexpr int MR = Tile<T>::MR;
  const VClass cls = std::is_same_v<T, float> ? VClass::F32 : VClass::F64;
  const std::size_t panels = (mc + MR - 1) / MR;
  for (std::size_t r = 0; r < panels; ++r) {
    T* panel = out + r * MR * kc;
    for (int i = 0; i < MR; ++i) {
      const std::size_t m = r * MR + static_cast<std::size_t>(i);
      if (m < mc) {
        load_elements(a.base + ((i0 + m) * lda + p0) * a.esize, a.dtype, 1, kc, row, cls);
        for (std::size_t p = 0; p < kc; ++p) panel[p * MR + static_cast<std::size_t>(i)] = row[p];
      } else {
        for (std::size_t p = 0; p < kc; ++p) panel[p * MR + static_cast<std::size_t>(i)] = T{0};
      }
    }
  }
}

// Packs rows [p0, p1) x cols [j0, j0 + nc) of B (row-major, leading dim ldb) into NR-wide
// panels spanning all K rows: panel q, row p, column j at [q * NR * K + p * NR + j].
template <class T>
void pack_b_rows(const Operand& b, std::size_t ldb, std::size_t k, std::size_t p0, std::size_t p1, std::size_t j0,
                 std::size_t nc, T* out, T* row) {
  constexpr int NR = Tile<T>::NR;
  const VClass cls = std::is_same_v<T, float> ? VClass::F32 : VClass::F64;
  const std::size_t panels = (nc + NR - 1) / NR;
  for (std::size_t p = p0; p < p1; ++p) {
    load_elements(b.base + (p * ldb + j0) * b.esize, b.dtype, 1, nc, row, cls);
    for (std::size_t q = 0; q < panels; ++q) {
      T* dst = out + q * NR * k + p * NR;
      const std::size_t j_begin = q * NR;
      const std::size_t valid = std::min<std::size_t>(NR, nc - j_begin);
      std::memcpy(dst, row + j_begin, valid * sizeof(T));
      for (std::size_t j = valid; j < static_cast<std::size_t>(NR); ++j) dst[j] = T{0};
    }
  }
}

// C[ic:ic+mc, jc:jc+nc] (+)= one KC block of the product: A's rows [ic, ic+mc) packed for the
// block (apack, kc deep) times the block's rows of the packed B panels (bp at the block's first
// row; panels k deep).
template <class T>
void multiply_block(const T* apack, std::size_t kc, const T* bp, std::size_t k, std::size_t ic, std::size_t mc,
                    std::size_t jc, std::size_t nc, T* c, std::size_t ldc, bool accumulate) {
  constexpr int MR = Tile<T>::MR;
  constexpr int NR = Tile<T>::NR;
  alignas(64) T tmp[MR * NR];
  const std::size_t ipanels = (mc + MR - 1) / MR;
  const std::size_t jpanels = (nc + NR - 1) / NR;
  for (std::size_t q = 0; q < jpanels; ++q) {
    const T* bpanel = bp + q * NR * k;
    const std::size_t j = jc + q * NR;
    const std::size_t nv = std::min<std::size_t>(NR, jc + nc - j);
    for (std::size_t r = 0; r < ipanels; ++r) {
      const T* apanel = apack + r * MR * kc;
      const std::size_t i = ic + r * MR;
      const std::size_t mv = std::min<std::size_t>(MR, ic + mc - i);
      T* cij = c + i * ldc + j;
      if (mv == static_cast<std::size_t>(MR) && nv == static_cast<std::size_t>(NR)) {
        micro_kernel<T>(kc, apanel, bpanel, cij, ldc, accumulate);
      } else {
        micro_kernel<T>(kc, apanel, bpanel, tmp, NR, false);
        for (std::size_t ii = 0; ii < mv; ++ii)
          for (std::size_t jj = 0; jj < nv; ++jj)
            cij[ii * ldc + jj] = accumulate ? cij[ii * ldc + jj] + tmp[ii * NR + jj] : tmp[ii * NR + jj];
      }
    }
  }
}

// C[ic:ic+mc, jc:jc+nc] = the product over all of K, from packed B panels (all K) and A packed per
// KC block.
template <class T>
void compute_rows(const Operand& a, std::size_t lda, std::size_t k, const T* bp, std::size_t ic, std::size_t mc,
                  std::size_t jc, std::size_t nc, T* c, std::size_t ldc, T* apack, T* row) {
  constexpr std::size_t KC = Tile<T>::KC;
  if (k == 0) {
    for (std::size_t i = 0; i < mc; ++i) std::fill(c + (ic + i) * ldc + jc, c + (ic + i) * ldc + jc + nc, T{0});
    return;
  }
  for (std::size_t pc = 0; pc < k; pc += KC) {
    const std::size_t kc = std::min(KC, k - pc);
    pack_a(a, lda, ic, mc, pc, kc, apack, row);
    multiply_block<T>(apack, kc, bp + pc * Tile<T>::NR, k, ic, mc, jc, nc, c, ldc, pc != 0);
  }
}

struct MatmulCtx {
  const Launch* launch = nullptr;
  BlockRunner epilogue;
  std::uint32_t out_reg = 0;
  RegInfo reg;
  Operand a, b;
  std::size_t m = 0, k = 0, n = 0;
  std::vector<std::uint64_t> a_batch, b_batch;  // per output batch: batch matrix index of A, B
  std::byte* c = nullptr;                       // [batches, M, N] of the compute type
  std::atomic<bool> failed{false};
};

// Epilogue over rows [m0, m1) of batch matrix `bi`; C holds T.
template <class T>
void run_epilogue_rows(MatmulCtx& x, std::size_t bi, std::size_t m0, std::size_t m1, std::byte* scratch, void** ptrs,
                       void* conv) {
  const T* c = reinterpret_cast<const T*>(x.c);
  const std::uint64_t begin = (bi * x.m + m0) * x.n;
  const std::uint64_t end = (bi * x.m + m1) * x.n;
  const VClass want = x.reg.cls;
  const bool same = (want == (std::is_same_v<T, float> ? VClass::F32 : VClass::F64)) && x.reg.fixup == Fixup::None;
  for (std::uint64_t s = begin; s < end; s += kBlock) {
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, end - s));
    if (same) {
      ptrs[x.out_reg] = const_cast<T*>(c + s);
    } else {
      if (want == VClass::F32) {
        float* d = static_cast<float*>(conv);
        for (std::size_t i = 0; i < len; ++i) d[i] = static_cast<float>(c[s + i]);
      } else {
        double* d = static_cast<double*>(conv);
        for (std::size_t i = 0; i < len; ++i) d[i] = static_cast<double>(c[s + i]);
      }
      apply_fixup(conv, want, x.reg.fixup, len);
      ptrs[x.out_reg] = conv;
    }
    if (!x.epilogue.run(s, len, scratch, ptrs)) {
      x.failed.store(true, std::memory_order_relaxed);
      return;
    }
  }
}

// What one task of gemm() packs into and runs its epilogue with, sized for the shapes at hand
// (an MC x KC block of A only when the matrix is that large) and allocated once per task: a
// batched matmul of small matrices (attention's heads) runs many matrices per task, and zeroed
// full-size buffers per matrix cost more than the products (a 12 x 8 x 16 product paid a 144 KiB
// memset). Uninitialised: the packers write every element the micro-kernel reads, padding too.
template <class T>
struct PackedA {
  PackedA(std::size_t a_rows, std::size_t k)
      : panels(std::make_unique_for_overwrite<T[]>(a_rows * std::min(Tile<T>::KC, std::max<std::size_t>(k, 1)))),
        row(std::make_unique_for_overwrite<T[]>(std::min(Tile<T>::KC, std::max<std::size_t>(k, 1)))) {}
  std::unique_ptr<T[]> panels, row;  // one MC x KC block of A in MR panels; one row of A while packing
};

template <class T>
struct RowWork {
  RowWork(const MatmulCtx& x, std::size_t a_rows, bool epilogue)
      : a(a_rows, x.k),
        scratch(epilogue ? x.epilogue.scratch_bytes() : 0),
        ptrs(x.epilogue.num_regs()),
        conv(std::make_unique_for_overwrite<double[]>(epilogue ? kBlock : 0)) {}
  PackedA<T> a;
  Scratch scratch;
  std::vector<void*> ptrs;
  std::unique_ptr<double[]> conv;
};

// The B side: NR-wide panels of B[:, jc:jc+nc] over all of K, and one row of B while packing.
template <class T>
struct PackedB {
  PackedB(std::size_t k, std::size_t nc)
      : panels(std::make_unique_for_overwrite<T[]>((nc + Tile<T>::NR - 1) / Tile<T>::NR * Tile<T>::NR *
                                                   std::max<std::size_t>(k, 1))),
        row(std::make_unique_for_overwrite<T[]>(std::max<std::size_t>(nc, 1))) {}
  std::unique_ptr<T[]> panels, row;
};

template <class T>
void gemm(MatmulCtx& x) {
  constexpr std::size_t MC = Tile<T>::MC;
  const std::size_t m = x.m, n = x.n, k = x.k;
  const std::size_t batches = x.a_batch.size();
  T* c = reinterpret_cast<T*>(x.c);
  const std::size_t nc = Tile<T>::column_block(k, n);
  const bool fuse_epilogue = nc >= n;
  const std::size_t ib = (m + MC - 1) / MC;
  const std::size_t a_rows = Tile<T>::packed_a_rows(m);
  const std::uint64_t flops = static_cast<std::uint64_t>(m) * n * std::max<std::size_t>(k, 1);
  // Small matrices: one task per run of batch matrices (each packs its own B). Large: batch by
  // batch, with the row blocks of one matrix in parallel over a shared packed B.
  const bool per_batch_tasks = batches > 1 && flops < (std::uint64_t{1} << 22);

  // `serial`: the caller's buffers, when the row blocks run on this thread (else each parallel
  // piece makes its own).
  auto one_matrix = [&](std::size_t bi, PackedB<T>& bp, RowWork<T>* serial) {
    const Operand a{x.a.base + x.a_batch[bi] * m * k * x.a.esize, x.a.dtype, x.a.esize};
    const Operand b{x.b.base + x.b_batch[bi] * k * n * x.b.esize, x.b.dtype, x.b.esize};
    T* cb = c + bi * m * n;
    for (std::size_t jc = 0; jc < n; jc += nc) {
      const std::size_t ncur = std::min(nc, n - jc);
      auto rows = [&](RowWork<T>& w, std::uint64_t r0, std::uint64_t r1) {
        for (std::uint64_t r = r0; r < r1; ++r) {
          const std::size_t ic = r * MC;
          const std::size_t mc = std::min(MC, m - ic);
          compute_rows<T>(a, k, k, bp.panels.get(), ic, mc, jc, ncur, cb, n, w.a.panels.get(), w.a.row.get());
          if (fuse_epilogue) run_epilogue_rows<T>(x, bi, ic, ic + mc, w.scratch.data(), w.ptrs.data(), w.conv.get());
        }
      };
      if (serial != nullptr) {
        pack_b_rows<T>(b, n, k, 0, k, jc, ncur, bp.panels.get(), bp.row.get());
        rows(*serial, 0, ib);
        continue;
      }
      parallel_ranges(*x.launch, k, 64, [&](std::uint64_t p0, std::uint64_t p1) {
        const auto row = std::make_unique_for_overwrite<T[]>(std::max<std::size_t>(ncur, 1));
        pack_b_rows<T>(b, n, k, p0, p1, jc, ncur, bp.panels.get(), row.get());
      });
      parallel_ranges(*x.launch, ib, 1, [&](std::uint64_t r0, std::uint64_t r1) {
        RowWork<T> w(x, a_rows, fuse_epilogue);
        rows(w, r0, r1);
      });
    }
    if (fuse_epilogue) return;
    auto epi = [&](std::uint64_t r0, std::uint64_t r1) {
      RowWork<T> w(x, 0, true);
      for (std::uint64_t r = r0; r < r1; ++r)
        run_epilogue_rows<T>(x, bi, r * MC, std::min(m, (r + 1) * MC), w.scratch.data(), w.ptrs.data(), w.conv.get());
    };
    if (serial != nullptr)
      epi(0, ib);
    else
      parallel_ranges(*x.launch, ib, 1, epi);
  };

  if (per_batch_tasks) {
    const std::uint64_t grain =
        std::max<std::uint64_t>(1, (std::uint64_t{1} << 20) / std::max<std::uint64_t>(flops, 1));
    parallel_ranges(*x.launch, batches, grain, [&](std::uint64_t b0, std::uint64_t b1) {
      PackedB<T> bp(k, std::min(nc, n));
      RowWork<T> w(x, a_rows, fuse_epilogue);
      for (std::uint64_t bi = b0; bi < b1; ++bi) one_matrix(bi, bp, &w);
    });
    return;
  }
  const bool parallel = flops >= kParallelThreshold * 16;
  PackedB<T> bp(k, std::min(nc, n));
  std::optional<RowWork<T>> serial;
  if (!parallel) serial.emplace(x, a_rows, fuse_epilogue);
  for (std::size_t bi = 0; bi < batches; ++bi) one_matrix(bi, bp, serial ? &*serial : nullptr);
}

std::vector<std::uint64_t> batch_map(const ir::Shape& in, const ir::Shape& out) {
  // Linear batch index of `in` read at each linear batch index of `out` (broadcast dims of size 1).
  std::uint64_t total = 1;
  for (std::uint64_t d : out) total *= d;
  std::vector<std::uint64_t> map(total);
  std::vector<std::uint64_t> idx(out.size(), 0);
  for (std::uint64_t i = 0; i < total; ++i) {
    std::uint64_t at = 0;
    for (std::size_t d = 0; d < out.size(); ++d) at = at * in[d] + (in[d] == 1 ? 0 : idx[d]);
    map[i] = at;
    for (std::size_t d = out.size(); d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
  return map;
}

// B row-major, as a panel source: each panel copies its columns from every row. (pack_b_rows, the
// matmul programs' packer, goes through a row buffer: with it conv2d_bwd measured 291-294 ms
// against 278-279, two alternating runs on a noisy VM.)
template <class T>
class RowMajorPanels final : public GemmPanelSource<T> {
 public:
  RowMajorPanels(const T* b, std::size_t ldb, std::size_t k) : b_(b), ldb_(ldb), k_(k) {}
  void pack(std::size_t j0, std::size_t width, T* panels) const override {
    constexpr std::size_t NR = Tile<T>::NR;
    for (std::size_t q = 0; q * NR < width; ++q) {
      const std::size_t valid = std::min(NR, width - q * NR);
      T* panel = panels + q * NR * k_;
      for (std::size_t p = 0; p < k_; ++p, panel += NR) {
        std::copy_n(b_ + p * ldb_ + j0 + q * NR, valid, panel);
        std::fill(panel + valid, panel + NR, T{0});
      }
    }
  }

 private:
  const T* b_;
  std::size_t ldb_, k_;
};

// Bytes of packed B one pass of gemm_rows packs and multiplies while it is still in L2 (half of
// this machine class's 1 MiB, beside A's blocks).
constexpr std::size_t kPanelChunkBytes = std::size_t{512} << 10;

}  // namespace

template <class T>
std::size_t gemm_panel_width() {
  return Tile<T>::NR;
}
template std::size_t gemm_panel_width<float>();
template std::size_t gemm_panel_width<double>();

// N in chunks whose packed panels stay in L2 between packing and use. One chunk: A packed block
// by block right before its block is used, as the matmul programs do, while it is hot. Several
// chunks: all of A packed once (m x k: the callers' A is a weight or one pass of columns), so that
// no chunk packs it again. Each element of C sums its KC blocks in order either way.
template <class T>
void gemm_rows(std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda, const GemmPanelSource<T>& b,
               T* c, std::size_t ldc, bool add_to_c) {
  constexpr std::size_t MR = Tile<T>::MR, NR = Tile<T>::NR, MC = Tile<T>::MC, KC = Tile<T>::KC;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!add_to_c)
      for (std::size_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, T{0});
    return;
  }
  const ir::DType dtype = std::is_same_v<T, float> ? ir::dtypes::f32 : ir::dtypes::f64;
  const Operand ao{reinterpret_cast<const std::byte*>(a), dtype, sizeof(T)};
  const std::size_t chunk =
      std::min(std::max(4 * NR, kPanelChunkBytes / (k * sizeof(T)) / NR * NR), (n + NR - 1) / NR * NR);
  const bool one_chunk = n <= chunk;
  // Packed A: one block (one chunk), or every block (ic, pc) at ic·k + pc·(its rows rounded up to MR).
  const auto ap = std::make_unique_for_overwrite<T[]>(one_chunk ? Tile<T>::packed_a_rows(m) * std::min(KC, k)
                                                                : (m + MR - 1) / MR * MR * k);
  const auto row = std::make_unique_for_overwrite<T[]>(std::min(KC, k));
  auto a_block = [&](std::size_t ic, std::size_t pc) {
    return one_chunk ? ap.get() : ap.get() + ic * k + pc * ((std::min(MC, m - ic) + MR - 1) / MR * MR);
  };
  auto pack_a_block = [&](std::size_t ic, std::size_t pc) {
    pack_a(ao, lda, ic, std::min(MC, m - ic), pc, std::min(KC, k - pc), a_block(ic, pc), row.get());
  };
  if (!one_chunk)
    for (std::size_t ic = 0; ic < m; ic += MC)
      for (std::size_t pc = 0; pc < k; pc += KC) pack_a_block(ic, pc);
  const auto bp = std::make_unique_for_overwrite<T[]>(chunk * k);
  for (std::size_t jc = 0; jc < n; jc += chunk) {
    const std::size_t ncur = std::min(chunk, n - jc);
    b.pack(jc, ncur, bp.get());
    for (std::size_t ic = 0; ic < m; ic += MC)
      for (std::size_t pc = 0; pc < k; pc += KC) {
        if (one_chunk) pack_a_block(ic, pc);
        multiply_block<T>(a_block(ic, pc), std::min(KC, k - pc), bp.get() + pc * NR, k, ic, std::min(MC, m - ic), jc,
                          ncur, c, ldc, add_to_c || pc != 0);
      }
  }
}

template <class T>
void gemm_rows(std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda, const T* b, std::size_t ldb,
               T* c, std::size_t ldc, bool add_to_c) {
  gemm_rows<T>(m, n, k, a, lda, RowMajorPanels<T>(b, ldb, k), c, ldc, add_to_c);
}
template void gemm_rows<float>(std::size_t, std::size_t, std::size_t, const float*, std::size_t, const float*,
                               std::size_t, float*, std::size_t, bool);
template void gemm_rows<double>(std::size_t, std::size_t, std::size_t, const double*, std::size_t, const double*,
                                std::size_t, double*, std::size_t, bool);
template void gemm_rows<float>(std::size_t, std::size_t, std::size_t, const float*, std::size_t,
                               const GemmPanelSource<float>&, float*, std::size_t, bool);
template void gemm_rows<double>(std::size_t, std::size_t, std::size_t, const double*, std::size_t,
                                const GemmPanelSource<double>&, double*, std::size_t, bool);

std::string run_matmul(const Launch& launch, bool* fault) {
  const fusion::FusedProgram& p = *launch.program;
  const fusion::MatmulSpec& spec = *p.matmul;
  const CBlock& cb = launch.compiled->blocks[0];
  if (spec.lhs >= p.inputs.size() || spec.rhs >= p.inputs.size()) return "matmul operands";
  if (!launch.inputs[spec.lhs] || !launch.inputs[spec.rhs]) return "matmul operands not bound";
  const HostTensor& a = *launch.inputs[spec.lhs];
  const HostTensor& b = *launch.inputs[spec.rhs];
  if (!a.dtype().is_float() || !b.dtype().is_float()) return "matmul of non-float operands";
  const ir::Shape out_shape = launch.concrete(cb.reference);
  const std::size_t r = out_shape.size();
  if (r < 2 || a.shape().size() != r || b.shape().size() != r) return "matmul ranks";
  const std::uint64_t m = a.shape()[r - 2], k = a.shape()[r - 1], n = b.shape()[r - 1];
  if (b.shape()[r - 2] != k || out_shape[r - 2] != m || out_shape[r - 1] != n) return "matmul shapes";
  ir::Shape ob(out_shape.begin(), out_shape.end() - 2), ab(a.shape().begin(), a.shape().end() - 2),
      bb(b.shape().begin(), b.shape().end() - 2);
  for (std::size_t d = 0; d < ob.size(); ++d) {
    if ((ab[d] != ob[d] && ab[d] != 1) || (bb[d] != ob[d] && bb[d] != 1)) return "matmul batch dims";
  }
  const RegInfo reg = cb.regs[spec.out];
  if (reg.cls != VClass::F32 && reg.cls != VClass::F64) return "matmul output dtype";
  const bool f64 = a.dtype() == ir::dtypes::f64 || b.dtype() == ir::dtypes::f64 || reg.cls == VClass::F64;
  const std::size_t tsize = f64 ? 8 : 4;

  MatmulCtx x;
  x.launch = &launch;
  x.out_reg = spec.out;
  x.reg = reg;
  x.a = Operand{a.data(), a.dtype(), a.dtype().size_bytes()};
  x.b = Operand{b.data(), b.dtype(), b.dtype().size_bytes()};
  x.m = m;
  x.k = k;
  x.n = n;
  x.a_batch = batch_map(ab, ob);
  x.b_batch = batch_map(bb, ob);

  // C straight into an output when the product itself is a native output of the compute type.
  std::vector<std::uint32_t> written;
  for (const CStore& s : cb.stores) {
    if (s.reg != spec.out || !launch.outputs[s.output]) continue;
    const HostTensor& o = *launch.outputs[s.output];
    const bool native =
        f64 ? o.dtype() == ir::dtypes::f64 : (o.dtype() == ir::dtypes::f32 || o.dtype() == ir::dtypes::flex32);
    if (native && o.shape() == out_shape) {
      x.c = o.mutable_data();
      written.push_back(s.output);
      break;
    }
  }
  const std::uint32_t preset[] = {spec.out};
  if (std::string e = x.epilogue.prepare(launch, 0, out_shape, preset, written); !e.empty()) return e;
  const std::uint64_t total = ir::num_elements(out_shape);
  if (total == 0) return {};
  Result<HostBuffer> temp = HostBuffer();
  if (x.c == nullptr) {
    temp = launch.allocator->allocate(total * tsize);
    if (!temp.ok()) return temp.error().message;
    x.c = temp->data();
  }
  if (f64)
    gemm<double>(x);
  else
    gemm<float>(x);
  if (x.failed.load(std::memory_order_relaxed)) *fault = true;
  return {};
}

}  // namespace kiln::cpu::fast

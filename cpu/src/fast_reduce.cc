// Reduce programs: the prologue block (fuse-on-read) runs chunk by chunk straight into the
// accumulators, the reduction finishes in registers, and the epilogue block (fuse-on-write) runs
// on the reduced values while they are still in cache. No intermediate tensor is materialised
// unless the program stores it.
//
// The reduction input is viewed as [outer, n, inner] (n = the reduced axis):
//   inner == 1        rows: each task owns whole rows; a row is reduced horizontally chunk by
//                     chunk (vector lanes of partial results, combined at the end of the row);
//   inner >= 16       column tiles: a task owns (o, up to kBlock consecutive i) and adds the n
//                     prologue rows of that tile element-wise (vertical, vectorised over i);
//   1 < inner < 16    short columns: a task walks its o's contiguously and scatters each element
//                     into its column's accumulator.
// Float sums, means and products accumulate in f64 whatever the input dtype (more precise than
// the f32 accumulator docs/spec/fusion.md §14.7 asks for, and the reference's choice, so results round to
// the same float almost always); integers wrap in 64 bits (the reference's rule).
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>

#include "fast_program.h"

#define KILN_IVDEP _Pragma("GCC ivdep")

namespace kiln::cpu::fast {
namespace {

using B8 = std::uint8_t;

// The lanes of a row reduction's partial results: one native vector register each. A wider GCC
// vector than the machine's is split into halves that GCC kept on the stack, storing and
// reloading every partial result each step (AVX2: ~1 ns per element on a row sum).
#if defined(__AVX512F__)
constexpr std::size_t kLaneBytes = 64;
#elif defined(__AVX__)
constexpr std::size_t kLaneBytes = 32;
#else
constexpr std::size_t kLaneBytes = 16;
#endif

enum class Red { Sum, Mean, Prod, Max, Min, MaxAbs, ArgMax, ArgMin, Any, All };

std::optional<Red> red_of(ir::OpKind k) {
  switch (k) {
    case ir::OpKind::Numeric_SumDim: return Red::Sum;
    case ir::OpKind::Numeric_MeanDim: return Red::Mean;
    case ir::OpKind::Numeric_ProdDim: return Red::Prod;
    case ir::OpKind::Numeric_MaxDim: return Red::Max;
    case ir::OpKind::Numeric_MinDim: return Red::Min;
    case ir::OpKind::Numeric_MaxAbsDim: return Red::MaxAbs;
    case ir::OpKind::Numeric_ArgMax: return Red::ArgMax;
    case ir::OpKind::Numeric_ArgMin: return Red::ArgMin;
    case ir::OpKind::Base_AnyDim: return Red::Any;
    case ir::OpKind::Base_AllDim: return Red::All;
    default: return std::nullopt;
  }
}

template <class T>
struct ArgState {
  T best{};
  std::uint64_t at = 0;
  bool has = false;
};

template <Red R, class T>
struct StateOf {
  static constexpr bool kFloat = std::is_floating_point_v<T>;
  using type = std::conditional_t<
      R == Red::Sum || R == Red::Mean || R == Red::Prod, std::conditional_t<kFloat, double, T>,
      std::conditional_t<
          R == Red::Max || R == Red::Min, T,
          std::conditional_t<R == Red::MaxAbs, std::conditional_t<kFloat, T, std::uint64_t>,
                             std::conditional_t<R == Red::ArgMax || R == Red::ArgMin, ArgState<T>, B8>>>>;
};

template <class T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <class T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(v);
  else
    return (void)v, false;
}

template <class T>
std::uint64_t magnitude(T v) {
  if constexpr (std::is_signed_v<T>)
    return v < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  else
    return static_cast<std::uint64_t>(v);
}

template <Red R, class T>
struct Acc {
  using S = typename StateOf<R, T>::type;
  static constexpr bool kFloat = std::is_floating_point_v<T>;

  static S init() {
    if constexpr (R == Red::Sum || R == Red::Mean || R == Red::MaxAbs)
      return S{0};
    else if constexpr (R == Red::Prod)
      return S{1};
    else if constexpr (R == Red::Max)
      return kFloat ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
    else if constexpr (R == Red::Min)
      return kFloat ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
    else if constexpr (R == Red::ArgMax || R == Red::ArgMin)
      return S{};
    else if constexpr (R == Red::All)
      return B8{1};
    else
      return B8{0};
  }

  static void point(S& s, T v, std::uint64_t j) {
    if constexpr (R == Red::Sum || R == Red::Mean) {
      if constexpr (kFloat)
        s += static_cast<double>(v);
      else
        s = wrap_add(s, v);
    } else if constexpr (R == Red::Prod) {
      if constexpr (kFloat)
        s *= static_cast<double>(v);
      else
        s = wrap_mul(s, v);
    } else if constexpr (R == Red::Max) {
      // NaN propagates (and, once in, stays). Bitwise `|`, not `||`: no branch, so the lanes
      // loop below vectorises.
      const bool take = (v > s) | is_nan(v);
      s = take ? v : s;
    } else if constexpr (R == Red::Min) {
      const bool take = (v < s) | is_nan(v);
      s = take ? v : s;
    } else if constexpr (R == Red::MaxAbs) {
      if constexpr (kFloat) {
        const T a = std::fabs(v);
        const bool take = (a > s) | (a != a);
        s = take ? a : s;
      } else {
        const std::uint64_t a = magnitude(v);
        s = a > s ? a : s;
      }
    } else if constexpr (R == Red::ArgMax || R == Red::ArgMin) {
      // First occurrence wins; the first NaN beats everything (PyTorch, the reference).
      if (!s.has) {
        s = S{v, j, true};
        return;
      }
      if (is_nan(s.best)) return;
      const bool better = is_nan(v) || (R == Red::ArgMax ? v > s.best : v < s.best);
      if (better) {
        s.best = v;
        s.at = j;
      }
    } else if constexpr (R == Red::Any) {
      s = static_cast<B8>(s | (v != 0));
    } else {
      s = static_cast<B8>(s & (v != 0));
    }
  }

  // A contiguous piece of one line: v[e] is element j0 + e of the reduced axis.
  static void horizontal(S& s, const T* v, std::size_t n, std::uint64_t j0) {
    constexpr bool kLanes = (R == Red::Sum || R == Red::Mean || R == Red::Prod || R == Red::Max || R == Red::Min);
    if constexpr (kLanes && !std::is_same_v<T, std::uint8_t>) {
      // Independent partial results in the lanes of explicit vectors (GCC's vector extensions:
      // the auto-vectoriser does not always see through the lanes loop once it is inlined into
      // the row loop), combined at the end. Sums and products of floats widen to f64 lanes.
      using A = std::conditional_t<std::is_same_v<S, double>, double, T>;
      typedef A V __attribute__((vector_size(kLaneBytes)));
      constexpr std::size_t W = kLaneBytes / sizeof(A);
      V acc0, acc1;
      for (std::size_t l = 0; l < W; ++l) acc0[l] = acc1[l] = init();
      std::size_t e = 0;
      for (; e + 2 * W <= n; e += 2 * W) {
        V x0, x1;
        for (std::size_t l = 0; l < W; ++l) {
          x0[l] = static_cast<A>(v[e + l]);
          x1[l] = static_cast<A>(v[e + W + l]);
        }
        if constexpr (R == Red::Sum || R == Red::Mean) {
          if constexpr (kFloat)
            acc0 += x0, acc1 += x1;
          else
            wrap_add_v(acc0, x0), wrap_add_v(acc1, x1);
        } else if constexpr (R == Red::Prod) {
          if constexpr (kFloat)
            acc0 *= x0, acc1 *= x1;
          else
            wrap_mul_v(acc0, x0), wrap_mul_v(acc1, x1);
        } else if constexpr (R == Red::Max) {
          if constexpr (kFloat) {
            acc0 = ((x0 > acc0) | (x0 != x0)) ? x0 : acc0;
            acc1 = ((x1 > acc1) | (x1 != x1)) ? x1 : acc1;
          } else {
            acc0 = x0 > acc0 ? x0 : acc0;
            acc1 = x1 > acc1 ? x1 : acc1;
          }
        } else {
          if constexpr (kFloat) {
            acc0 = ((x0 < acc0) | (x0 != x0)) ? x0 : acc0;
            acc1 = ((x1 < acc1) | (x1 != x1)) ? x1 : acc1;
          } else {
            acc0 = x0 < acc0 ? x0 : acc0;
            acc1 = x1 < acc1 ? x1 : acc1;
          }
        }
      }
      for (std::size_t l = 0; l < W; ++l) {
        combine(s, static_cast<S>(acc0[l]));
        combine(s, static_cast<S>(acc1[l]));
      }
      for (; e < n; ++e) point(s, v[e], 0);
    } else {
      for (std::size_t e = 0; e < n; ++e) point(s, v[e], j0 + e);
    }
  }

  // Wrapping vector integer arithmetic in place (signed overflow through the unsigned lanes).
  // By reference: a vector returned by value wider than the build's registers changes the ABI (-Wpsabi).
  template <class V>
  static void wrap_add_v(V& a, const V& b) {
    typedef std::uint64_t U __attribute__((vector_size(sizeof(V))));
    a = reinterpret_cast<V>(reinterpret_cast<const U&>(a) + reinterpret_cast<const U&>(b));
  }
  template <class V>
  static void wrap_mul_v(V& a, const V& b) {
    typedef std::uint64_t U __attribute__((vector_size(sizeof(V))));
    a = reinterpret_cast<V>(reinterpret_cast<const U&>(a) * reinterpret_cast<const U&>(b));
  }

  // n lines side by side: v[i] is element j of line i.
  static void vertical(S* s, const T* v, std::size_t n, std::uint64_t j) {
    if constexpr (R == Red::ArgMax || R == Red::ArgMin) {
      for (std::size_t i = 0; i < n; ++i) point(s[i], v[i], j);
    } else {
      KILN_IVDEP for (std::size_t i = 0; i < n; ++i) point(s[i], v[i], j);
    }
  }

  // Merges a partial state (lanes only: order-free reductions).
  static void combine(S& s, const S& p) {
    if constexpr (R == Red::Sum || R == Red::Mean) {
      if constexpr (kFloat)
        s += p;
      else
        s = wrap_add(s, p);
    } else if constexpr (R == Red::Prod) {
      if constexpr (kFloat)
        s *= p;
      else
        s = wrap_mul(s, p);
    } else if constexpr (R == Red::Max || R == Red::Min) {
      point(s, p, 0);
    }
  }

  template <class O>
  static O finish(const S& s, std::uint64_t n, Fixup f) {
    if constexpr (R == Red::Sum || R == Red::Prod || R == Red::Mean) {
      if constexpr (kFloat) {
        const double v = R == Red::Mean ? s / static_cast<double>(n) : s;
        if constexpr (std::is_same_v<O, float>) {
          if (f == Fixup::F16) return f16_to_f32(f16_from_f64(v));
          if (f == Fixup::BF16) return bf16_to_f32(bf16_from_f64(v));
        }
        return static_cast<O>(v);
      } else {
        if constexpr (R == Red::Mean) {
          if constexpr (std::is_signed_v<T>)
            return static_cast<O>(s / static_cast<std::int64_t>(n));
          else
            return static_cast<O>(s / n);
        }
        return static_cast<O>(s);
      }
    } else if constexpr (R == Red::ArgMax || R == Red::ArgMin) {
      return static_cast<O>(s.at);
    } else {
      return static_cast<O>(s);
    }
  }
};

struct ReduceCtx {
  const Launch* launch = nullptr;
  BlockRunner prologue;
  BlockRunner epilogue;
  const fusion::Reduction* red = nullptr;
  std::uint64_t outer = 1, n = 1, inner = 1;
  Fixup out_fixup = Fixup::None;
  VClass out_cls = VClass::F32;
  std::atomic<bool> failed{false};

  ReduceCtx() = default;
  // A task's own copy (ReduceRunner::task_copy): the runners and sizes, a fresh fault flag.
  ReduceCtx(const ReduceCtx& o)
      : launch(o.launch),
        prologue(o.prologue),
        epilogue(o.epilogue),
        red(o.red),
        outer(o.outer),
        n(o.n),
        inner(o.inner),
        out_fixup(o.out_fixup),
        out_cls(o.out_cls) {}
  ReduceCtx& operator=(const ReduceCtx&) = delete;
};

// Rows [begin, end) only (inner == 1), on the calling thread: a staged program runs its stages
// row group by row group. Passed by value, never kept in the shared context: tasks of one
// launch run different ranges at once.
struct RowRange {
  std::uint64_t begin = 0, end = 0;
};

constexpr std::uint64_t kShortInner = 16;

// The epilogue block (fuse-on-write) on one chunk of reduced values, starting at output `start`.
template <class O>
inline void run_epilogue(ReduceCtx& c, std::uint32_t out_reg, O* results, std::size_t count, std::uint64_t start,
                         std::byte* escratch, void** eptrs) {
  apply_fixup(results, c.out_cls, c.out_fixup, count);
  eptrs[out_reg] = results;
  if (!c.epilogue.run(start, count, escratch, eptrs)) c.failed.store(true, std::memory_order_relaxed);
}

// Rows (inner == 1): each task owns whole rows, each reduced horizontally chunk by chunk.
template <Red R, class T, class O>
void reduce_rows(ReduceCtx& c, const RowRange* range) {
  using A = Acc<R, T>;
  using S = typename A::S;
  const std::uint32_t in_reg = c.red->input;
  const std::uint32_t out_reg = c.red->out;
  const std::uint64_t n = c.n;
  const std::uint64_t half = kParallelThreshold / 2;

  auto rows_body = [&](std::uint64_t b, std::uint64_t e) {
    Scratch ps(c.prologue.scratch_bytes()), es(c.epilogue.scratch_bytes());
    std::vector<void*> pp(c.prologue.num_regs()), ep(c.epilogue.num_regs());
    std::vector<O> results(kBlock);
    for (std::uint64_t g = b; g < e; g += kBlock) {
      const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, e - g));
      for (std::size_t r = 0; r < count; ++r) {
        S s = A::init();
        for (std::uint64_t j = 0; j < n; j += kBlock) {
          const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, n - j));
          if (!c.prologue.run((g + r) * n + j, len, ps.data(), pp.data())) {
            c.failed.store(true, std::memory_order_relaxed);
            return;
          }
          A::horizontal(s, static_cast<const T*>(pp[in_reg]), len, j);
        }
        results[r] = A::template finish<O>(s, n, c.out_fixup);
      }
      run_epilogue(c, out_reg, results.data(), count, g, es.data(), ep.data());
    }
  };
  if (range != nullptr) {
    rows_body(range->begin, range->end);
  } else {
    const std::uint64_t grain = std::max<std::uint64_t>(1, half / std::max<std::uint64_t>(n, 1));
    parallel_ranges(*c.launch, c.outer, grain, rows_body);
  }
}

// Column tiles (inner >= 16): a task owns (o, up to kBlock consecutive i), reduced vertically.
template <Red R, class T, class O>
void reduce_column_tiles(ReduceCtx& c) {
  using A = Acc<R, T>;
  using S = typename A::S;
  const std::uint32_t in_reg = c.red->input;
  const std::uint32_t out_reg = c.red->out;
  const std::uint64_t n = c.n;
  const std::uint64_t inner = c.inner;
  const std::uint64_t half = kParallelThreshold / 2;

  const std::uint64_t tiles = (inner + kBlock - 1) / kBlock;
  const std::uint64_t tasks = c.outer * tiles;
  const std::uint64_t per_task = std::min<std::uint64_t>(kBlock, inner) * std::max<std::uint64_t>(n, 1);
  const std::uint64_t grain = std::max<std::uint64_t>(1, half / per_task);
  parallel_ranges(*c.launch, tasks, grain, [&](std::uint64_t b, std::uint64_t e) {
    Scratch ps(c.prologue.scratch_bytes()), es(c.epilogue.scratch_bytes());
    std::vector<void*> pp(c.prologue.num_regs()), ep(c.epilogue.num_regs());
    std::vector<S> acc(kBlock);
    std::vector<O> results(kBlock);
    for (std::uint64_t t = b; t < e; ++t) {
      const std::uint64_t o = t / tiles;
      const std::uint64_t i0 = (t % tiles) * kBlock;
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, inner - i0));
      for (std::size_t i = 0; i < len; ++i) acc[i] = A::init();
      for (std::uint64_t j = 0; j < n; ++j) {
        if (!c.prologue.run((o * n + j) * inner + i0, len, ps.data(), pp.data())) {
          c.failed.store(true, std::memory_order_relaxed);
          return;
        }
        A::vertical(acc.data(), static_cast<const T*>(pp[in_reg]), len, j);
      }
      for (std::size_t i = 0; i < len; ++i) results[i] = A::template finish<O>(acc[i], n, c.out_fixup);
      run_epilogue(c, out_reg, results.data(), len, o * inner + i0, es.data(), ep.data());
    }
  });
}

// One o of the short columns: its n * inner elements through the prologue, each point scattered
// into its column's accumulator in `line`. False when the prologue faulted.
template <Red R, class T>
inline bool accumulate_short_columns(ReduceCtx& c, typename Acc<R, T>::S* line, std::uint64_t o, Scratch& ps,
                                     std::vector<void*>& pp) {
  using A = Acc<R, T>;
  const std::uint64_t n = c.n;
  const std::uint64_t inner = c.inner;
  const std::uint64_t base = o * n * inner;
  const std::uint64_t total = n * inner;
  for (std::uint64_t f = 0; f < total; f += kBlock) {
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, total - f));
    if (!c.prologue.run(base + f, len, ps.data(), pp.data())) return false;
    const T* v = static_cast<const T*>(pp[c.red->input]);
    std::uint64_t i = f % inner;
    std::uint64_t j = f / inner;
    for (std::size_t k = 0; k < len; ++k) {
      A::point(line[i], v[k], j);
      if (++i == inner) {
        i = 0;
        ++j;
      }
    }
  }
  return true;
}

// Short columns (1 < inner < 16): a task walks its o's contiguously, scattering into the columns.
template <Red R, class T, class O>
void reduce_short_columns(ReduceCtx& c) {
  using A = Acc<R, T>;
  using S = typename A::S;
  const std::uint32_t out_reg = c.red->out;
  const std::uint64_t n = c.n;
  const std::uint64_t inner = c.inner;
  const std::uint64_t half = kParallelThreshold / 2;

  // Short columns: groups of whole o's whose outputs fit one epilogue chunk.
  const std::uint64_t per_group = kBlock / inner;
  const std::uint64_t groups = (c.outer + per_group - 1) / per_group;
  const std::uint64_t grain = std::max<std::uint64_t>(1, half / std::max<std::uint64_t>(per_group * inner * n, 1));
  parallel_ranges(*c.launch, groups, grain, [&](std::uint64_t b, std::uint64_t e) {
    Scratch ps(c.prologue.scratch_bytes()), es(c.epilogue.scratch_bytes());
    std::vector<void*> pp(c.prologue.num_regs()), ep(c.epilogue.num_regs());
    std::vector<S> acc(kBlock);
    std::vector<O> results(kBlock);
    for (std::uint64_t g = b; g < e; ++g) {
      const std::uint64_t o0 = g * per_group;
      const std::uint64_t o1 = std::min(c.outer, o0 + per_group);
      const std::size_t count = static_cast<std::size_t>((o1 - o0) * inner);
      for (std::size_t i = 0; i < count; ++i) acc[i] = A::init();
      for (std::uint64_t o = o0; o < o1; ++o) {
        if (!accumulate_short_columns<R, T>(c, acc.data() + (o - o0) * inner, o, ps, pp)) {
          c.failed.store(true, std::memory_order_relaxed);
          return;
        }
      }
      for (std::size_t i = 0; i < count; ++i) results[i] = A::template finish<O>(acc[i], n, c.out_fixup);
      run_epilogue(c, out_reg, results.data(), count, o0 * inner, es.data(), ep.data());
    }
  });
}

// The reduction's loops: picks the layout of [outer, n, inner] (rows, column tiles, short columns).
template <Red R, class T, class O>
void reduce_loops(ReduceCtx& c, const RowRange* range) {
  if (c.inner == 1)
    reduce_rows<R, T, O>(c, range);
  else if (c.inner >= kShortInner)
    reduce_column_tiles<R, T, O>(c);
  else
    reduce_short_columns<R, T, O>(c);
}

using LoopFn = void (*)(ReduceCtx&, const RowRange*);  // range: rows only (inner == 1)

template <Red R>
LoopFn same_class(VClass in) {
  switch (in) {
    case VClass::F32: return &reduce_loops<R, float, float>;
    case VClass::F64: return &reduce_loops<R, double, double>;
    case VClass::I64: return &reduce_loops<R, std::int64_t, std::int64_t>;
    case VClass::U64: return &reduce_loops<R, std::uint64_t, std::uint64_t>;
    case VClass::Bool: return nullptr;
  }
  return nullptr;
}

template <Red R, class T>
LoopFn index_out(VClass out) {
  if (out == VClass::I64) return &reduce_loops<R, T, std::int64_t>;
  if (out == VClass::U64) return &reduce_loops<R, T, std::uint64_t>;
  return nullptr;
}

template <Red R>
LoopFn arg_class(VClass in, VClass out) {
  switch (in) {
    case VClass::F32: return index_out<R, float>(out);
    case VClass::F64: return index_out<R, double>(out);
    case VClass::I64: return index_out<R, std::int64_t>(out);
    case VClass::U64: return index_out<R, std::uint64_t>(out);
    case VClass::Bool: return nullptr;
  }
  return nullptr;
}

template <Red R>
LoopFn bool_out(VClass in, VClass out) {
  if (out != VClass::Bool) return nullptr;
  switch (in) {
    case VClass::F32: return &reduce_loops<R, float, B8>;
    case VClass::F64: return &reduce_loops<R, double, B8>;
    case VClass::I64: return &reduce_loops<R, std::int64_t, B8>;
    case VClass::U64: return &reduce_loops<R, std::uint64_t, B8>;
    case VClass::Bool: return &reduce_loops<R, B8, B8>;
  }
  return nullptr;
}

LoopFn select_loops(Red r, VClass in, VClass out) {
  switch (r) {
    case Red::Sum: return in == out ? same_class<Red::Sum>(in) : nullptr;
    case Red::Mean: return in == out ? same_class<Red::Mean>(in) : nullptr;
    case Red::Prod: return in == out ? same_class<Red::Prod>(in) : nullptr;
    case Red::Max: return in == out ? same_class<Red::Max>(in) : nullptr;
    case Red::Min: return in == out ? same_class<Red::Min>(in) : nullptr;
    case Red::MaxAbs: return in == out ? same_class<Red::MaxAbs>(in) : nullptr;
    case Red::ArgMax: return arg_class<Red::ArgMax>(in, out);
    case Red::ArgMin: return arg_class<Red::ArgMin>(in, out);
    case Red::Any: return bool_out<Red::Any>(in, out);
    case Red::All: return bool_out<Red::All>(in, out);
  }
  return nullptr;
}

std::uint64_t integral_max(ir::DType d) {
  const int bits = static_cast<int>(d.size_bytes() * 8);
  if (d.is_uint()) return bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  return (std::uint64_t{1} << (bits - 1)) - 1;
}

}  // namespace

struct ReduceRunner::State {
  ReduceCtx c;
  LoopFn loops = nullptr;
  bool fault = false;  // fails before any element is read
};

ReduceRunner::ReduceRunner() : state_(std::make_unique<State>()) {}
ReduceRunner::~ReduceRunner() = default;

std::string ReduceRunner::prepare(const Launch& launch) {
  const CompiledProgram& cp = *launch.compiled;
  const CBlock& eb = cp.blocks[1];
  const fusion::Reduction& red = *eb.reduction;
  const std::optional<Red> r = red_of(red.op);
  if (!r) return "reduction kind";
  const std::optional<VClass> in_cls = class_of(red.input_dtype);
  const std::optional<VClass> out_cls = class_of(red.out_dtype);
  if (!in_cls || !out_cls) return "reduction dtype";
  state_->loops = select_loops(*r, *in_cls, *out_cls);
  if (state_->loops == nullptr) return "reduction of " + red.input_dtype.name() + " to " + red.out_dtype.name();

  const ir::Shape in_shape = launch.concrete(cp.blocks[0].reference);
  const ir::Shape out_shape = launch.concrete(eb.reference);
  if (red.axis < 0 || static_cast<std::size_t>(red.axis) >= in_shape.size()) return "reduction axis";
  const auto axis = static_cast<std::size_t>(red.axis);
  ir::Shape expected = in_shape;
  expected[axis] = 1;
  if (expected != out_shape) return "reduction output shape";

  ReduceCtx& c = state_->c;
  c.launch = &launch;
  c.red = &red;
  c.out_fixup = fixup_of(red.out_dtype);
  c.out_cls = *out_cls;
  c.outer = c.n = c.inner = 1;
  for (std::size_t d = 0; d < axis; ++d) c.outer *= in_shape[d];
  c.n = in_shape[axis];
  for (std::size_t d = axis + 1; d < in_shape.size(); ++d) c.inner *= in_shape[d];
  if (std::string e = c.prologue.prepare(launch, 0, in_shape); !e.empty()) return e;
  const std::uint32_t preset[] = {red.out};
  if (std::string e = c.epilogue.prepare(launch, 1, out_shape, preset); !e.empty()) return e;

  // The reference's failures: no identity for an empty axis, an integer mean of nothing, an
  // index dtype too narrow for the axis.
  const bool no_identity = *r == Red::Max || *r == Red::Min || *r == Red::MaxAbs || *r == Red::ArgMax ||
                           *r == Red::ArgMin || (*r == Red::Mean && !red.input_dtype.is_float());
  const bool lines = c.outer * c.inner != 0;
  state_->fault =
      lines && ((c.n == 0 && no_identity) || ((*r == Red::ArgMax || *r == Red::ArgMin) &&
                                              (!red.out_dtype.is_integral() || c.n - 1 > integral_max(red.out_dtype))));
  return {};
}

bool ReduceRunner::rowwise() const { return state_->c.inner == 1; }
std::uint64_t ReduceRunner::rows() const { return state_->c.outer; }
std::uint64_t ReduceRunner::row_length() const { return state_->c.n; }

void ReduceRunner::run(bool* fault) {
  ReduceCtx& c = state_->c;
  if (state_->fault) {
    *fault = true;
    return;
  }
  if (c.outer * c.inner == 0) return;
  state_->loops(c, nullptr);
  if (c.failed.load(std::memory_order_relaxed)) *fault = true;
}

bool ReduceRunner::run_rows(std::uint64_t begin, std::uint64_t end) {
  ReduceCtx& c = state_->c;
  if (state_->fault) return false;
  if (begin >= end) return true;
  const RowRange range{begin, end};
  state_->loops(c, &range);
  return !c.failed.load(std::memory_order_relaxed);
}

std::unique_ptr<ReduceRunner> ReduceRunner::task_copy() const {
  auto copy = std::make_unique<ReduceRunner>();
  copy->state_ = std::make_unique<State>(*state_);
  return copy;
}

BlockRunner& ReduceRunner::prologue() { return state_->c.prologue; }
BlockRunner& ReduceRunner::epilogue() { return state_->c.epilogue; }

std::string run_reduce(const Launch& launch, bool* fault) {
  ReduceRunner runner;
  if (std::string e = runner.prepare(launch); !e.empty()) return e;
  runner.run(fault);
  return {};
}

}  // namespace kiln::cpu::fast

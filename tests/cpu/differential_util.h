// Differential testing of the fast CPU executor against the reference executor.
//
// A random program is a list of global operations (with client-side statuses: outputs NotInit,
// uses ReadOnly, the last use ReadWrite, some Drops) over uploaded inputs. It runs twice:
//   fused      through a fusion::FusionStream with the default fusers and a CpuExecutor (what
//              the search decides: fused programs, cached plans, single fast ops);
//   reference  op by op on a ReferenceExecutor with its own CpuDevice and the same inputs.
// Every surviving tensor is compared, and the two handle containers must hold the same ids.
//
// Error bounds. Integers, bools and every float value whose computation the fast executor
// performs exactly (correctly rounded ops, libm-computed functions) must be bit-identical
// (NaN == NaN). A value downstream of an approximation (f32 exp / log / log1p / tanh, float
// reductions in another order, matmul accumulation) carries a static first-order bound
//     |fast - ref| <= abs + rel * |ref|            at finite positions,
// built op by op from the documented errors of the fast kernels (fast_math.h: exp, log <= 1 ulp,
// log1p, tanh <= 2 ulp; the bound below uses 2 and 3 for margin), one rounding of the result
// when an operand differs, and each op's sensitivity to its operands over the interval its
// operands are known to lie in (tracked statically from the input ranges). The generator only
// builds ops whose bound stays tight (rel, abs / max(1, |range|) <= 1e-3), and the comparison
// doubles it for the neglected second-order terms. NaN and infinity positions must match
// exactly everywhere.
//
// Every failure prints the seed and the program (one op per line); KILN_DIFF_SEED=<seed> runs
// that one program again.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/cpu/cpu_executor.h"
#include "kiln/cpu/device.h"
#include "kiln/fusion/fusers.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/stream.h"
#include "kiln/ir/builders.h"

namespace kiln::cpu::difftest {

using ir::DType;
using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::ScalarIr;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;
namespace dt = ir::dtypes;

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- What the programs are made of

enum class DataKind : std::uint8_t {
  General,   // floats in [-2, 2)
  Positive,  // floats in [0.5, 2)
  Special,   // General with ~15% NaN, +-inf, +-0
  SmallInt,  // [-6, 6]
  NonZero,   // [1, 9]
  WideInt,   // any bits (wrapping arithmetic)
  Bool,
  Index,     // [0, bound) (bound = size of a symbol)
  BadIndex,  // Index, one element out of range
};

struct InputSpec {
  TensorIr t;
  DataKind kind = DataKind::General;
  int bound_sym = 0;  // Index: the symbol whose size bounds the values
};

struct Check {
  TensorId id{0};
  DType dtype;
  bool exact = true;
  double abs = 0, rel = 0;
};

struct DiffProgram {
  std::uint64_t seed = 0;
  std::uint64_t instance = 0;
  std::uint64_t first_id = 1, end_id = 1;  // tensor ids [first_id, end_id)
  std::vector<std::uint64_t> sizes;        // per dim symbol (symbol 0 is size 1)
  std::vector<InputSpec> inputs;
  std::vector<Operation> ops;
  std::set<std::size_t> syncs;  // drain after op i
  std::vector<Check> checks;

  std::string to_string() const {
    std::ostringstream os;
    os << "seed=" << seed << " instance=" << instance << " sizes=[";
    for (std::size_t i = 0; i < sizes.size(); ++i) os << (i ? "," : "") << sizes[i];
    os << "]\n  inputs:";
    for (const InputSpec& in : inputs) os << " " << in.t.to_string();
    os << "\n";
    for (std::size_t i = 0; i < ops.size(); ++i) {
      os << "  [" << i << "] " << ops[i].to_string() << "\n";
      if (syncs.count(i)) os << "  -- sync --\n";
    }
    return os.str();
  }
};

// ---- Generator

// A value of the program being generated.
struct Val {
  TensorIr t;
  std::vector<int> sym;     // dim symbols
  double lo = 0, hi = 0;    // finite values lie in [lo, hi] (floats)
  double abs = 0, rel = 0;  // error bound (floats); 0 / 0 = bit-exact
  bool keep = false;        // compared even if used later
  std::size_t created = 0;  // ops before it (0 for inputs)
  bool exact() const { return abs == 0 && rel == 0; }
  double mag() const { return std::max(std::fabs(lo), std::fabs(hi)); }
};

inline double ulp_of(DType d) {
  switch (d.kind()) {
    case ir::DTypeKind::F64: return std::ldexp(1.0, -52);
    case ir::DTypeKind::F16: return std::ldexp(1.0, -10);
    case ir::DTypeKind::BF16: return std::ldexp(1.0, -7);
    default: return std::ldexp(1.0, -23);
  }
}

// r * m with 0 * inf = 0 (an exact operand contributes nothing, whatever its range).
inline double term(double r, double m) { return r == 0 ? 0 : r * m; }

class Generator {
 public:
  Generator(std::uint64_t seed, std::uint64_t instance, std::uint64_t first_id = 1, bool allow_large = true)
      : s_(seed * 0x9E3779B97F4A7C15ull + 1), d_(instance * 0xBF58476D1CE4E5B9ull + 7), next_id_(first_id) {
    prog_.seed = seed;
    prog_.instance = instance;
    prog_.first_id = first_id;
    large_ = allow_large && pick(50) == 0;
  }

  DiffProgram generate() {
    // Dim symbols: 0 is size 1; others distinct sizes (so equal relative shapes mean equal sizes).
    const int nsym = 4;
    prog_.sizes.push_back(1);
    std::set<std::uint64_t> used{1};
    max_size_ = large_ ? 320 : 13;
    for (int i = 0; i < nsym; ++i) {
      std::uint64_t v;
      do {
        v = large_ ? 160 + d_() % 161 : 2 + d_() % 12;
      } while (used.count(v));
      used.insert(v);
      prog_.sizes.push_back(v);
    }
    rank_ = large_ ? 2 : 1 + static_cast<int>(pick(4));
    for (int i = 0; i < rank_; ++i) base_.push_back(pick(8) == 0 && !large_ ? 0 : 1 + static_cast<int>(pick(nsym)));
    // The main float dtype, and the inputs.
    static const DType kFloats[] = {dt::f32, dt::f32, dt::f32, dt::f32, dt::f64, dt::f16, dt::bf16, dt::flex32};
    fdt_ = kFloats[pick(8)];
    static const DType kInts[] = {dt::i32, dt::i64, dt::i8, dt::u8, dt::u32, dt::i16};
    idt_ = kInts[pick(6)];
    const int nin = 2 + static_cast<int>(pick(3));
    for (int i = 0; i < nin; ++i) {
      DataKind k = pick(4) == 0 ? DataKind::Positive : DataKind::General;
      if (pick(12) == 0) k = DataKind::Special;
      input(fdt_, variant(), k);
    }
    if (pick(2) == 0) input(idt_, variant(), pick(3) == 0 ? DataKind::WideInt : DataKind::SmallInt);
    if (pick(3) == 0) input(dt::boolean, variant(), DataKind::Bool);

    const int steps = large_ ? 3 + static_cast<int>(pick(4)) : 3 + static_cast<int>(pick(12));
    for (int s = 0; s < steps; ++s) {
      for (int attempt = 0; attempt < 12; ++attempt)
        if (step()) break;
      if (pick(10) == 0 && !prog_.ops.empty()) prog_.syncs.insert(prog_.ops.size() - 1);
    }
    finish();
    prog_.end_id = next_id_;
    return prog_;
  }

 private:
  // ---- randomness: s_ decides structure, d_ sizes, data and scalar values.
  std::uint64_t pick(std::uint64_t n) { return s_() % n; }
  bool chance(int percent) { return static_cast<int>(pick(100)) < percent; }
  double dval(double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(d_() >> 11) * 0x1.0p-53); }

  std::vector<int> variant() {
    std::vector<int> s = base_;
    for (int& d : s)
      if (pick(4) == 0) d = 0;
    return s;
  }
  Shape shape_of(const std::vector<int>& sym) const {
    Shape s;
    for (int d : sym) s.push_back(prog_.sizes[static_cast<std::size_t>(d)]);
    return s;
  }
  int new_symbol(std::uint64_t size) {
    prog_.sizes.push_back(size);
    return static_cast<int>(prog_.sizes.size() - 1);
  }
  TensorId fresh() { return TensorId{next_id_++}; }

  Val& input(DType dtype, std::vector<int> sym, DataKind kind, int bound_sym = 0) {
    Val v;
    v.t = TensorIr{fresh(), shape_of(sym), TensorStatus::ReadOnly, dtype};
    v.sym = std::move(sym);
    switch (kind) {
      case DataKind::Positive: v.lo = 0.5, v.hi = 2; break;
      case DataKind::General:
      case DataKind::Special: v.lo = -2, v.hi = 2; break;
      case DataKind::SmallInt: v.lo = -6, v.hi = 6; break;
      case DataKind::NonZero: v.lo = 1, v.hi = 9; break;
      case DataKind::Bool: v.lo = 0, v.hi = 1; break;
      default: v.lo = -kInf, v.hi = kInf; break;
    }
    prog_.inputs.push_back(InputSpec{v.t, kind, bound_sym});
    vals_.push_back(v);
    return vals_.back();
  }

  // Values usable as operands.
  template <class Pred>
  std::optional<std::size_t> choose(Pred&& pred) {
    std::vector<std::size_t> ok;
    for (std::size_t i = 0; i < vals_.size(); ++i)
      if (!dropped_.count(vals_[i].t.id.value()) && pred(vals_[i])) ok.push_back(i);
    if (ok.empty()) return std::nullopt;
    return ok[pick(ok.size())];
  }

  static std::optional<std::vector<int>> bcast(const std::vector<int>& a, const std::vector<int>& b) {
    if (a.size() != b.size()) return std::nullopt;
    std::vector<int> r(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i] || b[i] == 0)
        r[i] = a[i];
      else if (a[i] == 0)
        r[i] = b[i];
      else
        return std::nullopt;
    }
    return r;
  }

  // Accepts an op, registering its output value.
  Val& emit(Operation op, Val out) {
    out.t = op.outputs()[0];
    out.t.status = TensorStatus::ReadOnly;  // later uses read it (finish() sets the last one)
    prog_.ops.push_back(std::move(op));
    out.created = prog_.ops.size() - 1;
    vals_.push_back(std::move(out));
    return vals_.back();
  }

  static Operation ok(Result<Operation> r) {
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return std::move(r).value();
  }

  // Whether an error bound is tight enough to keep the comparison meaningful.
  static bool tight(const Val& v) {
    if (!std::isfinite(v.abs) || !std::isfinite(v.rel)) return false;
    const double scale = std::max(1.0, std::isfinite(v.mag()) ? v.mag() : 1.0);
    return v.rel <= 1e-3 && v.abs <= 1e-3 * scale && (v.abs == 0 || std::isfinite(v.mag()));
  }

  // |delta x| bound of a value (abs + rel * |x|), infinite when unbounded.
  static double delta(const Val& v) { return v.abs + term(v.rel, v.mag()); }

  Family ffam(DType d) const { return d.is_float() ? Family::NumericFloat : Family::NumericInt; }
  Family bfam(DType d) const {
    return d.is_float() ? Family::BaseFloat : d.is_bool() ? Family::BaseBool : Family::BaseInt;
  }

  // ---- One random step.
  bool step() {
    const int r = static_cast<int>(pick(100));
    if (r < 18) return unary_float();
    if (r < 36) return binary();
    if (r < 46) return scalar_op();
    if (r < 51) return comparison_mask();
    if (r < 55) return clamp_cast();
    if (r < 60) return int_ops();
    if (r < 63) return creation();
    if (r < 67) return view();
    if (r < 71) return indexed();
    if (r < 81) return reduction();
    if (r < 86) return large_ ? false : matmul();
    if (r < 90) return pattern();
    if (r < 94) return powf();
    return single_only();
  }

  bool unary_float() {
    static const OpKind kOps[] = {OpKind::Float_Exp,   OpKind::Float_Log,  OpKind::Float_Log1p, OpKind::Float_Erf,
                                  OpKind::Float_Sqrt,  OpKind::Float_Cos,  OpKind::Float_Sin,   OpKind::Float_Tanh,
                                  OpKind::Float_Recip, OpKind::Numeric_Abs};
    const OpKind k = kOps[pick(10)];
    auto src = choose([](const Val& v) { return v.t.dtype.is_float(); });
    if (!src) return false;
    const Val x = vals_[*src];
    Val o;
    o.sym = x.sym;
    const bool f32 = x.t.dtype == dt::f32 || x.t.dtype == dt::flex32;
    const double u = ulp_of(x.t.dtype);
    const double rnd = x.exact() ? 0 : u;  // one rounding of a result whose operand differs
    const double dx = delta(x);
    const double m = x.mag();
    switch (k) {
      case OpKind::Float_Exp:
        if (!x.exact() && !(m <= 20)) return false;
        o.lo = std::exp(x.lo), o.hi = std::exp(x.hi);
        o.rel = x.abs + term(x.rel, m) + (f32 ? 2 * u : 0) + rnd;
        break;
      case OpKind::Float_Log:
        if (!x.exact() && !(x.lo > 0.1)) return false;
        o.lo = x.lo > 0 ? std::log(x.lo) : -kInf, o.hi = x.hi > 0 ? std::log(x.hi) : -kInf;
        o.abs = x.exact() ? 0 : x.abs / x.lo + x.rel;
        o.rel = (f32 ? 2 * u : 0) + rnd;
        break;
      case OpKind::Float_Log1p:
        if (!x.exact() && !(x.lo > -0.9)) return false;
        o.lo = x.lo > -1 ? std::log1p(x.lo) : -kInf, o.hi = x.hi > -1 ? std::log1p(x.hi) : -kInf;
        o.abs = x.exact() ? 0
                          : x.abs / (1 + x.lo) +
                                term(x.rel, std::max(std::fabs(x.lo / (1 + x.lo)), std::fabs(x.hi / (1 + x.hi))));
        o.rel = (f32 ? 3 * u : 0) + rnd;
        break;
      case OpKind::Float_Erf:
        o.lo = -1, o.hi = 1;
        o.abs = 1.13 * x.abs + 0.49 * x.rel;
        o.rel = rnd;
        break;
      case OpKind::Float_Sqrt:
        if (!x.exact() && !(x.lo > 0.1)) return false;
        o.lo = x.lo > 0 ? std::sqrt(x.lo) : 0, o.hi = x.hi > 0 ? std::sqrt(x.hi) : 0;
        o.rel = x.exact() ? 0 : x.rel / 2 + x.abs / (2 * x.lo) + rnd;
        break;
      case OpKind::Float_Cos:
      case OpKind::Float_Sin:
        o.lo = -1, o.hi = 1;
        o.abs = dx;
        o.rel = rnd;
        break;
      case OpKind::Float_Tanh:
        o.lo = std::tanh(x.lo), o.hi = std::tanh(x.hi);
        o.abs = x.abs + 0.45 * x.rel;
        o.rel = (f32 ? 3 * u : 0) + rnd;
        break;
      case OpKind::Float_Recip: {
        const double mn = (x.lo > 0 || x.hi < 0) ? std::min(std::fabs(x.lo), std::fabs(x.hi)) : 0;
        if (!x.exact() && !(mn > 0.1)) return false;
        o.lo = mn > 0 ? std::min(1 / x.lo, 1 / x.hi) : -kInf;
        o.hi = mn > 0 ? std::max(1 / x.lo, 1 / x.hi) : kInf;
        o.rel = x.exact() ? 0 : x.rel + x.abs / mn + rnd;
        break;
      }
      default:  // abs
        o.lo = (x.lo > 0 || x.hi < 0) ? std::min(std::fabs(x.lo), std::fabs(x.hi)) : 0, o.hi = m;
        o.abs = x.abs, o.rel = x.rel;
        break;
    }
    if (!tight(o)) return false;
    const Family fam = k == OpKind::Numeric_Abs ? Family::NumericFloat : Family::Float;
    emit(ok(ir::build::unary(fam, k, x.t, fresh())), o);
    return true;
  }

  bool binary() {
    static const OpKind kOps[] = {OpKind::Numeric_Add, OpKind::Numeric_Sub, OpKind::Numeric_Mul, OpKind::Numeric_Div,
                                  OpKind::Numeric_Rem};
    const OpKind k = kOps[pick(5)];
    auto a = choose([](const Val& v) { return v.t.dtype.is_float() || v.t.dtype.is_integral(); });
    if (!a) return false;
    const Val x = vals_[*a];
    auto b = choose([&](const Val& v) { return v.t.dtype == x.t.dtype && bcast(x.sym, v.sym).has_value(); });
    if (!b) return false;
    const Val y = vals_[*b];
    Val o;
    o.sym = *bcast(x.sym, y.sym);
    const DType d = x.t.dtype;
    if (d.is_integral()) {
      if ((k == OpKind::Numeric_Div || k == OpKind::Numeric_Rem) && y.lo <= 0 && y.hi >= 0 && !chance(15)) {
        input(d, x.sym, DataKind::NonZero);  // a divisor for a later step
        return false;
      }
      o.lo = -kInf, o.hi = kInf;
    } else {
      const bool exact = x.exact() && y.exact();
      const double rnd = exact ? 0 : ulp_of(d);
      const double mx = x.mag(), my = y.mag();
      switch (k) {
        case OpKind::Numeric_Add:
        case OpKind::Numeric_Sub:
          o.lo = k == OpKind::Numeric_Add ? x.lo + y.lo : x.lo - y.hi;
          o.hi = k == OpKind::Numeric_Add ? x.hi + y.hi : x.hi - y.lo;
          o.abs = delta(x) + delta(y);
          o.rel = rnd;
          break;
        case OpKind::Numeric_Mul: {
          const double c[] = {x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi};
          o.lo = *std::min_element(c, c + 4), o.hi = *std::max_element(c, c + 4);
          o.abs = term(x.abs, my) + term(y.abs, mx) + x.abs * y.abs;
          o.rel = x.rel + y.rel + x.rel * y.rel + rnd;
          break;
        }
        case OpKind::Numeric_Div: {
          const bool away = y.lo > 0 || y.hi < 0;
          const double mn = away ? std::min(std::fabs(y.lo), std::fabs(y.hi)) : 0;
          if (!exact && !(mn > 0.1)) return false;
          if (away) {
            const double c[] = {x.lo / y.lo, x.lo / y.hi, x.hi / y.lo, x.hi / y.hi};
            o.lo = *std::min_element(c, c + 4), o.hi = *std::max_element(c, c + 4);
          } else {
            o.lo = -kInf, o.hi = kInf;
          }
          o.abs = exact ? 0 : x.abs / mn;
          o.rel = exact ? 0 : x.rel + y.rel + y.abs / mn + rnd;
          break;
        }
        default:  // rem: discontinuous, exact operands only
          if (!exact) return false;
          o.lo = -std::max(std::fabs(y.lo), std::fabs(y.hi)), o.hi = -o.lo;
          break;
      }
    }
    if (!tight(o)) return false;
    emit(ok(ir::build::binary(ffam(d), k, x.t, y.t, fresh())), o);
    return true;
  }

  ScalarIr scalar_for(DType d, double lo, double hi) {
    if (d.is_float()) return ScalarIr::Float(dval(lo, hi));
    if (d.is_uint()) return ScalarIr::UInt(static_cast<std::uint64_t>(std::fabs(dval(lo, hi))));
    return ScalarIr::Int(static_cast<std::int64_t>(dval(lo, hi)));
  }

  bool scalar_op() {
    static const OpKind kOps[] = {OpKind::Numeric_AddScalar, OpKind::Numeric_SubScalar, OpKind::Numeric_MulScalar,
                                  OpKind::Numeric_DivScalar, OpKind::Numeric_RemScalar};
    const OpKind k = kOps[pick(5)];
    auto a = choose([](const Val& v) { return v.t.dtype.is_float() || v.t.dtype.is_integral(); });
    if (!a) return false;
    const Val x = vals_[*a];
    const DType d = x.t.dtype;
    Val o;
    o.sym = x.sym;
    // |s| in [0.25, 4] (never 0: the static bounds below use that range).
    ScalarIr s = scalar_for(d, 0.25, 4);
    if (d.is_integral() && s.kind() == ScalarIr::Kind::Int && s.as_int() == 0) s = ScalarIr::Int(1);
    if (d.is_integral() && s.kind() == ScalarIr::Kind::UInt && s.as_uint() == 0) s = ScalarIr::UInt(1);
    if (d.is_float() && chance(50)) s = ScalarIr::Float(-s.as_float());
    if (d.is_integral()) {
      o.lo = -kInf, o.hi = kInf;
    } else {
      const double rnd = x.exact() ? 0 : ulp_of(d);
      const double m = x.mag();
      switch (k) {
        case OpKind::Numeric_AddScalar:
        case OpKind::Numeric_SubScalar:
          o.lo = x.lo - 4, o.hi = x.hi + 4;
          o.abs = delta(x);
          o.rel = rnd;
          break;
        case OpKind::Numeric_MulScalar:
          o.lo = -4 * m, o.hi = 4 * m;
          o.abs = 4 * x.abs, o.rel = x.rel + rnd;
          break;
        case OpKind::Numeric_DivScalar:
          o.lo = -4 * m, o.hi = 4 * m;
          o.abs = 4 * x.abs, o.rel = x.rel + rnd;
          break;
        default:
          if (!x.exact()) return false;
          o.lo = -4, o.hi = 4;
          break;
      }
    }
    if (!tight(o)) return false;
    emit(ok(ir::build::scalar(ffam(d), k, x.t, s, fresh())), o);
    return true;
  }

  bool comparison_mask() {
    static const OpKind kCmp[] = {OpKind::Numeric_Greater,    OpKind::Numeric_GreaterEqual, OpKind::Numeric_Lower,
                                  OpKind::Numeric_LowerEqual, OpKind::Base_Equal,           OpKind::Numeric_GreaterElem,
                                  OpKind::Numeric_LowerElem,  OpKind::Base_EqualElem,       OpKind::Base_NotEqual};
    auto a = choose([](const Val& v) { return v.exact() && (v.t.dtype.is_float() || v.t.dtype.is_integral()); });
    if (!a) return false;
    const Val x = vals_[*a];
    const OpKind k = kCmp[pick(9)];
    const DType d = x.t.dtype;
    Val m;
    m.lo = 0, m.hi = 1;
    const bool elem = k == OpKind::Numeric_GreaterElem || k == OpKind::Numeric_LowerElem || k == OpKind::Base_EqualElem;
    const bool base = k == OpKind::Base_Equal || k == OpKind::Base_EqualElem || k == OpKind::Base_NotEqual;
    const Family fam = base ? bfam(d) : ffam(d);
    Operation op;
    if (elem) {
      m.sym = x.sym;
      op = ok(ir::build::scalar_comparison(fam, k, x.t, scalar_for(d, -1, 1), dt::boolean, fresh()));
    } else {
      auto b = choose([&](const Val& v) { return v.exact() && v.t.dtype == d && bcast(x.sym, v.sym).has_value(); });
      if (!b) return false;
      m.sym = *bcast(x.sym, vals_[*b].sym);
      op = ok(ir::build::binary_comparison(fam, k, x.t, vals_[*b].t, dt::boolean, fresh()));
    }
    const Val mask = emit(std::move(op), m);
    // Then often a mask_where / mask_fill on a value that broadcasts with the mask.
    if (chance(70)) {
      auto t = choose([&](const Val& v) {
        return (v.t.dtype.is_float() || v.t.dtype.is_integral()) && bcast(v.sym, mask.sym).has_value();
      });
      if (!t) return true;
      const Val tv = vals_[*t];
      Val o = tv;
      o.keep = false;
      o.sym = *bcast(tv.sym, mask.sym);
      if (chance(50)) {
        const ScalarIr s = scalar_for(tv.t.dtype, -1, 1);
        o.lo = std::min(tv.lo, -1.0), o.hi = std::max(tv.hi, 1.0);
        emit(ok(ir::build::mask_fill(bfam(tv.t.dtype), OpKind::Base_MaskFill, tv.t, mask.t, s, fresh())), o);
      } else {
        auto v = choose([&](const Val& c) {
          return c.t.dtype == tv.t.dtype && bcast(*bcast(tv.sym, mask.sym), c.sym).has_value();
        });
        if (!v) return true;
        const Val vv = vals_[*v];
        o.sym = *bcast(o.sym, vv.sym);
        o.lo = std::min(tv.lo, vv.lo), o.hi = std::max(tv.hi, vv.hi);
        o.abs = std::max(tv.abs, vv.abs), o.rel = std::max(tv.rel, vv.rel);
        emit(ok(ir::build::mask_where(bfam(tv.t.dtype), OpKind::Base_MaskWhere, tv.t, mask.t, vv.t, fresh())), o);
      }
    }
    return true;
  }

  bool clamp_cast() {
    auto a = choose([](const Val& v) { return v.t.dtype.is_float() || v.t.dtype.is_integral(); });
    if (!a) return false;
    const Val x = vals_[*a];
    const DType d = x.t.dtype;
    if (chance(40)) {
      Val o = x;
      o.keep = false;
      o.abs = delta(x), o.rel = 0;
      o.lo = std::max(x.lo, -1.0), o.hi = std::min(x.hi, 1.5);
      if (o.hi < o.lo) o.hi = o.lo;
      if (!tight(o)) return false;
      emit(ok(ir::build::clamp(ffam(d), OpKind::Numeric_Clamp, x.t, scalar_for(d, -1.2, -0.8), scalar_for(d, 0.9, 1.5),
                               fresh())),
           o);
      return true;
    }
    // Casts the fusers take: float <-> float, int <-> int (Base_Cast), int -> float.
    static const DType kF[] = {dt::f32, dt::f64, dt::f16, dt::bf16};
    static const DType kI[] = {dt::i32, dt::i64, dt::i8, dt::u8, dt::u32, dt::i16};
    Val o = x;
    o.keep = false;
    if (d.is_float()) {
      const DType to = kF[pick(4)];
      // Exact data converts identically on both sides (one rounding from the same value).
      if (!x.exact()) o.rel = x.rel + ulp_of(to);
      if (!tight(o)) return false;
      emit(ok(ir::build::cast(Family::BaseFloat, OpKind::Base_Cast, x.t, to, fresh())), o);
    } else if (chance(50)) {
      const DType to = kI[pick(6)];
      o.lo = -kInf, o.hi = kInf;
      emit(ok(ir::build::cast(Family::BaseInt, OpKind::Base_Cast, x.t, to, fresh())), o);
    } else {
      const DType to = kF[pick(4)];
      // Small ints are exact in every float dtype; wide ones round (once, both sides).
      o.lo = std::max(x.lo, -1e30), o.hi = std::min(x.hi, 1e30);
      emit(ok(ir::build::cast(Family::Int, OpKind::Int_IntoFloat, x.t, to, fresh())), o);
    }
    return true;
  }

  bool int_ops() {
    static const OpKind kBin[] = {OpKind::Int_BitwiseAnd, OpKind::Int_BitwiseOr, OpKind::Int_BitwiseXor,
                                  OpKind::Int_BitwiseLeftShift, OpKind::Int_BitwiseRightShift};
    static const OpKind kSc[] = {OpKind::Int_BitwiseAndScalar, OpKind::Int_BitwiseOrScalar,
                                 OpKind::Int_BitwiseXorScalar, OpKind::Int_BitwiseLeftShiftScalar,
                                 OpKind::Int_BitwiseRightShiftScalar};
    auto a = choose([](const Val& v) { return v.t.dtype.is_integral(); });
    if (!a) {
      input(idt_, variant(), DataKind::SmallInt);
      return false;
    }
    const Val x = vals_[*a];
    Val o;
    o.sym = x.sym;
    o.lo = -kInf, o.hi = kInf;
    const int r = static_cast<int>(pick(4));
    if (r == 0) {
      emit(ok(ir::build::unary(Family::Int, OpKind::Int_BitwiseNot, x.t, fresh())), o);
    } else if (r == 1) {
      emit(ok(ir::build::scalar(Family::Int, kSc[pick(5)], x.t, scalar_for(x.t.dtype, 0, 9), fresh())), o);
    } else if (r == 2) {
      emit(ok(ir::build::unary(Family::NumericInt, OpKind::Numeric_Abs, x.t, fresh())), o);
    } else {
      auto b = choose([&](const Val& v) { return v.t.dtype == x.t.dtype && bcast(x.sym, v.sym).has_value(); });
      if (!b) return false;
      o.sym = *bcast(x.sym, vals_[*b].sym);
      emit(ok(ir::build::binary(Family::Int, kBin[pick(5)], x.t, vals_[*b].t, fresh())), o);
    }
    return true;
  }

  bool creation() {
    Val o;
    o.sym = variant();
    const DType d = chance(70) ? fdt_ : idt_;
    const int r = static_cast<int>(pick(3));
    const Family fam = d.is_float() ? Family::BaseFloat : Family::BaseInt;
    if (r == 0) {
      o.lo = o.hi = 1;
      emit(ok(ir::build::creation(fam, OpKind::Base_Ones, shape_of(o.sym), d, fresh())), o);
    } else if (r == 1) {
      emit(ok(ir::build::creation(fam, OpKind::Base_Zeros, shape_of(o.sym), d, fresh())), o);
    } else {
      o.lo = -2, o.hi = 2;
      emit(ok(ir::build::full(ffam(d), OpKind::Numeric_Full, shape_of(o.sym), d, scalar_for(d, -2, 2), fresh())), o);
    }
    return true;
  }

  bool view() {
    auto a = choose([](const Val& v) { return v.sym.size() >= 1; });
    if (!a) return false;
    const Val x = vals_[*a];
    Val o = x;
    o.keep = false;
    const std::size_t r = x.sym.size();
    if (r >= 2 && chance(60)) {
      const std::size_t d1 = pick(r), d2 = pick(r);
      std::swap(o.sym[d1], o.sym[d2]);
      emit(ok(ir::build::swap_dims(bfam(x.t.dtype), OpKind::Base_SwapDims, x.t, d1, d2, fresh())), o);
      return true;
    }
    std::vector<std::int64_t> args;
    if (r >= 2 && chance(30)) {
      // Merge the last two dims (a rank-reducing reshape: runs alone, zero-copy).
      std::uint64_t n =
          prog_.sizes[static_cast<std::size_t>(x.sym[r - 2])] * prog_.sizes[static_cast<std::size_t>(x.sym[r - 1])];
      o.sym.pop_back();
      o.sym.back() = n == 1 ? 0 : new_symbol(n);
    } else if (r < 4) {
      // Insert a size-1 dim (a view the elementwise fuser takes).
      const std::size_t at = pick(r + 1);
      o.sym.insert(o.sym.begin() + static_cast<std::ptrdiff_t>(at), 0);
    } else {
      return false;
    }
    for (int s : o.sym) args.push_back(static_cast<std::int64_t>(prog_.sizes[static_cast<std::size_t>(s)]));
    emit(ok(ir::build::shape_op(bfam(x.t.dtype), OpKind::Base_Reshape, x.t, args, fresh())), o);
    return true;
  }

  bool indexed() {
    const std::vector<int> target = variant();
    const std::size_t r = target.size();
    const std::size_t dim = pick(r);
    const DType d = chance(75) ? fdt_ : idt_;
    const DataKind vk = d.is_float() ? DataKind::General : DataKind::SmallInt;
    const DataKind ik = chance(4) ? DataKind::BadIndex : DataKind::Index;
    static const DType kIdx[] = {dt::i64, dt::i32, dt::u32, dt::u8};
    const DType idxd = kIdx[pick(4)];
    Val o;
    o.sym = target;
    o.lo = d.is_float() ? -2 : -6, o.hi = -o.lo;
    const int k = static_cast<int>(pick(3));
    const int src = new_symbol(2 + d_() % 6);
    if (k == 0) {  // select: tensor [.., src, ..], indices [target[dim]]
      std::vector<int> xs = target;
      xs[dim] = src;
      const TensorIr x = input(d, xs, vk).t;
      const TensorIr idx = input(idxd, {target[dim]}, ik, src).t;
      emit(ok(ir::build::select(bfam(d), OpKind::Base_Select, x, dim, idx, fresh())), o);
    } else if (k == 1) {  // gather: tensor [.., src, ..], indices = target shape
      std::vector<int> xs = target;
      xs[dim] = src;
      const TensorIr x = input(d, xs, vk).t;
      const TensorIr idx = input(idxd, target, ik, src).t;
      emit(ok(ir::build::gather(bfam(d), OpKind::Base_Gather, x, dim, idx, fresh())), o);
    } else {  // cat of 2-3 pieces along dim: a new symbol for the sum
      const int pieces = 2 + static_cast<int>(pick(2));
      std::vector<TensorIr> parts;
      std::uint64_t total = 0;
      for (int i = 0; i < pieces; ++i) {
        std::vector<int> ps = target;
        const std::uint64_t len = 1 + d_() % 4;
        ps[dim] = len == 1 ? 0 : new_symbol(len);
        total += len;
        parts.push_back(input(d, ps, vk).t);
      }
      o.sym[dim] = new_symbol(total);
      emit(ok(ir::build::cat(bfam(d), OpKind::Base_Cat, parts, dim, fresh())), o);
    }
    return true;
  }

  bool reduction() {
    static const OpKind kOps[] = {OpKind::Numeric_SumDim, OpKind::Numeric_MeanDim, OpKind::Numeric_MaxDim,
                                  OpKind::Numeric_MinDim, OpKind::Numeric_ProdDim, OpKind::Numeric_MaxAbsDim,
                                  OpKind::Numeric_ArgMax, OpKind::Numeric_ArgMin,  OpKind::Base_AnyDim,
                                  OpKind::Base_AllDim};
    const OpKind k = kOps[pick(10)];
    const bool arg = k == OpKind::Numeric_ArgMax || k == OpKind::Numeric_ArgMin;
    const bool boolean = k == OpKind::Base_AnyDim || k == OpKind::Base_AllDim;
    auto a = choose([&](const Val& v) {
      if (v.sym.empty()) return false;
      if (boolean) return v.exact();
      if (arg) return v.exact() && !v.t.dtype.is_bool();
      return v.t.dtype.is_float() || v.t.dtype.is_integral();
    });
    if (!a) return false;
    const Val x = vals_[*a];
    const std::size_t axis = chance(55) ? x.sym.size() - 1 : pick(x.sym.size());
    const double n = static_cast<double>(prog_.sizes[static_cast<std::size_t>(x.sym[axis])]);
    const double nmax = std::max(n, static_cast<double>(max_size_));
    Val o;
    o.sym = x.sym;
    o.sym[axis] = 0;
    const DType d = x.t.dtype;
    Operation op;
    if (arg) {
      o.lo = 0, o.hi = nmax;
      op = ok(ir::build::reduce_dim_arg(ffam(d), k, x.t, axis, 1, chance(50) ? dt::i64 : dt::i32, fresh()));
    } else if (boolean) {
      o.lo = 0, o.hi = 1;
      op = ok(ir::build::reduce_dim_bool(bfam(d), k, x.t, axis, 1, dt::boolean, fresh()));
    } else {
      if (d.is_float()) {
        const double u = ulp_of(d);
        const double dx = delta(x);
        const double m = x.mag();
        switch (k) {
          case OpKind::Numeric_SumDim:
            o.lo = nmax * std::min(x.lo, 0.0), o.hi = nmax * std::max(x.hi, 0.0);
            o.abs = nmax * dx + term(nmax * nmax * std::ldexp(1.0, -52), m);
            o.rel = u;
            break;
          case OpKind::Numeric_MeanDim:
            o.lo = x.lo, o.hi = x.hi;
            o.abs = dx + term(nmax * std::ldexp(1.0, -52), m);
            o.rel = u;
            break;
          case OpKind::Numeric_ProdDim: {
            const double mn = (x.lo > 0 || x.hi < 0) ? std::min(std::fabs(x.lo), std::fabs(x.hi)) : 0;
            if (!x.exact() && !(mn > 0.1)) return false;
            if (!(m <= 2)) return false;
            o.lo = -std::pow(m, nmax), o.hi = std::pow(m, nmax);
            o.rel = nmax * (x.rel + (x.exact() ? 0 : x.abs / mn)) + nmax * std::ldexp(1.0, -52) + u;
            break;
          }
          case OpKind::Numeric_MaxAbsDim:
            o.lo = 0, o.hi = m;
            o.abs = dx;
            break;
          default:
            o.lo = x.lo, o.hi = x.hi;
            o.abs = dx;
            break;
        }
        if (!tight(o)) return false;
      } else {
        o.lo = -kInf, o.hi = kInf;
      }
      op = ok(ir::build::reduce_dim(ffam(d), k, x.t, axis, 1, fresh()));
    }
    const Val red = emit(std::move(op), o);
    // Often an epilogue op on the reduced value.
    if (chance(50) && red.t.dtype.is_float()) scalar_on(red);
    return true;
  }

  void scalar_on(const Val& x) {
    Val o = x;
    o.keep = false;
    o.lo = 2 * x.lo - 1, o.hi = 2 * x.hi + 1;
    o.abs = 2 * x.abs, o.rel = x.rel + (x.exact() ? 0 : ulp_of(x.t.dtype));
    if (!tight(o)) return;
    emit(ok(ir::build::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x.t, ScalarIr::Float(2.0), fresh())), o);
  }

  bool matmul() {
    // A [.., m, k] from the program (rank >= 2) or new; B [.., k, n] new; an epilogue follows.
    const DType d = fdt_ == dt::f64 ? dt::f64 : (pick(3) == 0 ? fdt_ : dt::f32);
    auto a =
        choose([&](const Val& v) { return v.sym.size() >= 2 && v.sym.size() <= 3 && v.t.dtype == d && v.mag() <= 4; });
    Val x;
    if (a && chance(60)) {
      x = vals_[*a];
    } else {
      std::vector<int> s = {1 + static_cast<int>(pick(4)), 1 + static_cast<int>(pick(4))};
      if (chance(30)) s.insert(s.begin(), chance(50) ? 0 : 1 + static_cast<int>(pick(4)));
      x = input(d, s, DataKind::General);
    }
    const std::size_t r = x.sym.size();
    std::vector<int> bs = x.sym;
    bs[r - 2] = x.sym[r - 1];
    bs[r - 1] = chance(20) ? 0 : 1 + static_cast<int>(pick(4));
    if (r == 3 && chance(40)) bs[0] = 0;  // broadcast batch
    const Val y = input(d, bs, DataKind::General);
    Val o;
    o.sym = x.sym;
    o.sym[r - 1] = bs[r - 1];
    if (r == 3 && o.sym[0] == 0) o.sym[0] = bs[0];
    const double k = std::max(static_cast<double>(prog_.sizes[static_cast<std::size_t>(x.sym[r - 1])]),
                              static_cast<double>(max_size_));
    const double ma = x.mag(), mb = y.mag();
    const double acc = d == dt::f64 ? std::ldexp(1.0, -52) : std::ldexp(1.0, -23);
    o.lo = -k * ma * mb, o.hi = k * ma * mb;
    o.abs = k * (term(mb, delta(x)) + term(ma, delta(y))) + k * k * acc * ma * mb * 1.1;
    o.rel = ulp_of(d);
    if (!tight(o)) return false;
    const Val mm = emit(ok(ir::build::matmul(Family::Float, OpKind::Float_Matmul, x.t, y.t, fresh())), o);
    // Epilogue: add a bias row, then maybe a scalar op.
    if (chance(70)) {
      std::vector<int> bias_sym(mm.sym.size(), 0);
      bias_sym.back() = mm.sym.back();
      const Val bias = input(d, bias_sym, DataKind::General);
      Val e = mm;
      e.keep = false;
      e.lo = mm.lo - 2, e.hi = mm.hi + 2;
      e.abs = delta(mm), e.rel = ulp_of(d);
      const Val added =
          emit(ok(ir::build::binary(Family::NumericFloat, OpKind::Numeric_Add, mm.t, bias.t, fresh())), e);
      if (chance(50)) scalar_on(added);
    }
    return true;
  }

  bool pattern() {
    auto a = choose([](const Val& v) { return v.t.dtype.is_float() && v.exact() && !v.sym.empty() && v.mag() <= 4; });
    if (!a) return false;
    const Val x = vals_[*a];
    const std::size_t last = x.sym.size() - 1;
    const double n = std::max(static_cast<double>(prog_.sizes[static_cast<std::size_t>(x.sym[last])]),
                              static_cast<double>(max_size_));
    const DType d = x.t.dtype;
    const double u = ulp_of(d);
    const bool f32 = d == dt::f32 || d == dt::flex32;
    const Family nf = Family::NumericFloat;
    if (chance(25)) return pool();
    if (chance(50)) {
      // softmax over the last axis: exp(x - max) / sum(exp(x - max))
      Val m = x;
      m.keep = false;
      m.sym[last] = 0;
      const Val mx = emit(ok(ir::build::reduce_dim(nf, OpKind::Numeric_MaxDim, x.t, last, 1, fresh())), m);
      Val df = x;
      df.keep = false;
      df.lo = x.lo - x.hi, df.hi = 0;
      const Val diff = emit(ok(ir::build::binary(nf, OpKind::Numeric_Sub, x.t, mx.t, fresh())), df);
      Val ex = diff;
      ex.lo = std::exp(diff.lo), ex.hi = 1;
      ex.rel = f32 ? 2 * u : 0;
      const Val e = emit(ok(ir::build::unary(Family::Float, OpKind::Float_Exp, diff.t, fresh())), ex);
      Val sm = e;
      sm.sym[last] = 0;
      sm.lo = 1, sm.hi = n;
      sm.abs = n * ex.rel + n * n * std::ldexp(1.0, -52), sm.rel = u;
      const Val s = emit(ok(ir::build::reduce_dim(nf, OpKind::Numeric_SumDim, e.t, last, 1, fresh())), sm);
      Val y = e;
      y.lo = 0, y.hi = 1;
      y.abs = 0, y.rel = ex.rel + sm.rel + sm.abs + u;
      emit(ok(ir::build::binary(nf, OpKind::Numeric_Div, e.t, s.t, fresh())), y);
      return true;
    }
    // layer norm over the last axis: (x - mean) / sqrt(var + eps) * g + b
    Val m = x;
    m.keep = false;
    m.sym[last] = 0;
    m.abs = n * std::ldexp(1.0, -52) * x.mag(), m.rel = u;
    const Val mu = emit(ok(ir::build::reduce_dim(nf, OpKind::Numeric_MeanDim, x.t, last, 1, fresh())), m);
    Val c = x;
    c.keep = false;
    c.lo = x.lo - x.hi, c.hi = x.hi - x.lo;
    c.abs = delta(mu), c.rel = u;
    const Val cen = emit(ok(ir::build::binary(nf, OpKind::Numeric_Sub, x.t, mu.t, fresh())), c);
    Val sq = cen;
    sq.lo = 0, sq.hi = cen.mag() * cen.mag();
    sq.abs = 2 * cen.mag() * delta(cen), sq.rel = 2 * u;
    const Val s2 = emit(ok(ir::build::binary(nf, OpKind::Numeric_Mul, cen.t, cen.t, fresh())), sq);
    Val var = s2;
    var.sym[last] = 0;
    var.abs = delta(s2) + n * std::ldexp(1.0, -52) * s2.mag(), var.rel = u;
    const Val v = emit(ok(ir::build::reduce_dim(nf, OpKind::Numeric_MeanDim, s2.t, last, 1, fresh())), var);
    Val ve = v;
    ve.lo = v.lo + 1.0, ve.hi = v.hi + 1.0;  // eps = 1 keeps the bound tight for small rows
    ve.abs = delta(v), ve.rel = u;
    const Val vp = emit(ok(ir::build::scalar(nf, OpKind::Numeric_AddScalar, v.t, ScalarIr::Float(1.0), fresh())), ve);
    Val sd = vp;
    sd.lo = 1, sd.hi = std::sqrt(vp.hi);
    sd.abs = 0, sd.rel = vp.abs / 2 + vp.rel / 2 + u;
    const Val s = emit(ok(ir::build::unary(Family::Float, OpKind::Float_Sqrt, vp.t, fresh())), sd);
    Val y = cen;
    y.lo = cen.lo, y.hi = cen.hi;
    y.abs = delta(cen), y.rel = sd.rel + u;
    if (!tight(y)) return true;
    const Val yn = emit(ok(ir::build::binary(nf, OpKind::Numeric_Div, cen.t, s.t, fresh())), y);
    std::vector<int> gs(x.sym.size(), 0);
    gs[last] = x.sym[last];
    const Val g = input(d, gs, DataKind::Positive);
    Val yg = yn;
    yg.lo = 2 * yn.lo, yg.hi = 2 * yn.hi;
    yg.abs = 2 * delta(yn), yg.rel = u;
    emit(ok(ir::build::binary(nf, OpKind::Numeric_Mul, yn.t, g.t, fresh())), yg);
    return true;
  }

  // Elementwise work feeding a 2-d pool (an NHWC-relayout fusion): y = x * s + c, pool(y).
  bool pool() {
    if (large_) return false;
    std::vector<int> xs = {chance(50) ? 0 : 1 + static_cast<int>(pick(4)), 1 + static_cast<int>(pick(4)),
                           1 + static_cast<int>(pick(4)), 1 + static_cast<int>(pick(4))};
    const DType d = fdt_ == dt::f64 ? dt::f64 : dt::f32;
    const Val x = input(d, xs, DataKind::General);
    Val y = x;
    y.lo = -8, y.hi = 8;
    const Val ys = emit(ok(ir::build::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x.t,
                                             ScalarIr::Float(dval(-4, 4)), fresh())),
                        y);
    Val z = ys;
    z.lo = -9, z.hi = 9;
    const Val zs = emit(ok(ir::build::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar, ys.t,
                                             ScalarIr::Float(dval(-1, 1)), fresh())),
                        z);
    Val o = zs;
    const std::uint64_t h = prog_.sizes[static_cast<std::size_t>(xs[2])],
                        w = prog_.sizes[static_cast<std::size_t>(xs[3])];
    o.sym[2] = h - 1 == 1 ? 0 : new_symbol(h - 1);
    o.sym[3] = w - 1 == 1 ? 0 : new_symbol(w - 1);
    if (chance(50)) {
      ir::build::MaxPool2dOptions opts;
      opts.kernel = {2, 2};
      emit(ok(ir::build::max_pool2d(zs.t, opts, fresh())), o);
    } else {
      ir::build::AvgPool2dOptions opts;
      opts.kernel = {2, 2};
      emit(ok(ir::build::avg_pool2d(zs.t, opts, fresh())), o);
    }
    return true;
  }

  bool powf() {
    auto a = choose([](const Val& v) { return v.t.dtype.is_float() && v.lo >= 0.5 && v.hi <= 4; });
    if (!a) {
      input(fdt_, variant(), DataKind::Positive);
      return false;
    }
    const Val x = vals_[*a];
    const double u = ulp_of(x.t.dtype);
    Val o = x;
    o.keep = false;
    o.lo = std::pow(x.lo, 2.0) > 0 ? std::min(std::pow(x.lo, -2.0), std::pow(x.hi, -2.0)) : 0;
    o.hi = std::max({std::pow(x.hi, 2.0), std::pow(x.lo, -2.0), std::pow(x.hi, -2.0)});
    o.lo = std::min(o.lo, 1.0 / 16);
    o.abs = 0;
    o.rel = x.exact() ? 0 : 2 * (x.rel + x.abs / x.lo) + u;
    if (!tight(o)) return false;
    if (chance(50)) {
      emit(ok(ir::build::scalar(Family::Float, OpKind::Float_PowfScalar, x.t, ScalarIr::Float(dval(-2, 2)), fresh())),
           o);
      return true;
    }
    auto b = choose([&](const Val& v) {
      return v.t.dtype == x.t.dtype && v.exact() && v.lo >= -2 && v.hi <= 2 && bcast(x.sym, v.sym).has_value();
    });
    if (!b) return false;
    const Val y = vals_[*b];
    o.sym = *bcast(x.sym, y.sym);
    if (!x.exact()) o.rel += 0;
    emit(ok(ir::build::binary(Family::Float, OpKind::Float_Powf, x.t, y.t, fresh())), o);
    return true;
  }

  // Ops the fusers never take: they run as single ops (fast kernels or the reference).
  bool single_only() {
    auto a = choose([](const Val& v) { return v.exact() && !v.sym.empty(); });
    if (!a) return false;
    const Val x = vals_[*a];
    const DType d = x.t.dtype;
    Val o = x;
    o.keep = false;
    const int r = static_cast<int>(pick(6));
    if (d.is_float() && r == 0) {
      static const OpKind kU[] = {OpKind::Float_Round, OpKind::Float_Floor, OpKind::Float_Ceil, OpKind::Float_Trunc};
      emit(ok(ir::build::unary(Family::Float, kU[pick(4)], x.t, fresh())), o);
    } else if (d.is_float() && r == 1) {
      o.lo = -kInf, o.hi = kInf;
      emit(ok(ir::build::cast(Family::Float, OpKind::Float_IntoInt, x.t, idt_, fresh())), o);
    } else if ((d.is_float() || d.is_integral()) && r == 2) {
      o.lo = -o.hi;
      emit(ok(ir::build::unary(ffam(d), OpKind::Numeric_Neg, x.t, fresh())), o);
    } else if (r == 3) {
      // A whole-tensor reduction.
      static const OpKind kR[] = {OpKind::Numeric_Sum, OpKind::Numeric_Max, OpKind::Numeric_Min};
      if (d.is_bool()) return false;
      const OpKind k = kR[pick(3)];
      o.sym = {0};
      if (d.is_float() && k == OpKind::Numeric_Sum) {
        const double n = 4096;
        o.lo = -n * x.mag(), o.hi = n * x.mag();
        o.abs = n * n * std::ldexp(1.0, -52) * x.mag(), o.rel = ulp_of(d);
        if (!tight(o)) return false;
      }
      emit(ok(ir::build::reduce(ffam(d), k, x.t, fresh())), o);
    } else if (d.is_bool()) {
      emit(ok(ir::build::unary(Family::Bool, OpKind::Bool_Not, x.t, fresh())), o);
    } else if (d.is_float() || d.is_integral()) {
      o.lo = std::min(x.lo, -0.5), o.hi = std::max(x.hi, 0.5);
      const OpKind k = chance(50) ? OpKind::Numeric_ClampMin : OpKind::Numeric_ClampMax;
      emit(ok(ir::build::scalar(ffam(d), k, x.t, scalar_for(d, -0.5, 0.5), fresh())), o);
    } else {
      return false;
    }
    return true;
  }

  // Statuses (last use ReadWrite unless kept), drops, checks.
  void finish() {
    std::map<std::uint64_t, std::size_t> last_use;
    for (std::size_t i = 0; i < prog_.ops.size(); ++i)
      for (const TensorIr& t : prog_.ops[i].inputs()) last_use[t.id.value()] = i;
    std::map<std::uint64_t, const Val*> by_id;
    for (const Val& v : vals_) by_id[v.t.id.value()] = &v;
    // Some values are kept although used later (read back by the client), some dropped.
    std::set<std::uint64_t> kept, dropped;
    std::vector<std::pair<std::size_t, Operation>> drops;
    for (const Val& v : vals_) {
      const std::uint64_t id = v.t.id.value();
      const bool used = last_use.count(id) != 0;
      if (used && chance(15)) kept.insert(id);
      if (!kept.count(id) && chance(12)) {
        dropped.insert(id);
        const std::size_t after = used ? last_use[id] : v.created;
        TensorIr t = v.t;
        t.status = TensorStatus::ReadWrite;
        drops.emplace_back(after, ok(ir::build::drop(t)));
      } else if (!used) {
        kept.insert(id);
      }
    }
    // A dropped value's last real use stays ReadOnly (the drop is its last use).
    for (std::size_t i = 0; i < prog_.ops.size(); ++i) {
      for (TensorIr& t : prog_.ops[i].inputs()) {
        const std::uint64_t id = t.id.value();
        const bool last = last_use[id] == i;
        t.status = (last && !kept.count(id) && !dropped.count(id)) ? TensorStatus::ReadWrite : TensorStatus::ReadOnly;
      }
      // The same tensor twice in one op: only its last occurrence may be ReadWrite.
      auto ins = prog_.ops[i].inputs();
      for (std::size_t a = 0; a < ins.size(); ++a)
        for (std::size_t b = a + 1; b < ins.size(); ++b)
          if (ins[a].id == ins[b].id) ins[a].status = TensorStatus::ReadOnly;
    }
    // Insert the drops (after their value's last use; inputs never used: anywhere).
    std::vector<Operation> merged;
    std::set<std::size_t> syncs;
    for (std::size_t i = 0; i < prog_.ops.size(); ++i) {
      merged.push_back(prog_.ops[i]);
      for (auto& [after, op] : drops)
        if (after == i) merged.push_back(op);
      if (prog_.syncs.count(i)) syncs.insert(merged.size() - 1);
    }
    if (prog_.ops.empty())
      for (auto& [after, op] : drops) merged.push_back(op);
    prog_.ops = std::move(merged);
    prog_.syncs = std::move(syncs);
    for (std::uint64_t id : kept) {
      const Val& v = *by_id[id];
      prog_.checks.push_back(Check{v.t.id, v.t.dtype, v.exact(), 2 * v.abs, 2 * v.rel});
    }
  }

  std::mt19937_64 s_;
  std::mt19937_64 d_;
  DiffProgram prog_;
  std::vector<Val> vals_;
  std::set<std::uint64_t> dropped_;
  std::vector<int> base_;
  int rank_ = 1;
  bool large_ = false;
  double max_size_ = 13;
  DType fdt_ = dt::f32;
  DType idt_ = dt::i32;
  std::uint64_t next_id_;
};

// ---- Running and comparing

// Deterministic input data for a program (same bits for both runs).
inline void upload_inputs(const DiffProgram& p, CpuDevice& device) {
  std::mt19937_64 rng(p.instance * 0x94D049BB133111EBull + 3);
  auto uni = [&](double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * 0x1.0p-53); };
  for (const InputSpec& in : p.inputs) {
    const std::uint64_t n = ir::num_elements(in.t.shape);
    const DType d = in.t.dtype;
    Status st;
    if (d.is_bool()) {
      std::vector<bool> v(n);
      for (std::uint64_t i = 0; i < n; ++i) v[i] = (rng() & 1) != 0;
      st = device.upload_bool(in.t.id, in.t.shape, d, v);
    } else if (d.is_integral()) {
      std::vector<std::int64_t> v(n);
      const std::uint64_t bound =
          in.bound_sym < static_cast<int>(p.sizes.size()) ? p.sizes[static_cast<std::size_t>(in.bound_sym)] : 1;
      for (std::uint64_t i = 0; i < n; ++i) {
        switch (in.kind) {
          case DataKind::WideInt: v[i] = static_cast<std::int64_t>(rng()); break;
          case DataKind::NonZero: v[i] = 1 + static_cast<std::int64_t>(rng() % 9); break;
          case DataKind::Index:
          case DataKind::BadIndex: v[i] = static_cast<std::int64_t>(rng() % bound); break;
          default: v[i] = static_cast<std::int64_t>(rng() % 13) - 6; break;
        }
      }
      if (in.kind == DataKind::BadIndex && n > 0) v[rng() % n] = static_cast<std::int64_t>(bound);
      st = device.upload_i64(in.t.id, in.t.shape, d, v);
    } else {
      std::vector<double> v(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        v[i] = in.kind == DataKind::Positive ? uni(0.5, 2) : uni(-2, 2);
        if (in.kind == DataKind::Special && rng() % 7 == 0) {
          static const double kSpecial[] = {std::numeric_limits<double>::quiet_NaN(), kInf, -kInf, 0.0, -0.0};
          v[i] = kSpecial[rng() % 5];
        }
      }
      st = device.upload_f64(in.t.id, in.t.shape, d, v);
    }
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
  }
}

// The fused side: a stream with the default fusers over a CpuExecutor. Reused across programs
// (plans and compiled forms accumulate, as in a long-running daemon).
struct FusedSide {
  // KILN_DIFF_LOG=full (or basic, medium) prints the fusion log: what was fused and how.
  fusion::FusionLog log = [] {
    const char* level = std::getenv("KILN_DIFF_LOG");
    const auto l = level ? fusion::parse_log_level(level) : std::nullopt;
    return l ? fusion::FusionLog::to_stderr(*l) : fusion::FusionLog();
  }();
  fusion::ExecutionPlanStore store;
  CpuDevice device;
  CpuExecutor exec{device};
  fusion::FusionStream stream{fusion::default_fusers(log), fusion::ProcessorOptions{}, log};

  explicit FusedSide(int threads = 2) : device(CpuDeviceOptions{.threads = threads}) {}
  FusedSide(int threads, fusion::FuserOptions fusers)
      : device(CpuDeviceOptions{.threads = threads}),
        stream{fusion::default_fusers(log, fusers), fusion::ProcessorOptions{}, log} {}
  explicit FusedSide(CpuDeviceOptions options) : device(std::move(options)) {}
  FusedSide(CpuDeviceOptions options, fusion::PlanStoreOptions store_options)
      : store(store_options), device(std::move(options)) {}

  void run(const DiffProgram& p) {
    upload_inputs(p, device);
    for (std::size_t i = 0; i < p.ops.size(); ++i) {
      stream.register_op(p.ops[i], store, exec);
      if (p.syncs.count(i)) stream.drain(store, exec);
    }
    stream.drain(store, exec);
  }
};

// Forgets a program's tensors (the sides are reused across programs).
inline void release(const DiffProgram& p, CpuDevice& device) {
  for (TensorId id : device.handles().handle_ids())
    if (id.value() >= p.first_id && id.value() < p.end_id) (void)device.handles().remove_handle(id);
}

struct ReferenceSide {
  CpuDevice device{CpuDeviceOptions{.threads = 1}};
  void run(const DiffProgram& p) {
    upload_inputs(p, device);
    for (const Operation& op : p.ops) (void)device.reference().execute(op, device.handles());
  }
};

inline std::string describe_value(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

// Compares every check and the handle sets; returns an empty string or the first differences.
inline std::string compare(const DiffProgram& p, const CpuDevice& fused, const CpuDevice& ref) {
  std::ostringstream err;
  int problems = 0;
  for (const Check& c : p.checks) {
    auto a = fused.download_f64(c.id);
    auto b = ref.download_f64(c.id);
    if (a.ok() != b.ok() || a.is_errored() != b.is_errored()) {
      err << "t" << c.id.value() << ": fused " << (a.ok() ? "ok" : a.error().to_string()) << " vs reference "
          << (b.ok() ? "ok" : b.error().to_string()) << "\n";
      if (++problems > 5) break;
      continue;
    }
    if (!a.ok()) continue;  // both errored
    const std::vector<double>& x = *a;
    const std::vector<double>& y = *b;
    if (x.size() != y.size()) {
      err << "t" << c.id.value() << ": sizes " << x.size() << " vs " << y.size() << "\n";
      ++problems;
      continue;
    }
    if (c.dtype.is_integral() || c.dtype.is_bool()) {
      auto xi = fused.download_i64(c.id);
      auto yi = ref.download_i64(c.id);
      if (*xi != *yi) {
        for (std::size_t i = 0; i < xi->size(); ++i)
          if ((*xi)[i] != (*yi)[i]) {
            err << "t" << c.id.value() << " (" << c.dtype.name() << ") element " << i << ": fused " << (*xi)[i]
                << " vs reference " << (*yi)[i] << "\n";
            break;
          }
        if (++problems > 5) break;
      }
      continue;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double f = x[i], r = y[i];
      bool good;
      if (std::isnan(r) || std::isnan(f))
        good = std::isnan(r) && std::isnan(f);
      else if (std::isinf(r) || std::isinf(f))
        good = f == r;
      else if (c.exact)
        good = f == r;
      else
        good = std::fabs(f - r) <= c.abs + c.rel * std::fabs(r) + 1e-300;
      if (!good) {
        err << "t" << c.id.value() << " (" << c.dtype.name() << (c.exact ? ", exact" : "") << ") element " << i
            << ": fused " << describe_value(f) << " vs reference " << describe_value(r) << " (bound abs " << c.abs
            << " rel " << c.rel << ")\n";
        ++problems;
        break;
      }
    }
    if (problems > 5) break;
  }
  // Both containers hold the same tensors (statuses, frees and drops handled alike).
  std::vector<TensorId> hf = fused.handles().handle_ids(), hr = ref.handles().handle_ids();
  auto outside = [&](TensorId id) { return id.value() < p.first_id || id.value() >= p.end_id; };
  std::erase_if(hf, outside);
  std::erase_if(hr, outside);
  if (hf != hr) {
    err << "handle sets differ: fused has";
    for (TensorId id : hf) err << " " << id.value();
    err << "; reference has";
    for (TensorId id : hr) err << " " << id.value();
    err << "\n";
  }
  return err.str();
}

}  // namespace kiln::cpu::difftest

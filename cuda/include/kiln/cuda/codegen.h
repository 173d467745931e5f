// CUDA C++ code generation from fused programs (fusion/fused_program.h): pure, deterministic
// text generation that needs no GPU and no CUDA library; NVRTC compiles the result (nvrtc.h).
//
// One FusedProgram becomes one translation unit: the shared prelude (prelude(): fp16 / bf16
// headers, the parameter structs of launch_abi.h, integer and rounding helpers) followed by the
// program's kernels:
//
//   Elementwise, NhwcRelayout   `<prefix>_s0_ew`  grid-stride loop, any strides (broadcast,
//                                                 views, NHWC outputs, masked broadcast stores)
//                               `<prefix>_s0_vec` grid-stride loop over 16-byte vectors: every
//                                                 tensor contiguous and aligned (the host picks
//                                                 it at launch), scalar tail
//   Reduce                      `<prefix>_s0_rows` one thread block per output, tree reduction
//                                                 in shared memory (inner == 1 rows)
//                               `<prefix>_s0_cols` one thread per output, serial along the axis
//                                                 (coalesced when inner > 1)
//   Matmul                      `<prefix>_s0_mm`   64x64 tiles, 4x4 per thread, fused epilogue
//   ReduceBroadcasted           the kernels of each stage k, `<prefix>_s<k>_...`, run in order
//   Row                         the kernels of each stage, as ReduceBroadcasted, and
//                               `<prefix>_row`: every stage in one kernel, one thread block per
//                               row (a grid-stride loop over rows); each stage is a __device__
//                               function over one row (`<prefix>_s<k>_rowpart`), a barrier
//                               between stages, so what a stage writes for a later one is read
//                               back by the same block while it is still in L1 / L2
//                               `<prefix>_rowwarp`: the same with one warp per row (its parts
//                               `_rowwarppart`, warp barriers), for short rows
//                               Temporaries consumed inside the launch may live in a shared-
//                               memory window of the row (`row_windows`, chosen at launch)
//
// Sizes and scalar values are kernel parameters (KilnIter, KilnAccess, ...), never constants,
// so one compiled program serves every size and every scalar value of its structure.
// Registers compute in the CPU fast path's classes (float for f32 / flex32 / f16 / bf16, double,
// 64-bit signed / unsigned integers, bool) and are rounded / wrapped back to their dtype after
// every instruction, as the reference executor's results are.
//
// Usage:
//   Result<GeneratedProgram> g = generate(program, {.name_prefix = "kiln"});
//   std::string src = g->source();                     // prelude() + body
//   for (const KernelSpec& k : g->kernels) ...          // names, roles, parameter lists
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/fusion/fused_program.h"

namespace kiln::cuda {

enum class KernelRole : std::uint8_t {
  ElementwiseStrided,
  ElementwiseVector,
  ReduceRows,
  ReduceCols,
  Matmul,
  // 16-byte vectors along the innermost dim, each load either a vector (stride 1) or one
  // element repeated (stride 0: a [rows, 1] broadcast), one unravel per vector. Generated for
  // elementwise blocks with broadcast loads; launched when row_vector_eligible() holds.
  ElementwiseRowVector,
  // A Row program's stages in one kernel, one thread block per row / one warp per row (short
  // rows: the host picks it below kWarpRowLength).
  RowFused,
  RowFusedWarp,
};
std::string_view kernel_role_name(KernelRole r);

// Rows up to this length run the Row program's warp-per-row kernel: a block's 256 threads on one
// row would leave most idle, and its barriers would cost more than the row's work.
inline constexpr std::int64_t kWarpRowLength = 1024;

// One kernel parameter, in declaration order; the host builds the argument list from these.
enum class ParamKind : std::uint8_t {
  Iter,            // KilnIter of block `block` (its reference shape)
  LoadAccess,      // KilnAccess of load `index` of block `block`
  StoreAccess,     // KilnAccess of store `index` of block `block`
  InputPtr,        // device pointer of program input `index` (a View entry: its source's buffer)
  OutputPtr,       // device pointer of program output `index`
  Indexed,         // KilnIndexed of program input `index` (role Indexed)
  Scalar,          // scalar slot `index` of GeneratedProgram::scalars, passed as its class type
  ReduceShape,     // KilnReduceShape of the stage's reduction
  MatmulShape,     // KilnMatmulShape
  Fault,           // int*: set to nonzero by a fault (integer division by zero, index out of range)
  RowWindowBytes,  // long long: the Row kernel's shared memory per row (0: temporaries in global memory)
  Rows,            // long long: rows of the Row kernel's [rows, n] space
  RowLength,       // long long: n
};
struct KernelParam {
  ParamKind kind = ParamKind::Iter;
  std::uint32_t block = 0;
  std::uint32_t index = 0;
  std::uint32_t stage = 0;  // whose StageArgs it reads (the Row kernel takes every stage's)
  friend bool operator==(const KernelParam&, const KernelParam&) = default;
};

struct KernelSpec {
  std::string name;
  KernelRole role = KernelRole::ElementwiseStrided;
  std::uint32_t stage = 0;         // ReduceBroadcasted, Row: the stage program (the Row kernel: 0); 0 otherwise
  std::uint32_t vector_width = 1;  // ElementwiseVector / ElementwiseRowVector: elements per 16-byte step
  std::uint32_t threads = 256;     // threads per block the kernel is written for
  std::vector<KernelParam> params;
};

// How a scalar is passed: the class its instruction computes in.
enum class ScalarClass : std::uint8_t { F32, F64, I64, U64, Bool };
ScalarClass scalar_class_of(ir::DType d);
std::size_t scalar_class_size(ScalarClass c);

struct ScalarSlot {
  std::uint32_t placeholder = 0;  // k of the converter's scalars
  ir::DType dtype;                // converted to this dtype first (the element codec's rules)
  ScalarClass cls = ScalarClass::F32;
};

// What a program's stage needs from the host besides its kernels.
struct StageInfo {
  fusion::ProgramKind kind = fusion::ProgramKind::Elementwise;
  // Per block: it has indexed reads (Gather / Select / Cat) and needs the true multi-index of its
  // reference shape (the host must not merge or drop its dims).
  std::vector<bool> indexed_blocks;
  // Vector width of the stage's ElementwiseVector kernel, 0 when it has none.
  std::uint32_t vector_width = 0;
  // Vector width of its ElementwiseRowVector kernel (16 bytes / the widest of every load and
  // store), 0 when it has none.
  std::uint32_t row_vector_width = 0;
  // The kernels' rank bound (KILN_R in the source): a launch whose iteration space has more dims
  // must not run them (the host replays op by op instead).
  std::uint32_t max_rank = 1;
};

struct GeneratedProgram {
  std::string body;  // the kernels; compile prelude() + body
  std::vector<KernelSpec> kernels;
  std::vector<ScalarSlot> scalars;
  std::vector<StageInfo> stages;  // one per stage (one for every kind but the staged ones)
  // Whether a kernel may fault (integer division, indexed reads): the host checks the fault word
  // before it commits the outputs. A reduction never faults in its kernel: the host leaves the
  // ones without an identity over an empty axis, and arg indices too wide for their dtype, to the
  // reference before launching.
  bool may_fault = false;
  // A Row program's one-kernel form (KernelRole::RowFused), or none: `row_kernel_refused` says
  // why (a stage the row kernel cannot run; the stages' own kernels still run in order).
  std::optional<std::size_t> row_kernel;       // index into `kernels`: a thread block per row
  std::optional<std::size_t> row_warp_kernel;  // ... a warp per row (both or neither)
  std::string row_kernel_refused;
  // The Row kernels' window temporaries, in window order: each takes n elements of its dtype,
  // rounded up to 16 bytes, of the row's shared memory when the host launches with a window
  // (row_window_bytes); else they go through global memory as the other outputs.
  std::vector<ir::DType> row_windows;

  std::string source() const;
};

struct CodegenOptions {
  // Prefix of the kernels' extern "C" names: several programs can share one translation unit
  // (the NVRTC tests batch programs that way) when their prefixes differ.
  std::string name_prefix = "kiln";
  // Threads per block of every kernel: 256 (generate() refuses any other; the row reductions'
  // warp shuffles need a multiple of 32, the matmul's 16x16 thread tile exactly 256).
  std::uint32_t threads = 256;
  // f32 exp and log through the hardware approximations (__expf, __logf: ex2/lg2.approx,
  // denormal results flushed to zero) instead of the accurate library functions. What
  // torch.compile's Triton kernels do for exp; opt-in here (CudaBackendOptions::fast_math),
  // since __expf's error grows with |x| (about 2 + 1.2|x| ulp) and __logf's is absolute (2^-21)
  // near 1. f64, f16/bf16 rounding and every other function are unchanged.
  bool fast_math = false;
};

// Whether one of the first `stages` stages of a staged program writes relative tensor `tensor`
// (the Row kernel's in-launch values: the generator's and the launch's rules read it alike).
bool written_by_stages(const fusion::FusedProgram& staged, std::size_t stages, std::uint64_t tensor);

// The shared part of every translation unit: headers, parameter structs, helpers.
std::string_view prelude();

// The program's kernels. Errors (ErrorCode::Unsupported) name what the generator does not
// handle (QFloat, ranks above kMaxRank, unknown instructions, malformed programs); the
// backend then runs the program's operations one by one.
Result<GeneratedProgram> generate(const fusion::FusedProgram& program, const CodegenOptions& options = {});

}  // namespace kiln::cuda

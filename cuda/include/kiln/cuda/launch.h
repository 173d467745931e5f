// Host side of a generated kernel's launch, without the GPU: concrete iteration spaces and
// accessors (strides, broadcasting, views, NHWC outputs, dim merging), reduction and matmul
// shapes, scalar arguments converted with the element codec's rules, the choice of the vector
// kernel, and the packed argument list cudaLaunchKernel takes. Everything here is a pure
// function of the program and the binding, so it is unit-tested on machines without a GPU.
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/cuda/codegen.h"
#include "kiln/cuda/launch_abi.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/ir/scalar.h"
#include "kiln/ir/tensor.h"

namespace kiln::cuda {

// How a program's relative ids map to concrete values (the converter's maps).
struct Binding {
  std::span<const ir::TensorIr> tensors;  // relative tensor id -> latest global occurrence
  std::span<const std::uint64_t> dims;    // relative dim id -> size
  std::span<const ir::ScalarIr> scalars;  // placeholder -> value
};

// A relative shape with concrete sizes. Errors: a dim id the binding does not know.
Result<ir::Shape> concrete_shape(const ir::Shape& relative, const Binding& binding);

// One block's iteration space and accessors.
struct BlockLayout {
  KilnIter iter;
  std::vector<KilnAccess> loads;   // per Load of the block
  std::vector<KilnAccess> stores;  // per Store of the block
  // Every plain load and every store is contiguous (no masked store), every broadcast load is a
  // single element: the vector kernel applies (subject to alignment).
  bool vectorizable = false;
};

// Computes a block's layout over its concrete reference shape. `merge` drops size-1 dims and
// merges dims every accessor walks contiguously (not for blocks with indexed reads, which need
// the true multi-index). Errors: shapes that do not broadcast to the reference, ranks above
// kMaxRank, unknown tensors.
Result<BlockLayout> block_layout(const fusion::FusedProgram& p, std::uint32_t block, const Binding& binding,
                                 const ir::Shape& reference, bool merge);

// [outer, n, inner] of a Reduce program's input reference along its reduction axis.
Result<KilnReduceShape> reduce_shape(const fusion::FusedProgram& p, const Binding& binding);

// The batched matmul of a Matmul program (operands row-major, batch dims broadcast).
Result<KilnMatmulShape> matmul_shape(const ir::Shape& lhs, const ir::Shape& rhs, const ir::Shape& out);

// The [rows, n] space of a Row program run as one kernel (codegen.h, KernelRole::RowFused), one
// thread block per row: every stage iterates the same concrete shape, rows = its leading dims,
// n = its last; each reduction is over that last axis; and a stage reads what an earlier stage
// wrote only element by element (a Plain or Broadcast read of the full shape or of the rows'
// reduced shape [..., 1]), so that the block of row r reads only what it wrote itself. Errors
// (ErrorCode::Unsupported) say which condition fails: the stages then run one launch each.
struct RowSpace {
  std::int64_t rows = 0, n = 0;
};
Result<RowSpace> row_space(const fusion::FusedProgram& row, const Binding& binding);

// Shared memory per row of the Row kernel's window for rows of n elements (the generated
// row_windows, each rounded up to 16 bytes, as the kernel lays them out).
std::int64_t row_window_bytes(std::span<const ir::DType> windows, std::int64_t n);

// How the Row kernel launches for rows of n elements: a warp per row up to kWarpRowLength (the
// block's warps each take a row), else a block per row; with the window temporaries in shared
// memory when the block's windows fit `max_shared` bytes, the warp kernel halving its threads
// (down to one warp) until they do; else in global memory at `threads`.
struct RowLaunch {
  bool by_warp = false;
  std::uint32_t threads = 256;
  std::int64_t window_bytes = 0;  // per row; 0: no window
  std::size_t shared = 0;         // dynamic shared memory of a block
  std::uint64_t rows_per_block = 1;
};
RowLaunch row_launch(std::span<const ir::DType> windows, std::int64_t n, std::uint32_t threads,
                     std::uint64_t max_shared);

// Row-major description of an indexed input.
KilnIndexed indexed_of(const ir::Shape& shape);

// A scalar argument: the value converted to the slot's dtype (the element codec's cast rules,
// exactly as the reference executor converts scalars), passed in the slot's class.
struct ScalarArg {
  std::array<std::byte, 8> bytes{};
  std::size_t size = 0;
};
ScalarArg scalar_arg(const ir::ScalarIr& value, const ScalarSlot& slot);

// Whether the stage's vector kernel may run: a vectorizable layout and every vector access
// aligned to vector_width elements.
bool vector_aligned(const fusion::FusedProgram& p, const BlockLayout& layout, std::uint32_t vector_width,
                    std::span<const std::uintptr_t> input_ptrs, std::span<const std::uintptr_t> output_ptrs);

// Whether block 0's layout can run the ElementwiseRowVector kernel of width `vector_width`: the
// innermost dim is a multiple of it; every load's innermost stride is 0 or 1 and every store's
// is 1, unmasked; every stride-1 access has outer strides that are multiples of the width and
// a base pointer aligned to the vector (so each row starts on a vector boundary).
bool row_vector_eligible(const fusion::FusedProgram& p, const BlockLayout& layout, std::uint32_t vector_width,
                         std::span<const std::uintptr_t> input_ptrs, std::span<const std::uintptr_t> output_ptrs);

// Everything a stage's kernels read, resolved; pack_args picks what a kernel's parameter list
// names, in order.
struct StageArgs {
  std::vector<BlockLayout> blocks;
  KilnReduceShape reduce{};
  KilnMatmulShape matmul{};
  std::vector<std::uintptr_t> inputs;     // per program input (a View entry: its source's buffer)
  std::vector<std::uintptr_t> outputs;    // per program output (0 when not written)
  std::vector<KilnIndexed> indexed;       // per program input (used for Indexed roles)
  std::vector<ScalarArg> scalars;         // per GeneratedProgram scalar slot
  std::uintptr_t fault = 0;               // int* fault word
  std::int64_t rows = 0, row_length = 0;  // the Row kernel's [rows, n] space (its stage 0's args)
  std::int64_t row_window_bytes = 0;      // its shared memory per row (0: no window)
};

// The argument list of one launch: storage for each parameter and the void* array
// cudaLaunchKernel reads. Movable (the storage does not move with it).
class ArgPack {
 public:
  void add(const void* data, std::size_t size);
  void** args() { return ptrs_.data(); }
  std::size_t size() const { return ptrs_.size(); }
  std::size_t bytes(std::size_t i) const { return storage_[i].size(); }

 private:
  std::vector<std::vector<std::byte>> storage_;
  std::vector<void*> ptrs_;
};

// Errors: a parameter naming something the StageArgs do not hold (a generator / binder bug).
Result<ArgPack> pack_args(const KernelSpec& kernel, const StageArgs& args);
// A kernel whose parameters read several stages' arguments (the Row kernel): each from
// `stages[param.stage]`.
Result<ArgPack> pack_args(const KernelSpec& kernel, std::span<const StageArgs> stages);

}  // namespace kiln::cuda

// Private to the fast CPU executor: the compiled form of a fused program, the per-launch state
// that binds it to concrete tensors, sizes and scalars, and the entry points of the kernel files
// (fast_elementwise.cc, fast_reduce.cc, fast_matmul.cc).
//
// A FusedProgram is compiled once per structure (cached in the CpuDevice by structural hash) into
// a CompiledProgram: per block, a flat list of typed operations over REGISTERS, each register an
// array of kBlock elements of one storage class (float, double, int64, uint64 or bool bytes).
// Running a block over positions [start, start + n) of its reference shape executes every
// operation once over n elements: loads gather (or alias) input elements, instructions are
// clean typed loops the compiler vectorises, stores scatter to outputs. Nothing in a compiled
// form depends on concrete sizes or scalar values; a Launch binds those.
//
// Thread-safety: compiled forms are immutable once built and shared between launches and
// threads. A Launch and its BlockRunners are built by one stream's executor; BlockRunner::run is
// const and is called concurrently by the tasks of one parallel loop (each with its own scratch).
#pragma once

#include <tbb/task_arena.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "jit_abi.h"
#include "kiln/cpu/host.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/lowering.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::jit {
struct Kernel;
}

namespace kiln::cpu::fast {

// Elements per chunk (numexpr's block size is 1024 too). Each instruction is one kernel call per
// chunk, so longer chunks amortise the dispatch: W1 on 2^16 f32 elements (in cache) measured
// 0.69 / 0.77 / 0.92 ns per element with 1024 / 512 / 256; and a 1024-element f64 register is
// 8 KiB, so a dozen live ones still fit in L2. DRAM-bound launches use kStreamChunk instead.
inline constexpr std::size_t kBlock = 1024;
// Chunk length of a memory-bound elementwise launch that streams from DRAM (its tensors exceed
// kStreamingBytes, most of the 32 MiB L3 of the machines we target): shorter chunks interleave
// the streams' reads finely enough that the prefetchers keep every stream busy. Measured on W1
// at 2^24 (docs/cpu-backend.md): 256 and 512 elements ~0.8 ns/elem, 1024 ~1.0-1.3, while in
// cache 1024 is ~25% faster than 256 (4x fewer kernel dispatches per element).
inline constexpr std::size_t kStreamChunk = 256;
inline constexpr std::uint64_t kStreamingBytes = std::uint64_t{24} << 20;
// Highest rank a compiled form iterates natively; higher ranks run on the reference executor.
inline constexpr std::size_t kMaxRank = 8;
// CBlock::load_part of a load that belongs to no single part.
inline constexpr std::uint32_t kNoPart = ~std::uint32_t{0};
// Parallel loops split work only when a launch has at least this many elements. A oneTBB
// fork-join costs a few microseconds; 2^16 f32 elements of a memory-bound elementwise loop take
// ~10-20 us on one core, so below that the split costs as much as it saves.
inline constexpr std::uint64_t kParallelThreshold = std::uint64_t{1} << 16;

// ---- Registers

enum class VClass : std::uint8_t { F32, F64, I64, U64, Bool };
std::size_t class_size(VClass c);
// f64 -> F64; f32, flex32, f16, bf16 -> F32; signed ints -> I64; unsigned -> U64; bool -> Bool.
std::optional<VClass> class_of(ir::DType d);
// Whether a tensor of this dtype stores its elements exactly as the class holds them (so a
// contiguous load may alias the buffer and an instruction may write straight into an output).
bool stores_natively(ir::DType d);

// What keeps a register's values inside its dtype after an instruction computed them in the
// class: round f32 to f16 / bf16, wrap a 64-bit integer to a narrower width.
enum class Fixup : std::uint8_t { None, F16, BF16, Wrap8, Wrap16, Wrap32, WrapU8, WrapU16, WrapU32 };
Fixup fixup_of(ir::DType d);

struct RegInfo {
  VClass cls = VClass::F32;
  ir::DType dtype;
  Fixup fixup = Fixup::None;
};

// One scalar operand, converted at launch to its instruction's dtype (the element codec's cast
// rules, as the reference executor converts scalars) and read through the field of its class.
struct Scalar {
  double f = 0;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  std::uint8_t b = 0;
};

// ---- Compiled instructions

// The shared lowering's instruction codes (fusion/lowering.h).
using Code = fusion::lowering::Code;

struct CInstr;
// n elements; operands already resolved to arrays of their class. Sets *fail on a fault.
struct KArgs {
  void* out = nullptr;
  std::array<const void*, 3> in{};
  std::array<const Scalar*, 2> s{};
  std::size_t n = 0;
  const CInstr* ins = nullptr;
  bool* fail = nullptr;
};
using KernelFn = void (*)(const KArgs&);

struct CInstr {
  Code code = Code::Copy;
  VClass cls = VClass::F32;      // operand class
  VClass out_cls = VClass::F32;  // result class
  ir::DType compute;             // operand dtype
  ir::DType out_dtype;
  std::uint32_t out = 0;                         // register
  std::array<std::int32_t, 3> regs{-1, -1, -1};  // register operands
  std::array<std::int32_t, 2> scalars{-1, -1};   // scalar slots (CompiledProgram::scalars)
  std::vector<std::uint32_t> inputs;             // program inputs (indexed ops)
  std::int64_t dim = 0;                          // indexed ops
  int bits = 0;                                  // integer width of the compute dtype (shifts)
  Scalar imm;                                    // Fill constant (Ones, Zeros)
  bool exact_out = false;                        // the kernel already rounded to the register's dtype: no fixup
  KernelFn fn = nullptr;
};

struct CLoad {
  std::uint32_t reg = 0;
  fusion::LoadSource source = fusion::LoadSource::Input;
  std::uint32_t index = 0;  // program input (Plain / Broadcast / View entry) or program output
};

struct CStore {
  std::uint32_t reg = 0;
  std::uint32_t output = 0;
};

struct CBlock {
  ir::Shape reference;  // relative dim ids
  std::vector<RegInfo> regs;
  std::vector<std::uint32_t> slot;  // physical kBlock-element slot of each register
  std::uint32_t num_slots = 0;
  std::vector<int> last_read;  // per register: last instruction reading it (instrs.size()
                               // for a store), -1 if none
  std::vector<CLoad> loads;
  std::vector<CInstr> instrs;
  std::vector<CStore> stores;
  std::optional<fusion::Reduction> reduction;  // Reduce programs, block 1
  bool has_indexed = false;
  // The block's independent parts: connected components of its registers, joined by the
  // instructions that read them and by loads of the same input, numbered by their stores. A
  // broadcast load joins nothing (one element, read by every part that uses it). Instructions
  // and loads that reach no store belong to part 0. A launch (JIT kernel or interpreter) can
  // run a block's parts one after another (fewer streams at a time: fused Adam, one part per
  // parameter) when no part writes what another reads (parts_run_apart). A value computed from
  // broadcast loads alone (a fill, c * k) joins every part that reads it.
  std::uint32_t parts = 0;
  std::vector<std::uint32_t> load_part;  // kNoPart: a broadcast load
  std::vector<std::uint32_t> instr_part;
  std::vector<std::uint32_t> store_part;
  // Per part, the loads it reads (its own, and the broadcast loads its instructions or stores
  // read): part p's are part_loads[part_loads_begin[p] .. part_loads_begin[p + 1]).
  std::vector<std::uint32_t> part_loads_begin;
  std::vector<std::uint32_t> part_loads;
  // More than one part, with a part for every load, instruction and store.
  bool split_into_parts() const {
    return parts > 1 && load_part.size() == loads.size() && instr_part.size() == instrs.size() &&
           store_part.size() == stores.size() && part_loads_begin.size() == std::size_t{parts} + 1;
  }
  std::span<const std::uint32_t> loads_of_part(std::uint32_t p) const {
    return std::span<const std::uint32_t>(part_loads)
        .subspan(part_loads_begin[p], part_loads_begin[p + 1] - part_loads_begin[p]);
  }
};
// Launches of fewer positions run their parts together (parts_run_apart): below ~L2 size the
// streams interleave for free.
inline constexpr std::uint64_t kMinPartPositions = std::uint64_t{1} << 14;

struct ScalarBind {
  std::uint32_t placeholder = 0;  // k of ctx.converter().scalars()[k]
  ir::DType dtype;                // converted to this dtype
};

// The JIT kernel of a compiled form (jit.h), built on the first launch that wants it rather than
// with the compiled form: stages of a row-interleaved ReduceBroadcasted program and one-op
// programs are compiled forms too, and would pay a compiler run they never use.
struct JitSlot {
  std::once_flag once;
  std::shared_ptr<const jit::Kernel> kernel;
};

struct CompiledProgram {
  fusion::ProgramKind kind = fusion::ProgramKind::Elementwise;
  std::shared_ptr<JitSlot> jit = std::make_shared<JitSlot>();
  bool supported = true;
  std::string why_unsupported;  // for the log / tests
  bool may_fail = false;        // integer division, indexed reads: no in-place reuse
  std::vector<CBlock> blocks;
  std::vector<ScalarBind> scalars;
  std::vector<CompiledProgram> stages;  // ReduceBroadcasted
};

// Chooses the kernel of a compiled instruction (fast_elementwise.cc): sets ins.fn (and
// ins.exact_out); false when the combination of code and classes has no fast kernel.
bool bind_kernel(CInstr& ins, const RegInfo& out);

// Compiles a program (fast_compile.cc). Never fails: an unsupported program comes back with
// supported = false and the reason, and runs through the reference executor.
CompiledProgram compile_program(const fusion::FusedProgram& p);

// ---- Launch: one execution of a compiled program with concrete tensors, sizes and scalars.

struct Launch {
  const fusion::FusedProgram* program = nullptr;
  const CompiledProgram* compiled = nullptr;
  std::span<const std::uint64_t> dims;             // relative dim id -> size
  std::vector<Scalar> scalars;                     // per ScalarBind
  std::vector<std::optional<HostTensor>> inputs;   // per program input (a View entry: its source)
  std::vector<std::optional<HostTensor>> outputs;  // per program output, when written
  std::vector<bool> output_inplace;                // reuses a consumed input's buffer
  HostAllocator* allocator = nullptr;
  tbb::task_arena* arena = nullptr;  // null: run on the calling thread
  int threads = 1;
  const jit::Kernel* jit = nullptr;  // Elementwise: run block 0 through this JIT kernel
  // The device's counter of outputs written with non-temporal stores (null: not counted).
  std::atomic<std::uint64_t>* nontemporal_outputs = nullptr;
  // The device's counter of launches that ran their parts one after another (null: not counted).
  std::atomic<std::uint64_t>* part_by_part = nullptr;
  // The device's counter of launches `jit` ran (not those it declined; null: not counted).
  std::atomic<std::uint64_t>* jit_launches = nullptr;

  ir::Shape concrete(const ir::Shape& relative) const;
};

// A tensor read or written over a block's iteration space: element offset = sum idx[d] * stride[d].
struct Accessor {
  std::byte* base = nullptr;
  ir::DType dtype;
  std::size_t esize = 0;
  std::array<std::int64_t, kMaxRank> stride{};
  bool contiguous = false;  // strides are the iteration space's row-major strides
  bool zero = false;        // every stride 0: one element broadcast everywhere
  bool masked = false;      // store: write only where every stride-0 dim has index 0
  bool alias = false;       // load: contiguous and native, read in place
  bool stream = false;      // store: contiguous, native and large: non-temporal stores
};

// Whether a launch of block `cb` over n positions, with these (flat or strided) accessors, may
// run its parts one after another, each over the whole range (fast_elementwise.cc): the block
// has several parts, n is large (below ~L2 size the streams interleave for free), and no store
// of one part overlaps a load of another (an output written in place over another part's
// consumed input would be overwritten before that part reads it; one pass reads each position
// before writing it).
bool parts_run_apart(const CBlock& cb, std::span<const Accessor> loads, std::span<const Accessor> stores,
                     std::uint64_t n);

// One block of a launch, bound to concrete sizes, ready to run chunk by chunk.
class BlockRunner {
 public:
  // Binds block `b` of the launch. `reference` overrides the block's concrete reference shape
  // (Matmul / Reduce drivers); `preset` lists registers whose values the caller provides
  // (a reduction's result, the matmul product). Returns an empty string, or why it cannot run,
  // naming the values involved (which input, output or instruction, its shape and the limit).
  // `written` lists program outputs the caller already filled (their stores are skipped).
  std::string prepare(const Launch& launch, std::size_t b, const ir::Shape& reference,
                      std::span<const std::uint32_t> preset = {}, std::span<const std::uint32_t> written = {});
  // Runs positions [start, start + n) of the reference shape (n <= kBlock). `scratch` holds
  // num_slots() * kBlock * 8 bytes, 64-byte aligned; `ptrs` one pointer per register (preset
  // ones filled in by the caller; on return every register's values for these positions).
  // Returns false when a kernel faulted (integer division by zero, index out of range).
  // `part`: only that part's loads, instructions and stores (CBlock::parts; broadcast loads for
  // every part), for a launch that runs its parts one after another (parts_run_apart).
  bool run(std::uint64_t start, std::size_t n, std::byte* scratch, void** ptrs, std::uint32_t part = kNoPart) const;

  std::uint64_t numel() const { return numel_; }
  // Bytes the block's loads and stores move over the whole iteration space (broadcast reads of
  // one element excluded).
  std::uint64_t streamed_bytes() const;
  // Writes large contiguous outputs with non-temporal stores from now on (a launch that streams
  // from DRAM: the output would only evict what the next chunks need, and the stores skip the
  // read-for-ownership of each line). Call after prepare(); the caller fences (stream_fence)
  // before the outputs are read elsewhere.
  // Whether the launch writes its outputs with non-temporal stores: it streams from DRAM (more
  // than kStreamingBytes) and is memory-bound (at most ~2 instructions per stream).
  bool streams_outputs() const;
  // Whether store s may be written with non-temporal stores: contiguous, unmasked, native, no
  // fixup, and a fresh buffer (never an output written in place over a consumed input).
  bool streamable_store(std::size_t s) const;
  void use_streaming_stores();
  // Store s alone, when streamable_store(s); whether it now streams.
  bool stream_store(std::size_t s);
  // Each run() also prefetches the next `n` positions of its contiguous input streams.
  void set_prefetch(bool on) { prefetch_ = on; }
  std::size_t num_regs() const { return block_->regs.size(); }
  // The coalesced iteration space and accessors prepare() bound (a JIT kernel walks them itself).
  int rank() const { return rank_; }
  const std::array<std::uint64_t, kMaxRank>& dims() const { return dims_; }
  std::span<const Accessor> load_accessors() const { return loads_; }
  std::span<const Accessor> store_accessors() const { return stores_; }
  std::size_t scratch_bytes() const { return std::size_t{block_->num_slots} * kBlock * 8; }
  const CBlock& block() const { return *block_; }
  // The loads and stores that address `buffer`: a staged program's task points those of a
  // temporary at its own row window (set_load_base / set_store_base; fast_executor.cc).
  struct BufferAccessors {
    std::vector<std::uint32_t> loads, stores;
    bool contiguous = true;  // every one walks the buffer row-major
  };
  BufferAccessors accessors_of(const std::byte* buffer) const;
  void set_load_base(std::uint32_t load, std::byte* base) { loads_[load].base = base; }
  void set_store_base(std::uint32_t store, std::byte* base) { stores_[store].base = base; }

 private:
  struct IndexedRead {  // an Indexed program input, resolved
    const std::byte* base = nullptr;
    ir::DType dtype;
    ir::Shape shape;
    std::array<std::uint64_t, kMaxRank> strides{};
  };
  void gather(const Accessor& a, std::uint64_t start, std::size_t n, void* dst, VClass cls) const;
  void scatter(const Accessor& a, std::uint64_t start, std::size_t n, const void* src, VClass cls) const;
  bool run_indexed(const CInstr& ins, std::uint64_t start, std::size_t n, void* out) const;
  // One run of an indexed read: `len` elements of `from`, the first at element `src`, `step` apart.
  struct IndexedRun {
    const IndexedRead* from = nullptr;
    std::uint64_t src = 0;
    std::int64_t step = 0;
    std::size_t len = 1;
  };
  // The run that starts at position `idx` of the block (at most `row_left` long); nullopt on an
  // index out of range. `cat_total`: a Cat's size along its dim.
  std::optional<IndexedRun> indexed_run(const CInstr& ins, const std::array<std::uint64_t, kMaxRank>& idx,
                                        std::size_t row_left, std::uint64_t cat_total) const;
  // prepare()'s phases, in order.
  std::string bind_loads(const Launch& launch, const ir::Shape& reference);
  std::string bind_stores(const Launch& launch, const ir::Shape& reference, std::span<const std::uint32_t> written);
  void coalesce(const ir::Shape& reference);
  void choose_direct_stores(const Launch& launch);
  void bind_instruction_args(const Launch& launch);
  std::string bind_indexed(const Launch& launch, const ir::Shape& reference);
  std::string check_indexed_shape(const CInstr& ins, const ir::Shape& reference) const;

  const Launch* launch_ = nullptr;
  const CBlock* block_ = nullptr;
  // Coalesced iteration space (accessors) and the block's own reference (indexed reads).
  int rank_ = 0;
  std::array<std::uint64_t, kMaxRank> dims_{};
  ir::Shape reference_;
  std::uint64_t numel_ = 0;
  std::vector<Accessor> loads_;       // per CLoad
  std::vector<Accessor> stores_;      // per CStore
  std::vector<std::int32_t> direct_;  // per instruction: CStore written in place, or -1
  std::vector<bool> store_done_;      // per CStore: written directly by its instruction
  std::vector<bool> preset_;          // per register
  std::vector<IndexedRead> indexed_;  // per program input (Indexed role only)
  std::vector<KArgs> proto_;          // per instruction: scalars and instruction bound
  std::vector<bool> fix_;             // per instruction: apply the register's fixup
  bool prefetch_ = false;
};

// Scratch memory for one task: num bytes, 64-byte aligned.
struct Scratch {
  explicit Scratch(std::size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::byte* data() { return data_; }

 private:
  std::byte* data_ = nullptr;
};

// Runs `body(begin, end)` over [0, n) split into pieces of at least `grain`, on the launch's
// arena when there is more than one thread and n >= grain * 2; otherwise inline.
template <class F>
void parallel_ranges(const Launch& launch, std::uint64_t n, std::uint64_t grain, F&& body);
void parallel_ranges_impl(tbb::task_arena* arena, int threads, std::uint64_t n, std::uint64_t grain,
                          void (*fn)(void*, std::uint64_t, std::uint64_t), void* ctx);
template <class F>
void parallel_ranges(const Launch& launch, std::uint64_t n, std::uint64_t grain, F&& body) {
  auto thunk = [](void* c, std::uint64_t b, std::uint64_t e) { (*static_cast<std::remove_reference_t<F>*>(c))(b, e); };
  parallel_ranges_impl(launch.arena, launch.threads, n, grain, thunk, &body);
}

// ---- Program kinds (each returns an empty string on success, or the reason it could not run;
// a non-empty result before any output was written lets the driver replay the ops instead).

// Elementwise (also the first part of NhwcRelayout): block 0 over its reference shape; through
// launch.jit when set (jit.cc), else the interpreter.
std::string run_elementwise(const Launch& launch, bool* fault);
// Runs a launch through its JIT kernel: the flat path, or row by row (JitRows) when its
// broadcasts run along rows. *declined (nothing ran) when the launch needs the strided path:
// the interpreter's broadcast handling is faster there (W4's row broadcast: 0.67 vs 3.5 ns per
// element measured), so the caller runs it instead.
std::string run_elementwise_jit(const Launch& launch, bool* fault, bool* declined);

// A block's JIT kernel run one call per row of n positions, each access based at the row's first
// element: the kernel's flat path then reads each input contiguously, or (its broadcast loads)
// one element, which a row's reduced value is. That serves a launch whose broadcasts run along
// rows (softmax's x - max, layer norm's division), which the flat path alone cannot take.
class JitRows {
 public:
  // Rows of at least this many positions; below, a call per row costs more than the interpreter's
  // one call per 1024-element block.
  static constexpr std::uint64_t kMinLength = 128;
  // The row form of `kernel` over runner `b`'s space cut in rows of n, when every row is what its
  // flat path reads: each load contiguous along the row, or constant along it where the kernel
  // broadcasts it, each store contiguous and unmasked, n at least kMinLength and a divisor of the
  // space's last dimension. `nontemporal[k]`: store k may go out non-temporally (f32 only).
  static std::optional<JitRows> make(const jit::Kernel* kernel, const BlockRunner& b, std::span<const Scalar> scalars,
                                     std::uint64_t n, const std::vector<bool>& nontemporal);
  // Rows [r0, r1) at the runner's current bases (which a caller may move, as the staged runner's
  // windows do); false after a fault. The kernel ORs bit k into *streamed (when not null) for
  // each store k it wrote non-temporally.
  bool run(const BlockRunner& b, std::uint64_t r0, std::uint64_t r1, std::uint64_t* streamed = nullptr) const;

 private:
  const jit::Kernel* kernel_ = nullptr;
  std::uint64_t n_ = 0;
  std::vector<jit::Access> loads_, stores_;  // the frame's accesses, their bases set per row
  std::vector<jit::ScalarValue> scalars_;
};
// Reduce: prologue, reduction, epilogue.
std::string run_reduce(const Launch& launch, bool* fault);

// A Reduce launch bound once and run whole, or row range by row range (reductions over the last
// axis: a ReduceBroadcasted program interleaves its stages per group of rows).
class ReduceRunner {
 public:
  ReduceRunner();
  ~ReduceRunner();
  ReduceRunner(const ReduceRunner&) = delete;
  ReduceRunner& operator=(const ReduceRunner&) = delete;
  std::string prepare(const Launch& launch);
  void run(bool* fault);
  // inner == 1: the reduced axis is the last non-trivial one, output row r reduces input row r.
  bool rowwise() const;
  std::uint64_t rows() const;
  std::uint64_t row_length() const;
  // Rows [begin, end) on the calling thread; false on a fault. Tasks running rows at once each
  // use their own task_copy().
  bool run_rows(std::uint64_t begin, std::uint64_t end);
  // A prepared runner's copy for one task (its own runners, which it may rebase; no fault yet).
  std::unique_ptr<ReduceRunner> task_copy() const;
  BlockRunner& prologue();
  BlockRunner& epilogue();

 private:
  struct State;
  std::unique_ptr<State> state_;
};
// Matmul + epilogue.
std::string run_matmul(const Launch& launch, bool* fault);

// The B operand of gemm_rows handed over panel by panel, for kernels whose B is a view of data
// in another layout (the convolutions' im2col columns, packed straight from x: an implicit GEMM).
template <class T>
class GemmPanelSource {
 public:
  virtual ~GemmPanelSource() = default;
  // Writes columns [j0, j0 + width) of B into consecutive panels of NR = gemm_panel_width<T>()
  // columns: B[p, j0 + j] at panels[(j / NR) · NR · k + p · NR + j % NR] for every row p < k, and
  // 0 in the last panel's columns past width.
  virtual void pack(std::size_t j0, std::size_t width, T* panels) const = 0;
};
// The columns of one packed panel of B (the micro-kernel's NR).
template <class T>
std::size_t gemm_panel_width();

// C[m, n] (row stride ldc) = (or += when add_to_c) A[m, k] (lda) x B[k, n], row-major, on the
// calling thread: the matmul programs' packed kernel for the kernels that build their own
// operands (the convolutions). B row-major (ldb), or from a panel source. T is float or double;
// sums in T, in the kernel's order (KC blocks of K in order), so both forms give the same bits.
template <class T>
void gemm_rows(std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda, const T* b, std::size_t ldb,
               T* c, std::size_t ldc, bool add_to_c);
template <class T>
void gemm_rows(std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda, const GemmPanelSource<T>& b,
               T* c, std::size_t ldc, bool add_to_c);

// Element conversions shared by the kernel files: copy n elements of `src` (dtype storage,
// element stride `stride`, 0 = broadcast one element) into a class array, and back.
void load_elements(const std::byte* src, ir::DType dtype, std::int64_t stride, std::size_t n, void* dst, VClass cls);
void store_elements(const void* src, VClass cls, std::size_t n, std::byte* dst, ir::DType dtype, std::int64_t stride);
// Orders this thread's non-temporal stores before anything it does next (sfence on x86).
void stream_fence();
// Applies a register's fixup in place.
void apply_fixup(void* data, VClass cls, Fixup f, std::size_t n);

}  // namespace kiln::cpu::fast

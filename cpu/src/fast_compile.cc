// Compiles a FusedProgram into the fast executor's CompiledProgram: typed registers, one kernel
// per instruction, physical scratch slots shared by registers whose lifetimes do not overlap,
// scalar slots. Structure only: nothing here depends on sizes or scalar values.
#include <algorithm>
#include <limits>
#include <map>

#include "fast_program.h"
#include "kiln/fusion/lowering.h"

namespace kiln::cpu::fast {
namespace {

using fusion::FusedProgram;
using fusion::Instruction;
using fusion::ProgramBlock;
using fusion::ProgramKind;
using ir::OpKind;

constexpr std::uint32_t kNoSlot = std::numeric_limits<std::uint32_t>::max();

// The constant of Ones / Zeros in a dtype, read through its class.
Scalar constant(ir::DType d, int value) {
  Scalar s;
  s.f = value;
  s.i = value;
  s.u = static_cast<std::uint64_t>(value);
  s.b = value != 0;
  (void)d;
  return s;
}

int int_bits_of(ir::DType d) { return d.is_integral() ? static_cast<int>(d.size_bytes() * 8) : 0; }

class Compiler {
 public:
  explicit Compiler(const FusedProgram& p) : p_(p) {}

  CompiledProgram run() {
    out_.kind = p_.kind;
    if (fusion::is_staged(p_.kind)) {
      for (const FusedProgram& s : p_.stages) out_.stages.push_back(compile_program(s));
      return std::move(out_);
    }
    switch (p_.kind) {
      case ProgramKind::Elementwise:
      case ProgramKind::NhwcRelayout:
        if (p_.blocks.size() != 1) return unsupported("an elementwise program has one block");
        break;
      case ProgramKind::Matmul:
        if (p_.blocks.size() != 1 || !p_.matmul) return unsupported("a matmul program has one block and a matmul");
        break;
      case ProgramKind::Reduce:
        if (p_.blocks.size() != 2 || !p_.blocks[1].reduction || p_.blocks[0].reduction)
          return unsupported("a reduce program has a prologue and a reduction block");
        out_.may_fail = true;  // empty reductions without identity, index dtypes too narrow
        break;
      case ProgramKind::ReduceBroadcasted:
      case ProgramKind::Row: break;
    }
    for (const fusion::ProgramInput& in : p_.inputs)
      if (!class_of(in.dtype)) return unsupported("input dtype " + in.dtype.name());
    for (const fusion::ProgramOutput& o : p_.outputs) {
      if (!class_of(o.dtype)) return unsupported("output dtype " + o.dtype.name());
      if (o.block >= p_.blocks.size()) return unsupported("output of an unknown block");
    }
    for (std::size_t b = 0; b < p_.blocks.size(); ++b)
      if (!compile_block(b)) return std::move(out_);
    return std::move(out_);
  }

 private:
  CompiledProgram unsupported(std::string why) {
    out_.supported = false;
    out_.why_unsupported = std::move(why);
    return std::move(out_);
  }
  bool fail(std::string why) {
    out_.supported = false;
    if (out_.why_unsupported.empty()) out_.why_unsupported = std::move(why);
    return false;
  }

  std::int32_t scalar_slot(std::uint32_t k, ir::DType d) {
    for (std::size_t i = 0; i < out_.scalars.size(); ++i)
      if (out_.scalars[i].placeholder == k && out_.scalars[i].dtype == d) return static_cast<std::int32_t>(i);
    out_.scalars.push_back(ScalarBind{k, d});
    return static_cast<std::int32_t>(out_.scalars.size() - 1);
  }

  bool compile_block(std::size_t bi) {
    const ProgramBlock& b = p_.blocks[bi];
    CBlock cb;
    cb.reference = b.reference_shape;
    cb.reduction = b.reduction;
    for (const ir::DType& d : b.registers) {
      const std::optional<VClass> c = class_of(d);
      if (!c) return fail("register dtype " + d.name());
      cb.regs.push_back(RegInfo{*c, d, fixup_of(d)});
    }
    const std::size_t nregs = cb.regs.size();
    auto reg_ok = [&](std::uint32_t r) { return r < nregs; };
    std::vector<bool> preset(nregs, false);
    if (b.reduction) {
      if (!reg_ok(b.reduction->out)) return fail("reduction register");
      preset[b.reduction->out] = true;
      if (!(cb.regs[b.reduction->out].dtype == b.reduction->out_dtype)) return fail("reduction output dtype");
    }
    if (bi == 0 && p_.matmul) {
      if (!reg_ok(p_.matmul->out)) return fail("matmul register");
      preset[p_.matmul->out] = true;
    }
    for (const fusion::Load& l : b.loads) {
      if (!reg_ok(l.local)) return fail("load register");
      if (l.source == fusion::LoadSource::Input) {
        if (l.index >= p_.inputs.size()) return fail("load of an unknown input");
        const fusion::ProgramInput& in = p_.inputs[l.index];
        if (in.role == fusion::InputRole::Indexed) return fail("plain load of an indexed input");
        if (in.role == fusion::InputRole::View) {
          if (!in.view || in.view->source >= p_.inputs.size()) return fail("view without a source");
          if (in.view->op != OpKind::Base_SwapDims && in.view->op != OpKind::Base_Reshape) return fail("view kind");
        }
        if (!(in.dtype == cb.regs[l.local].dtype)) return fail("load dtype");
      } else {
        if (l.index >= p_.outputs.size()) return fail("load of an unknown output");
        const fusion::ProgramOutput& o = p_.outputs[l.index];
        if (o.block >= bi || !o.written) return fail("load of an output not written by an earlier block");
        if (!(o.dtype == cb.regs[l.local].dtype)) return fail("load dtype");
      }
      cb.loads.push_back(CLoad{l.local, l.source, l.index});
    }
    for (const Instruction& ins : b.instructions) {
      if (!compile_instr(b, ins, cb)) return false;
    }
    for (const fusion::Store& s : b.stores) {
      if (!reg_ok(s.local) || s.output >= p_.outputs.size()) return fail("store");
      if (!(p_.outputs[s.output].dtype == cb.regs[s.local].dtype)) return fail("store dtype");
      cb.stores.push_back(CStore{s.local, s.output});
    }
    // The handover register of a Reduce prologue is read after the block ran.
    std::optional<std::uint32_t> handover;
    if (bi + 1 < p_.blocks.size() && p_.blocks[bi + 1].reduction) {
      handover = p_.blocks[bi + 1].reduction->input;
      if (!reg_ok(*handover)) return fail("reduction input register");
    }
    elide_copies(cb, handover);
    if (handover) {
      if (!(cb.regs[*handover].dtype == p_.blocks[bi + 1].reduction->input_dtype)) return fail("reduction input dtype");
    }
    assign_slots(cb, preset, handover);
    assign_parts(cb, b);
    out_.blocks.push_back(std::move(cb));
    // The next block's reduction reads this block's (possibly renamed) handover register.
    if (handover) next_reduction_input_ = *handover;
    if (out_.blocks.back().reduction && next_reduction_input_)
      out_.blocks.back().reduction->input = *next_reduction_input_;
    return true;
  }

  bool compile_instr(const ProgramBlock& blk, const Instruction& ins, CBlock& cb) {
    // The shared lowering (fusion/lowering.h) picks the code and checks the operands.
    fusion::lowering::Lowered lowered;
    if (std::string why = fusion::lowering::lower_instruction(p_, blk, ins, lowered); !why.empty())
      return fail(std::move(why));
    const std::optional<VClass> cls = class_of(ins.compute);
    const std::optional<VClass> out_cls = class_of(ins.out_dtype);
    if (!cls || !out_cls) return fail("instruction dtype");
    const Code k = lowered.code;
    const std::vector<std::uint32_t>& locals = lowered.operands.locals;
    const std::vector<std::uint32_t>& scalars = lowered.operands.scalars;
    CInstr c;
    c.code = k;
    c.cls = *cls;
    c.out_cls = *out_cls;
    c.compute = ins.compute;
    c.out_dtype = ins.out_dtype;
    c.out = ins.out;
    c.bits = int_bits_of(ins.compute);
    c.inputs = lowered.operands.inputs;
    if (k == Code::Fill && ins.op == OpKind::Base_Ones) c.imm = constant(ins.out_dtype, 1);
    if (k == Code::Fill && ins.op == OpKind::Base_Zeros) c.imm = constant(ins.out_dtype, 0);
    if (!c.inputs.empty()) {
      c.dim = ins.attrs[0];
      cb.has_indexed = true;
      out_.may_fail = true;  // an index out of range
    }
    for (std::size_t i = 0; i < locals.size(); ++i) c.regs[i] = static_cast<std::int32_t>(locals[i]);
    for (std::size_t i = 0; i < scalars.size(); ++i) c.scalars[i] = scalar_slot(scalars[i], ins.compute);
    if (fusion::lowering::may_fault(k, ins.compute)) out_.may_fail = true;
    if (!bind_kernel(c, cb.regs[c.out]))
      return fail(std::string("no fast kernel for ") + std::string(ir::op_info(ins.op).variant) + " on " +
                  ins.compute.name());
    cb.instrs.push_back(std::move(c));
    return true;
  }

  // Copies (a same-shape reshape) and identity casts (f32 -> f32: a client lowering sigmoid emits
  // two) compute nothing: their result register becomes another name of their operand, and the
  // instruction goes (one pass over the chunk saved). A handover register is renamed too.
  void elide_copies(CBlock& cb, std::optional<std::uint32_t>& handover) {
    std::vector<std::uint32_t> alias(cb.regs.size());
    for (std::size_t r = 0; r < alias.size(); ++r) alias[r] = static_cast<std::uint32_t>(r);
    std::vector<CInstr> kept;
    for (CInstr& ins : cb.instrs) {
      for (std::int32_t& r : ins.regs)
        if (r >= 0) r = static_cast<std::int32_t>(alias[static_cast<std::size_t>(r)]);
      const bool identity = (ins.code == Code::Copy || ins.code == Code::Cast) && ins.compute == ins.out_dtype &&
                            ins.regs[0] >= 0 && cb.regs[static_cast<std::size_t>(ins.regs[0])].dtype == ins.out_dtype;
      if (identity) {
        alias[ins.out] = static_cast<std::uint32_t>(ins.regs[0]);
        continue;
      }
      kept.push_back(std::move(ins));
    }
    cb.instrs = std::move(kept);
    for (CStore& st : cb.stores) st.reg = alias[st.reg];
    if (handover) handover = alias[*handover];
    if (cb.reduction) cb.reduction->out = alias[cb.reduction->out];
  }

  // CBlock::parts (see there), after copies were elided (their registers renamed).
  static void assign_parts(CBlock& cb, const fusion::ProgramBlock& b) {
    const std::size_t nregs = cb.regs.size();
    for (const CLoad& l : cb.loads)
      if (l.reg >= nregs) return;  // no parts (compile_program checked the registers before)
    for (const CInstr& ins : cb.instrs)
      if (ins.out >= nregs) return;
    for (const CStore& st : cb.stores)
      if (st.reg >= nregs) return;
    std::vector<std::uint32_t> root(nregs);
    for (std::uint32_t r = 0; r < nregs; ++r) root[r] = r;
    auto find = [&](std::uint32_t r) {
      while (root[r] != r) r = root[r] = root[root[r]];
      return r;
    };
    auto join = [&](std::uint32_t x, std::uint32_t y) { root[find(x)] = find(y); };
    auto broadcast = [&](std::size_t k) { return k < b.loads.size() && b.loads[k].broadcast; };
    std::vector<bool> broadcast_reg(nregs, false);
    std::map<std::pair<fusion::LoadSource, std::uint32_t>, std::uint32_t> first_load;  // source -> register
    for (std::size_t k = 0; k < cb.loads.size(); ++k) {
      const CLoad& l = cb.loads[k];
      if (broadcast(k)) {
        broadcast_reg[l.reg] = true;
        continue;
      }
      const auto [it, fresh] = first_load.emplace(std::pair{l.source, l.index}, l.reg);
      if (!fresh) join(l.reg, it->second);
    }
    for (const CInstr& ins : cb.instrs)
      for (std::int32_t r : ins.regs)
        if (r >= 0 && static_cast<std::size_t>(r) < nregs && !broadcast_reg[static_cast<std::size_t>(r)])
          join(ins.out, static_cast<std::uint32_t>(r));
    // Parts are numbered by their stores; what reaches no store (an unread instruction, a load
    // nothing reads) goes with part 0, so that it still runs exactly once (a dead integer
    // division still faults, as in the interpreter).
    std::vector<std::uint32_t> part_of_root(nregs, kNoPart);
    for (const CStore& st : cb.stores) {
      std::uint32_t& p = part_of_root[find(st.reg)];
      if (p == kNoPart) p = cb.parts++;
      cb.store_part.push_back(p);
    }
    auto part = [&](std::uint32_t r) {
      const std::uint32_t p = part_of_root[find(r)];
      return p == kNoPart ? 0 : p;
    };
    for (const CInstr& ins : cb.instrs) cb.instr_part.push_back(part(ins.out));
    for (std::size_t k = 0; k < cb.loads.size(); ++k)
      cb.load_part.push_back(broadcast(k) ? kNoPart : part(cb.loads[k].reg));
    // Per part, its loads: a broadcast load for each part with an instruction or store reading it.
    std::vector<std::vector<bool>> reads(cb.parts, std::vector<bool>(cb.loads.size(), false));
    std::vector<std::vector<std::uint32_t>> loads_of_reg(nregs);
    for (std::size_t k = 0; k < cb.loads.size(); ++k) {
      if (cb.load_part[k] != kNoPart && cb.load_part[k] < cb.parts) reads[cb.load_part[k]][k] = true;
      if (broadcast(k)) loads_of_reg[cb.loads[k].reg].push_back(static_cast<std::uint32_t>(k));
    }
    for (std::size_t i = 0; i < cb.instrs.size(); ++i)
      for (std::int32_t r : cb.instrs[i].regs)
        if (r >= 0 && static_cast<std::size_t>(r) < nregs && cb.instr_part[i] < cb.parts)
          for (std::uint32_t k : loads_of_reg[static_cast<std::size_t>(r)]) reads[cb.instr_part[i]][k] = true;
    for (std::size_t i = 0; i < cb.stores.size(); ++i)
      for (std::uint32_t k : loads_of_reg[cb.stores[i].reg]) reads[cb.store_part[i]][k] = true;
    for (std::uint32_t p = 0; p < cb.parts; ++p) {
      cb.part_loads_begin.push_back(static_cast<std::uint32_t>(cb.part_loads.size()));
      for (std::size_t k = 0; k < cb.loads.size(); ++k)
        if (reads[p][k]) cb.part_loads.push_back(static_cast<std::uint32_t>(k));
    }
    cb.part_loads_begin.push_back(static_cast<std::uint32_t>(cb.part_loads.size()));
  }

  // Greedy slot assignment in program order: a register takes a free slot when it is defined
  // (loads at the start; an instruction's output before its dying operands are released, so an
  // output never shares memory with an operand) and gives it back after its last use. Stored
  // registers and the reduction handover live to the end; preset registers have no slot.
  static void assign_slots(CBlock& cb, const std::vector<bool>& preset, std::optional<std::uint32_t> handover) {
    const std::size_t nregs = cb.regs.size();
    const int end = static_cast<int>(cb.instrs.size());
    std::vector<int> last(nregs, -2);
    for (std::size_t i = 0; i < cb.instrs.size(); ++i)
      for (std::int32_t r : cb.instrs[i].regs)
        if (r >= 0) last[static_cast<std::size_t>(r)] = static_cast<int>(i);
    for (const CStore& s : cb.stores) last[s.reg] = end;
    if (handover) last[*handover] = end;
    cb.slot.assign(nregs, kNoSlot);
    std::vector<std::uint32_t> free_slots;
    std::uint32_t next = 0;
    auto take = [&]() {
      if (!free_slots.empty()) {
        const std::uint32_t s = free_slots.back();
        free_slots.pop_back();
        return s;
      }
      return next++;
    };
    auto release_dead = [&](int at) {
      for (std::size_t r = 0; r < nregs; ++r)
        if (cb.slot[r] != kNoSlot && last[r] <= at && last[r] != -3) {
          free_slots.push_back(cb.slot[r]);
          last[r] = -3;  // released
        }
    };
    for (const CLoad& l : cb.loads)
      if (cb.slot[l.reg] == kNoSlot && !preset[l.reg]) cb.slot[l.reg] = take();
    // Loads never read are dead right away (last = -2 < 0 = the first instruction).
    release_dead(-1);
    for (std::size_t i = 0; i < cb.instrs.size(); ++i) {
      const std::uint32_t o = cb.instrs[i].out;
      if (!preset[o] && cb.slot[o] == kNoSlot) {
        cb.slot[o] = take();
        if (last[o] < static_cast<int>(i)) last[o] = static_cast<int>(i);  // unused result: dies here
      }
      release_dead(static_cast<int>(i));
    }
    cb.num_slots = next;
    // Last reader of each register: an instruction, or a store (after every instruction).
    cb.last_read.assign(nregs, -1);
    for (std::size_t i = 0; i < cb.instrs.size(); ++i)
      for (std::int32_t r : cb.instrs[i].regs)
        if (r >= 0) cb.last_read[static_cast<std::size_t>(r)] = static_cast<int>(i);
    for (const CStore& st : cb.stores) cb.last_read[st.reg] = end;
  }

  const FusedProgram& p_;
  CompiledProgram out_;
  std::optional<std::uint32_t> next_reduction_input_;
};

}  // namespace

CompiledProgram compile_program(const FusedProgram& p) { return Compiler(p).run(); }

}  // namespace kiln::cpu::fast

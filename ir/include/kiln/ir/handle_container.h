// HandleContainer: one device's map from tensor ids to handle entries (NotInit / Existing /
// Errored), with the error model and the executor-side propagation helpers (docs/spec/ir.md §10, §11).
//
// Thread-safety: none. A container is owned by one actor (the device server) or guarded by the
// device that owns it; every method, const ones included (error_of feeds the instrument), must
// be called from that owner only. A fork() is an independent object with the same rule.
//
// Nothing here aborts on anything a client can cause: an unknown id, a NotInit use or a NotInit
// entry comes back as an ErrorCode::InvalidHandle error value naming the tensor id, and an
// Errored entry comes back as its TensorError (HandleLookup below).
//
// The typed conversions of §10 (register_float_tensor, get_float_tensor, ...) belong to the
// backend bridge: they convert, then call register_handle / get_tensor_handle.
//
// Usage (an executor running one op):
//   if (auto skip = skip_if_errored(handles, op)) { log(skip->error); return; }   // §11.3
//   auto lhs = handles.get_tensor_handle(op.inputs()[0]);     // ReadWrite pops the entry
//   if (!lhs) return lhs.error();                             // InvalidHandle or the TensorError
//   ...
//   if (kernel failed) { fail_op(handles, op, kernel_error); return; }
//   handles.register_handle(op.outputs()[0].id, out);
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ir/handle_error.h"
#include "kiln/ir/operation.h"
#include "kiln/ir/shape.h"
#include "kiln/ir/tensor.h"

namespace kiln::ir {

// The state of one container entry (the index of the variant in HandleEntry).
enum class HandleState : std::uint8_t { NotInit = 0, Existing = 1, Errored = 2 };

constexpr const char* handle_state_name(HandleState s) {
  switch (s) {
    case HandleState::NotInit: return "NotInit";
    case HandleState::Existing: return "Existing";
    case HandleState::Errored: return "Errored";
  }
  return "?";
}

struct NoHandleInstrument;
template <class H, class Instrument = NoHandleInstrument>
class HandleContainer;

// One entry: NotInit | Existing(H) | Errored(TensorError) (docs/spec/ir.md §10). Default: NotInit.
template <class H>
class HandleEntry {
 public:
  HandleEntry() = default;
  static HandleEntry not_init() { return HandleEntry(); }
  static HandleEntry existing(H h) {
    HandleEntry e;
    e.v_.template emplace<1>(std::move(h));
    return e;
  }
  static HandleEntry errored(TensorError err) {
    HandleEntry e;
    e.v_.template emplace<2>(std::move(err));
    return e;
  }

  HandleState state() const { return static_cast<HandleState>(v_.index()); }
  bool is_not_init() const { return v_.index() == 0; }
  bool is_existing() const { return v_.index() == 1; }
  bool is_errored() const { return v_.index() == 2; }

  // The handle of an Existing entry, nullptr otherwise.
  H* handle() { return std::get_if<1>(&v_); }
  const H* handle() const { return std::get_if<1>(&v_); }
  // The error of an Errored entry, nullptr otherwise.
  const TensorError* error() const { return std::get_if<2>(&v_); }

 private:
  template <class, class>
  friend class HandleContainer;
  // Index-based access throughout, so that H may be any copyable type.
  std::variant<std::monostate, H, TensorError> v_;
};

// A backend resource plus its logical shape (docs/spec/ir.md §9).
template <class H>
struct TensorHandle {
  H handle;
  Shape shape;
};

// What get_handle / get_tensor_handle return: the value, or the TensorError of an Errored entry
// (sharing its root), or an InvalidHandle error for a request no valid stream can make.
template <class T>
class [[nodiscard]] HandleLookup {
 public:
  static HandleLookup found(T value) { return HandleLookup(std::in_place_index<0>, std::move(value)); }
  static HandleLookup errored(TensorError err) { return HandleLookup(std::in_place_index<1>, std::move(err)); }
  static HandleLookup invalid(Error err) { return HandleLookup(std::in_place_index<2>, std::move(err)); }

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // The entry was Errored: tensor_error() is the error it carried.
  bool is_errored() const { return v_.index() == 1; }
  // The request itself was invalid (absent id, NotInit status, NotInit entry).
  bool is_invalid() const { return v_.index() == 2; }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // Non-null iff is_errored().
  const TensorError* tensor_error() const { return std::get_if<1>(&v_); }
  // !ok(): the InvalidHandle error, or the TensorError as an error value (code = root's kind).
  Error error() const {
    assert(!ok());
    if (const TensorError* e = tensor_error()) return e->to_error();
    return std::get<2>(v_);
  }
  Status status() const { return ok() ? Status() : Status(error()); }
  // Drops the TensorError's identity; keep the lookup when the root matters.
  Result<T> to_result() && {
    if (ok()) return Result<T>(std::get<0>(std::move(v_)));
    return Result<T>(error());
  }

  // Applies f to the value; errors pass through unchanged.
  template <class F>
  auto map(F&& f) && -> HandleLookup<std::invoke_result_t<F, T&&>> {
    using U = std::invoke_result_t<F, T&&>;
    switch (v_.index()) {
      case 0: return HandleLookup<U>::found(std::forward<F>(f)(std::get<0>(std::move(v_))));
      case 1: return HandleLookup<U>::errored(std::get<1>(std::move(v_)));
      default: return HandleLookup<U>::invalid(std::get<2>(std::move(v_)));
    }
  }

 private:
  template <std::size_t I, class A>
  HandleLookup(std::in_place_index_t<I> tag, A&& a) : v_(tag, std::forward<A>(a)) {}
  std::variant<T, TensorError, Error> v_;
};

// The default instrument: nothing, and no storage ([[no_unique_address]]). Tests substitute one
// that counts the per-tensor error look-ups (docs/spec/ir.md §12.4 item 14); the hook is called exactly
// when the container searches its map on behalf of an error check.
struct NoHandleInstrument {
  void on_error_lookup(TensorId) noexcept {}
};

template <class H, class Instrument>
class HandleContainer {
 public:
  using Handle = H;
  using Entry = HandleEntry<H>;

  HandleContainer() = default;
  HandleContainer(HandleContainer&&) noexcept = default;
  HandleContainer& operator=(HandleContainer&&) noexcept = default;
  HandleContainer& operator=(const HandleContainer&) = delete;
  ~HandleContainer() = default;

  // ---- Handles (docs/spec/ir.md §10) -------------------------------------------------------------------

  // Inserts or overwrites Existing(h). Overwriting an Errored entry clears the claim (recovery).
  void register_handle(TensorId id, H h) {
    auto [it, inserted] = handles_.try_emplace(id);
    if (!inserted && it->second.is_errored()) --errored_;
    it->second.v_.template emplace<1>(std::move(h));
  }

  // (K) Marks `id` NotInit ("no buffer yet") if it has no entry; returns whether it inserted.
  // An existing entry (a handle or a claim) is never downgraded.
  bool register_not_init(TensorId id) { return handles_.try_emplace(id).second; }

  // An entry exists, whatever its state.
  bool has_handle(TensorId id) const { return handles_.find(id) != handles_.end(); }

  // The handle if the entry is Existing; nullptr for absent, NotInit and Errored entries.
  H* get_handle_ref(TensorId id) {
    auto it = handles_.find(id);
    return it == handles_.end() ? nullptr : it->second.handle();
  }
  const H* get_handle_ref(TensorId id) const {
    auto it = handles_.find(id);
    return it == handles_.end() ? nullptr : it->second.handle();
  }

  // The entry, any state; nullptr when absent. Invalidated by the next mutation of this id.
  const Entry* entry(TensorId id) const {
    auto it = handles_.find(id);
    return it == handles_.end() ? nullptr : &it->second;
  }

  // One use of a tensor. Existing: ReadOnly returns a clone and keeps the entry, ReadWrite
  // returns the handle and removes the entry. Errored: returns the TensorError; ReadWrite also
  // removes the entry (errored - 1). (K) The fatal cases of Burn — absent id, NotInit status,
  // NotInit entry — return InvalidHandle and leave the container unchanged.
  HandleLookup<H> get_handle(TensorId id, TensorStatus status) {
    using Lookup = HandleLookup<H>;
    if (status == TensorStatus::NotInit) [[unlikely]] {
      return Lookup::invalid(make_error(
          ErrorCode::InvalidHandle,
          "get_handle: " + id.to_string() + " used with status NotInit; only ReadOnly or ReadWrite reads a handle"));
    }
    auto it = handles_.find(id);
    if (it == handles_.end()) [[unlikely]] {
      return Lookup::invalid(make_error(ErrorCode::InvalidHandle, "get_handle: " + id.to_string() +
                                                                      " should have a handle but has no entry (" +
                                                                      status_name(status) + " use)"));
    }
    auto& v = it->second.v_;
    switch (v.index()) {
      case 1:
        if (status == TensorStatus::ReadOnly) return Lookup::found(std::get<1>(v));
        {
          H h = std::get<1>(std::move(v));
          handles_.erase(it);
          return Lookup::found(std::move(h));
        }
      case 2:
        if (status == TensorStatus::ReadOnly) return Lookup::errored(std::get<2>(v));
        {
          TensorError err = std::get<2>(std::move(v));
          handles_.erase(it);
          --errored_;
          return Lookup::errored(std::move(err));
        }
      default:
        return Lookup::invalid(make_error(ErrorCode::InvalidHandle, "get_handle: " + id.to_string() +
                                                                        " is NotInit: its producer never wrote it (" +
                                                                        status_name(status) + " use)"));
    }
  }

  // TensorHandle{ get_handle(ir.id, ir.status), ir.shape }.
  HandleLookup<TensorHandle<H>> get_tensor_handle(const TensorIr& ir) {
    return get_handle(ir.id, ir.status).map([&ir](H&& h) { return TensorHandle<H>{std::move(h), ir.shape}; });
  }

  // Removes and returns the entry, any state (an Errored one decrements errored).
  std::optional<Entry> remove_handle(TensorId id) {
    auto node = handles_.extract(id);
    if (node.empty()) return std::nullopt;
    if (node.mapped().is_errored()) --errored_;
    return std::optional<Entry>(std::move(node.mapped()));
  }

  // Removes the entry iff ir.status == ReadWrite; returns whether an entry was removed. An
  // absent id is a no-op.
  bool free(const TensorIr& ir) {
    if (ir.status != TensorStatus::ReadWrite) return false;
    auto it = handles_.find(ir.id);
    if (it == handles_.end()) return false;
    if (it->second.is_errored()) --errored_;
    handles_.erase(it);
    return true;
  }

  std::size_t num_handles() const { return handles_.size(); }

  // Every id with an entry, (K) in increasing order so that callers are deterministic.
  std::vector<TensorId> handle_ids() const {
    std::vector<TensorId> ids;
    ids.reserve(handles_.size());
    for (const auto& kv : handles_) ids.push_back(kv.first);
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  // Carried by fork, otherwise unused (docs/spec/ir.md §10).
  std::uint64_t counter() const { return counter_; }
  void set_counter(std::uint64_t c) { counter_ = c; }

  // A new container with a shallow copy of every entry (handles cloned, Errored entries sharing
  // their roots), the errored count and the counter. Mutations of either side are invisible to
  // the other. Used by autotune: each trial runs on a fork.
  HandleContainer fork() const { return HandleContainer(*this); }

  // ---- Error model (docs/spec/ir.md §11.2) -------------------------------------------------------------

  // Number of Errored entries.
  std::size_t errored() const { return errored_; }
  // The one branch every error check starts with.
  bool has_errors() const { return errored_ != 0; }

  // Sets Errored(err) on an output the failing op was supposed to write, whatever the entry held.
  // An already Errored entry is replaced (count unchanged).
  void claim(TensorId id, TensorError err) {
    assert(err.root && "claim: a TensorError must have a root");
    auto it = handles_.try_emplace(id).first;
    if (!it->second.is_errored()) ++errored_;
    it->second.v_.template emplace<2>(std::move(err));
  }

  // Claims only the ids nobody wrote and nobody claimed (absent or NotInit); Existing and
  // Errored entries are left untouched. Returns how many were claimed.
  std::size_t claim_unwritten(std::span<const TensorId> ids, const TensorError& err) {
    assert(err.root && "claim_unwritten: a TensorError must have a root");
    std::size_t n = 0;
    for (TensorId id : ids) {
      auto it = handles_.try_emplace(id).first;
      if (!it->second.is_not_init()) continue;
      it->second.v_.template emplace<2>(err);
      ++errored_;
      ++n;
    }
    return n;
  }

  // The TensorError of an Errored entry, nullptr otherwise. With no errors it returns without a
  // look-up. The pointer is invalidated by the next mutation of this id.
  const TensorError* error_of(TensorId id) const {
    if (errored_ == 0) return nullptr;
    instrument_.on_error_lookup(id);
    auto it = handles_.find(id);
    return it == handles_.end() ? nullptr : it->second.error();
  }

  // (K) Building block of a cross-stream shared view (docs/spec/fusion.md §16.5, docs/spec/ir.md §11.3): if `src`
  // is Errored, registers `dst` as Errored with the same root and depth and returns true;
  // otherwise changes nothing and returns false (the caller aliases a handle as usual).
  bool alias_errored(TensorId src, TensorId dst) {
    const TensorError* e = error_of(src);
    if (e == nullptr) return false;
    TensorError copy = *e;
    claim(dst, std::move(copy));
    return true;
  }

  Instrument& instrument() { return instrument_; }
  const Instrument& instrument() const { return instrument_; }

 private:
  // Copying is fork(): private, so that a device's handle table is never duplicated by accident.
  HandleContainer(const HandleContainer&) = default;

  std::unordered_map<TensorId, Entry> handles_;
  std::uint64_t counter_ = 0;
  std::size_t errored_ = 0;
  [[no_unique_address]] mutable Instrument instrument_{};
};

// ---- Executor side (docs/spec/ir.md §11.3) ---------------------------------------------------------------

// A skipped op: which input carried the error, and what its outputs were claimed with.
struct OpSkip {
  TensorId input;            // the first Errored input, in input order
  TensorError error;         // downstream() of that input's error; every output carries it
  std::size_t released = 0;  // ReadWrite input entries removed as if consumed
};

// Releases every ReadWrite input of `op` as if the op had consumed it (an absent entry is a
// no-op, so inputs the executor already took with get_handle(ReadWrite) are fine). Returns how
// many entries were removed.
template <class H, class I>
std::size_t release_consumed_inputs(HandleContainer<H, I>& handles, const Operation& op) {
  std::size_t n = 0;
  for (const TensorIr& in : op.inputs())
    if (handles.free(in)) ++n;
  return n;
}

// Call before executing `op`. If an input entry is Errored, the op must not run: each output is
// claimed with downstream() of the first Errored input's error (input order), every ReadWrite
// input is released exactly as if consumed, and the skip is returned. Otherwise nullopt: run it.
// Cost with no errors in the container: one branch, no per-input look-up.
template <class H, class I>
[[nodiscard]] std::optional<OpSkip> skip_if_errored(HandleContainer<H, I>& handles, const Operation& op) {
  if (!handles.has_errors()) [[likely]]
    return std::nullopt;
  for (const TensorIr& in : op.inputs()) {
    const TensorError* e = handles.error_of(in.id);
    if (e == nullptr) continue;
    OpSkip skip{in.id, e->downstream(), 0};  // copied before the release below removes the entry
    skip.released = release_consumed_inputs(handles, op);
    for (const TensorIr& out : op.outputs()) handles.claim(out.id, skip.error);
    return skip;
  }
  return std::nullopt;
}

// Call when `op` failed: its outputs that nobody wrote or claimed are claimed with `root` at
// depth 0 (claim_unwritten: the kernel may not know which outputs it wrote). Its inputs are left
// alone — an autotune trial that fails must not consume what the next candidate reads — so the
// caller releases ReadWrite inputs as it normally would (release_consumed_inputs). Returns the
// TensorError given to the outputs.
template <class H, class I>
TensorError fail_op(HandleContainer<H, I>& handles, const Operation& op, std::shared_ptr<const ExecutionError> root) {
  TensorError err{std::move(root), 0};
  for (const TensorIr& out : op.outputs()) handles.claim_unwritten(std::span<const TensorId>(&out.id, 1), err);
  return err;
}
template <class H, class I>
TensorError fail_op(HandleContainer<H, I>& handles, const Operation& op, const Error& error, std::string context = {}) {
  return fail_op(handles, op, ExecutionError::from(error, std::move(context)));
}

// Moving a tensor to another container or device (change of client, docs/spec/ir.md §11.3): if the source
// entry is Errored, `dst_id` becomes Errored in `dst` with the same TensorError (same root, same
// depth), the source is released per src_ir.status (ReadWrite removes it), and it returns true.
// Otherwise nothing changes and it returns false: the caller transfers the data itself.
template <class H, class I, class H2, class I2>
bool migrate_errored(HandleContainer<H, I>& src, const TensorIr& src_ir, HandleContainer<H2, I2>& dst,
                     TensorId dst_id) {
  const TensorError* e = src.error_of(src_ir.id);
  if (e == nullptr) return false;
  TensorError err = *e;
  src.free(src_ir);
  dst.claim(dst_id, std::move(err));
  return true;
}

}  // namespace kiln::ir

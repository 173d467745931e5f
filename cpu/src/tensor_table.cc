// The CPU devices' sharded tensor table (kiln/cpu/tensor_table.h).
#include "kiln/cpu/tensor_table.h"

namespace kiln::cpu {

void ShardedTensorTable::put(ir::TensorId id, Entry entry) {
  Shard& s = shard(id);
  MutexLock lock(s.mu);
  if (HostTensor* h = entry.handle())
    s.table.register_handle(id, std::move(*h));
  else if (const ir::TensorError* err = entry.error())
    s.table.claim(id, *err);
}

void ShardedTensorTable::register_handle(ir::TensorId id, HostTensor tensor) {
  Shard& s = shard(id);
  MutexLock lock(s.mu);
  s.table.register_handle(id, std::move(tensor));
}

std::optional<ShardedTensorTable::Entry> ShardedTensorTable::copy_entry(ir::TensorId id) const {
  const Shard& s = shard(id);
  MutexLock lock(s.mu);
  const Entry* e = s.table.entry(id);
  if (e == nullptr) return std::nullopt;
  return *e;
}

std::optional<ShardedTensorTable::Entry> ShardedTensorTable::take(ir::TensorId id) {
  Shard& s = shard(id);
  MutexLock lock(s.mu);
  return s.table.remove_handle(id);
}

Status ShardedTensorTable::upload(HostAllocator& allocator, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                                  std::span<const std::byte> bytes) {
  Result<HostTensor> t = HostTensor::from_bytes(allocator, std::move(shape), dtype, bytes);
  if (!t.ok()) return make_error(t.error().code, "upload of " + id.to_string() + ": " + t.error().message);
  register_handle(id, std::move(t).value());
  return Status::Ok();
}

Status ShardedTensorTable::claim_error(ir::TensorId id, const ir::TensorError& error) {
  Shard& s = shard(id);
  MutexLock lock(s.mu);
  if (s.table.has_handle(id))
    return make_error(ErrorCode::InvalidHandle, "claim_error: " + id.to_string() + " has an entry already");
  s.table.claim(id, error);
  return Status::Ok();
}

Status ShardedTensorTable::update_in_place(ir::TensorId id, FunctionRef<Status(std::span<std::byte>)> update) {
  const std::optional<Entry> e = copy_entry(id);  // shares the buffer
  if (!e || e->is_not_init())
    return make_error(ErrorCode::InvalidHandle, "update of " + id.to_string() + ": the tensor has no value");
  if (const ir::TensorError* err = e->error())
    return make_error(ErrorCode::Execution, "update of " + id.to_string() + ": " + err->to_string());
  const HostTensor& t = *e->handle();
  return update(std::span<std::byte>(t.mutable_data(), static_cast<std::size_t>(t.size_bytes())));
}

Result<runtime::HostData> ShardedTensorTable::download(const ir::TensorIr& t) {
  Shard& s = shard(t.id);
  MutexLock lock(s.mu);
  const Entry* e = s.table.entry(t.id);
  if (e == nullptr || e->is_not_init())
    return make_error(ErrorCode::InvalidHandle, "read of " + t.to_string() + ": the tensor has no value on the device");
  if (const ir::TensorError* err = e->error()) {
    Error out = make_error(ErrorCode::Execution, "read of " + t.id.to_string() + ": " + err->to_string());
    s.table.free(t);
    return out;
  }
  // The copy shares the buffer, which stays alive past the unlock.
  HostTensor tensor = *e->handle();
  s.table.free(t);
  lock.unlock();
  runtime::HostData data{tensor.dtype(), tensor.shape(), {}};
  std::span<const std::byte> bytes = tensor.bytes();
  data.bytes.assign(bytes.begin(), bytes.end());
  return data;
}

bool ShardedTensorTable::is_materialized(ir::TensorId id) const {
  const Shard& s = shard(id);
  MutexLock lock(s.mu);
  const Entry* e = s.table.entry(id);
  return e != nullptr && e->is_existing();
}

std::optional<ir::TensorError> ShardedTensorTable::error_of(ir::TensorId id) const {
  const Shard& s = shard(id);
  MutexLock lock(s.mu);
  const ir::TensorError* e = s.table.error_of(id);
  return e ? std::optional<ir::TensorError>(*e) : std::nullopt;
}

void ShardedTensorTable::free(const ir::TensorIr& t) {
  if (t.status != ir::TensorStatus::ReadWrite) return;
  Shard& s = shard(t.id);
  MutexLock lock(s.mu);
  (void)s.table.free(t);
}

Status ShardedTensorTable::alias(ir::TensorId src, ir::TensorId dst) {
  std::optional<Entry> e = copy_entry(src);
  if (!e || e->is_not_init())
    return make_error(ErrorCode::InvalidHandle,
                      "shared view " + dst.to_string() + " of " + src.to_string() + ": the source has no value");
  // An Errored source gives an Errored view with the same root and depth (docs/spec/ir.md §11.3).
  put(dst, std::move(*e));
  return Status::Ok();
}

runtime::MemoryStats ShardedTensorTable::counts() const {
  runtime::MemoryStats stats;
  for (const Shard& s : shards_) {
    MutexLock lock(s.mu);
    stats.tensors += s.table.num_handles();
    stats.errored += s.table.errored();
  }
  return stats;
}

}  // namespace kiln::cpu

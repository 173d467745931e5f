// What a Session needs from the place its operations go (SessionTarget), and what it reads back
// (HostData). A light header: a client that includes runtime/session.h compiles against these,
// the IR and its builders only, never the device's internals (Asio, Boost.Lockfree, oneTBB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/fusion/stream_id.h"
#include "kiln/ir/operation.h"
#include "kiln/ir/tensor.h"

namespace kiln::runtime {

using fusion::StreamId;

// A tensor's contents on the host: dtype, shape and the bytes in row-major order.
struct HostData {
  ir::DType dtype;
  ir::Shape shape;
  std::vector<std::byte> bytes;
};

// What a Session needs from the place its operations go: the in-process Device, or the IPC
// client library's connection to a daemon (ipc/remote_target.h). Same contracts as the Device
// methods of the same names.
class SessionTarget {
 public:
  virtual ~SessionTarget() = default;
  virtual ir::TensorId new_tensor_id() = 0;
  // The first of `count` consecutive fresh ids (a Session's threads take theirs in blocks of
  // ir::kTensorIdBlock).
  virtual ir::TensorId new_tensor_ids(std::uint64_t count) = 0;
  // A new tensor with the given bytes, homed on `home`: the stream whose operations use it and
  // that drops it (docs/spec/fusion.md §16.7; a daemon keeps the home per tensor).
  [[nodiscard]] virtual Status upload(StreamId home, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                                      std::span<const std::byte> bytes) = 0;
  [[nodiscard]] virtual Status register_op(StreamId stream, ir::Operation&& op) = 0;
  // Sync: runs everything queued on `stream`; an error names the stream's first execution
  // failure since the last drain (the failed tensors keep their errors, docs/spec/ir.md §11).
  [[nodiscard]] virtual Status drain(StreamId stream) = 0;
  [[nodiscard]] virtual Result<HostData> read(StreamId home, const ir::TensorIr& t) = 0;
  // read() into the caller's buffer, which must hold exactly the tensor's bytes (an Invalid
  // error otherwise). The default reads and copies; a target that can write the caller's
  // buffer directly (the IPC client: straight from the arena) saves a buffer and a copy.
  [[nodiscard]] virtual Status read_into(StreamId home, const ir::TensorIr& t, std::span<std::byte> dst);
  [[nodiscard]] virtual Status drop(StreamId home, const ir::TensorIr& t) = 0;
  // A shared view `dst`, homed on `dst_stream`, of `src` homed on `src_stream` (docs/spec/fusion.md §16.5).
  [[nodiscard]] virtual Status share(StreamId src_stream, ir::TensorId src, StreamId dst_stream, ir::TensorId dst) = 0;
  virtual void claim_stream(StreamId stream) = 0;
};

}  // namespace kiln::runtime

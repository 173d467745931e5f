// The OperationFuser contract (docs/spec/fusion.md §13) and the Optimization a fuser finishes.
//
// Fusers only ever see RELATIVE operations (scalars are UInt placeholders, shapes are relative
// dim ids where 0 means size 1). A fuser accepts a prefix of the operations it is offered: on the
// first rejection it turns Closed and silently ignores every later operation.
//
// Thread-safety: a fuser belongs to one block of one stream's search; prototypes are cloned.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir/operation.h"

namespace kiln::fusion {

enum class FuserStatus : std::uint8_t { Open, Closed };

struct FuserProperties {
  bool ready = false;       // the accepted ops can become an executable optimization now
  std::uint64_t score = 0;  // benefit estimate; 0 = no benefit (never selected)
  friend bool operator==(const FuserProperties&, const FuserProperties&) = default;
};

// What a fuser finishes: immutable once built (it is published inside shared plans), and
// independent of concrete sizes and scalar values, so one compiled kernel serves them all.
class Optimization {
 public:
  virtual ~Optimization() = default;
  // Number of operations it covers (the accepted prefix).
  virtual std::size_t len() const = 0;
  // Shown in logs: "ElementWise", "Matmul", "Reduce", "ReduceBroadcasted", "NHWCRelayout".
  virtual std::string_view name() const = 0;
  // Highest relative dim id its kernels bake in (checked before a cached plan runs, §15.1).
  virtual std::optional<std::uint64_t> max_relative_shape_id() const { return std::nullopt; }
  // Readable description for the fusion log (the fused program); may be empty.
  virtual std::string describe() const { return {}; }
};
using OptimizationPtr = std::shared_ptr<const Optimization>;

class OperationFuser {
 public:
  virtual ~OperationFuser() = default;
  // Offer the next relative operation.
  virtual void fuse(const ir::Operation& op) = 0;
  virtual FuserStatus status() const = 0;
  virtual FuserProperties properties() const = 0;
  // Number of operations the finished optimization will cover.
  virtual std::size_t len() const = 0;
  bool is_empty() const { return len() == 0; }
  // Build the optimization from the accepted operations (only called on the chosen fuser; may
  // be called while it is still Open).
  virtual OptimizationPtr finish() = 0;
  // Back to the freshly constructed state.
  virtual void reset() = 0;
  virtual std::unique_ptr<OperationFuser> clone() const = 0;
};

using FuserList = std::vector<std::unique_ptr<OperationFuser>>;
FuserList clone_fusers(const FuserList& fusers);

}  // namespace kiln::fusion

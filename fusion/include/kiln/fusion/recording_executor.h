// RecordingExecutor: an Executor that runs nothing and records what it was asked to run, while
// keeping track of which tensors are materialized. Used by the fusion tests, property tests and
// kiln-lab; real backends implement the same interface.
//
// Thread-safety: none (one stream).
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "kiln/fusion/executor.h"

namespace kiln::fusion {

class RecordingExecutor final : public Executor {
 public:
  // keep_records = false: only track handles and count (benchmarks measure the search, not copies).
  explicit RecordingExecutor(bool keep_records = true) : keep_records_(keep_records) {}

  struct Record {
    bool fused = false;
    std::string name;                       // optimization name (fused only)
    std::vector<ir::Operation> operations;  // global ops, in the order they ran / are covered
  };

  void execute_optimization(const Optimization& opt, const ExecutionContext& ctx) override;
  void execute_operation(const ir::Operation& op) override;
  void free_tensor(const ir::TensorIr& t) override;

  // Registers a tensor whose buffer exists out of band (an uploaded input).
  void materialize(ir::TensorId id) { handles_.insert(id); }
  bool has_handle(ir::TensorId id) const { return handles_.count(id) != 0; }
  std::size_t num_handles() const { return handles_.size(); }

  const std::vector<Record>& records() const { return records_; }
  // Every executed operation in execution order (fused ones expanded).
  const std::vector<ir::Operation>& executed() const { return executed_; }
  std::size_t num_executed() const { return num_executed_; }
  void clear_records() {
    records_.clear();
    executed_.clear();
  }

 private:
  void apply(const ir::Operation& op);
  bool keep_records_;
  std::size_t num_executed_ = 0;
  std::vector<Record> records_;
  std::vector<ir::Operation> executed_;
  std::unordered_set<ir::TensorId> handles_;
};

}  // namespace kiln::fusion

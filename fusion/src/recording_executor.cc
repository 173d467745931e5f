#include "kiln/fusion/recording_executor.h"

namespace kiln::fusion {

void RecordingExecutor::apply(const ir::Operation& op) {
  for (const ir::TensorIr& t : op.inputs())
    if (t.status == ir::TensorStatus::ReadWrite) handles_.erase(t.id);
  for (const ir::TensorIr& t : op.outputs()) handles_.insert(t.id);
  ++num_executed_;
  if (keep_records_) executed_.push_back(op);
}

void RecordingExecutor::execute_optimization(const Optimization& opt, const ExecutionContext& ctx) {
  Record r{true, std::string(opt.name()), {}};
  for (std::size_t i = 0; i < opt.len(); ++i) {
    const ir::Operation& op = ctx.operation_within_optimization(i);
    if (keep_records_) r.operations.push_back(op);
    apply(op);
  }
  if (keep_records_) records_.push_back(std::move(r));
}

void RecordingExecutor::execute_operation(const ir::Operation& op) {
  if (keep_records_) records_.push_back(Record{false, {}, {op}});
  apply(op);
}

void RecordingExecutor::free_tensor(const ir::TensorIr& t) {
  if (t.status == ir::TensorStatus::ReadWrite) handles_.erase(t.id);
}

}  // namespace kiln::fusion

// Plans on disk (plan_cache.h): real programs explored through FusionStream with the default
// fusers, saved, loaded into a fresh store and run again as pure cache hits with identical
// execution; dedupe on load; and a file treated as untrusted: wrong magic / version / op table,
// checksum mismatches, every truncation, thousands of random corruptions (with and without a
// fixed-up checksum) rejected with the right reason and never a crash; unsafe directories refused
// (and reported as refused, not as empty); the autosaver writing new plans without a clean stop.
#include "kiln/fusion/plan_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/fusers.h"
#include "kiln/testing/status.h"
#include "random_program.h"

namespace kiln::fusion::testing {
namespace {

namespace fs = std::filesystem;

// ---- Programs.

// Softmax-like: reduce, broadcast back, exp, reduce, divide (Reduce / ReduceBroadcasted fusers).
Template softmax_template() {
  Template t;
  t.num_inputs = 2;  // value 0: x (n x n), value 1: a row (unused)
  t.steps = {
      Step{.kind = Step::Kind::SumDim, .a = 0},  // 2
      Step{.kind = Step::Kind::Binary,
           .op = OpKind::Numeric_Sub,
           .a = 0,
           .b = 2,
           .last_a = true,
           .last_b = true,
           .broadcast_b = true},                                                         // 3
      Step{.kind = Step::Kind::Unary, .op = OpKind::Float_Exp, .a = 3, .last_a = true},  // 4
      Step{.kind = Step::Kind::SumDim, .a = 4},                                          // 5
      Step{.kind = Step::Kind::Binary,
           .op = OpKind::Numeric_Div,
           .a = 4,
           .b = 5,
           .last_a = true,
           .last_b = true,
           .broadcast_b = true},  // 6
      Step{.kind = Step::Kind::Read, .a = 6},
  };
  return t;
}

// x @ w + bias, tanh (Matmul with an epilogue).
Template matmul_template() {
  Template t;
  t.num_inputs = 3;  // x, w, bias row
  t.steps = {
      Step{.kind = Step::Kind::Matmul, .a = 0, .b = 1},  // 3
      Step{.kind = Step::Kind::Binary,
           .op = OpKind::Numeric_Add,
           .a = 3,
           .b = 2,
           .last_a = true,
           .broadcast_b = true},                                                          // 4
      Step{.kind = Step::Kind::Unary, .op = OpKind::Float_Tanh, .a = 4, .last_a = true},  // 5
      Step{.kind = Step::Kind::Read, .a = 5},
  };
  return t;
}

// (a*b + c*2).exp() with a view: swap_dims feeding the chain.
Template elementwise_template() {
  Template t;
  t.num_inputs = 4;
  t.steps = {
      Step{.kind = Step::Kind::Binary, .op = OpKind::Numeric_Mul, .a = 0, .b = 1},                                  // 4
      Step{.kind = Step::Kind::Scalar, .op = OpKind::Numeric_MulScalar, .a = 2, .scalar = 2.0},                     // 5
      Step{.kind = Step::Kind::Binary, .op = OpKind::Numeric_Add, .a = 4, .b = 5, .last_a = true, .last_b = true},  // 6
      Step{.kind = Step::Kind::Unary, .op = OpKind::Float_Exp, .a = 6, .last_a = true},                             // 7
      Step{.kind = Step::Kind::SwapDims, .a = 7, .last_a = true},                                                   // 8
      Step{.kind = Step::Kind::Binary, .op = OpKind::Numeric_Add, .a = 8, .b = 0, .last_a = true},                  // 9
      Step{.kind = Step::Kind::Read, .a = 9},
      Step{.kind = Step::Kind::Drop, .a = 9, .last_a = true},
  };
  return t;
}

// exp, sum, scale (a Reduce program with prologue and epilogue), then the scaled sums broadcast
// back onto another input and reduced again (ReduceBroadcasted stages).
Template reduce_template() {
  Template t;
  t.num_inputs = 3;  // x, y, a row
  t.steps = {
      Step{.kind = Step::Kind::Unary, .op = OpKind::Float_Exp, .a = 0, .last_a = true},                          // 3
      Step{.kind = Step::Kind::SumDim, .a = 3, .last_a = true},                                                  // 4
      Step{.kind = Step::Kind::Scalar, .op = OpKind::Numeric_MulScalar, .a = 4, .last_a = true, .scalar = 3.0},  // 5
      Step{.kind = Step::Kind::Read, .a = 5},
      Step{.kind = Step::Kind::Unary, .op = OpKind::Float_Exp, .a = 1},  // 6
      Step{.kind = Step::Kind::SumDim, .a = 6, .last_a = true},          // 7
      Step{.kind = Step::Kind::Binary,
           .op = OpKind::Numeric_Add,
           .a = 1,
           .b = 7,
           .last_a = true,
           .last_b = true,
           .broadcast_b = true},                                 // 8
      Step{.kind = Step::Kind::SumDim, .a = 8, .last_a = true},  // 9
      Step{.kind = Step::Kind::Read, .a = 9},
  };
  return t;
}

std::vector<Template> hand_written() {
  return {softmax_template(), matmul_template(), elementwise_template(), reduce_template()};
}

std::vector<Template> all_templates(std::uint64_t seed, int num_random) {
  std::vector<Template> ts = hand_written();
  std::mt19937_64 rng(seed);
  for (int i = 0; i < num_random; ++i) ts.push_back(random_template(rng, 4 + static_cast<int>(rng() % 20)));
  return ts;
}

struct Pass {
  std::vector<RecordingExecutor::Record> records;
  std::uint64_t explorations = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t fused = 0;
};

// Runs every template once on a fresh stream each (as the property test does), against `store`,
// with tensor ids from 1 so two runs are comparable op for op.
Pass run_all(const std::vector<Template>& templates, ExecutionPlanStore& store, std::uint64_t n = 8) {
  Pass out;
  FusionLog log;
  std::uint64_t next_id = 1;
  for (const Template& t : templates) {
    RecordingExecutor executor;
    FusionStream stream(default_fusers(log, FuserOptions{}), ProcessorOptions{}, log);
    ProgramRunner runner(stream, store, executor);
    runner.run(t, next_id, n);
    stream.drain(store, executor);
    EXPECT_TRUE(check_execution(runner.registered, executor.executed()));
    out.records.insert(out.records.end(), executor.records().begin(), executor.records().end());
    out.explorations += stream.processor().stats().explorations;
    out.cache_hits += stream.processor().stats().cache_hits;
    for (const auto& r : executor.records()) out.fused += r.fused ? 1 : 0;
  }
  // Last-axis softmax-like chain (the template runner reduces axis 0 only, and ReduceBroadcasted
  // needs the last axis): exp, sum, scale, divide back, sum again.
  RecordingExecutor executor;
  FusionStream stream(default_fusers(log, FuserOptions{}), ProcessorOptions{}, log);
  auto tensor = [&](Shape shape, TensorStatus status) {
    return TensorIr{TensorId(next_id++), std::move(shape), status, ir::dtypes::f32};
  };
  auto with = [](TensorIr t, TensorStatus s) {
    t.status = s;
    return t;
  };
  std::vector<Operation> registered;
  auto submit = [&](Operation op) {
    registered.push_back(op);
    stream.register_op(std::move(op), store, executor);
  };
  const TensorIr x = tensor({n, n}, TensorStatus::ReadOnly);
  executor.materialize(x.id);
  const TensorIr e = tensor({n, n}, TensorStatus::NotInit);
  const TensorIr sum = tensor({n, 1}, TensorStatus::NotInit);
  const TensorIr scaled = tensor({n, 1}, TensorStatus::NotInit);
  const TensorIr ratio = tensor({n, n}, TensorStatus::NotInit);
  const TensorIr total = tensor({n, 1}, TensorStatus::NotInit);
  const auto f32 = ir::dtypes::f32;
  submit(Operation{OpKind::Float_Exp, Family::Float, f32, 1, {x, e}, {}, {}, {}, {}});
  submit(Operation{OpKind::Numeric_SumDim,
                   Family::NumericFloat,
                   f32,
                   1,
                   {with(e, TensorStatus::ReadOnly), sum},
                   {},
                   {},
                   {1, 1},
                   {}});
  submit(Operation{OpKind::Numeric_MulScalar,
                   Family::NumericFloat,
                   f32,
                   1,
                   {with(sum, TensorStatus::ReadWrite), scaled},
                   {ir::ScalarIr::Float(2.0)},
                   {},
                   {},
                   {}});
  submit(Operation{OpKind::Numeric_Div,
                   Family::NumericFloat,
                   f32,
                   2,
                   {with(e, TensorStatus::ReadWrite), with(scaled, TensorStatus::ReadWrite), ratio},
                   {},
                   {},
                   {},
                   {}});
  submit(Operation{OpKind::Numeric_SumDim,
                   Family::NumericFloat,
                   f32,
                   1,
                   {with(ratio, TensorStatus::ReadWrite), total},
                   {},
                   {},
                   {1, 1},
                   {}});
  stream.drain(store, executor);
  EXPECT_TRUE(check_execution(registered, executor.executed()));
  out.records.insert(out.records.end(), executor.records().begin(), executor.records().end());
  out.explorations += stream.processor().stats().explorations;
  out.cache_hits += stream.processor().stats().cache_hits;
  for (const auto& r : executor.records()) out.fused += r.fused ? 1 : 0;
  return out;
}

::testing::AssertionResult same_records(const Pass& a, const Pass& b) {
  if (a.records.size() != b.records.size())
    return ::testing::AssertionFailure() << a.records.size() << " vs " << b.records.size() << " executions";
  for (std::size_t i = 0; i < a.records.size(); ++i) {
    const auto& x = a.records[i];
    const auto& y = b.records[i];
    if (x.fused != y.fused || x.name != y.name || x.operations != y.operations)
      return ::testing::AssertionFailure() << "execution " << i << " differs: " << (x.fused ? x.name : "unfused")
                                           << " vs " << (y.fused ? y.name : "unfused");
  }
  return ::testing::AssertionSuccess();
}

// Deep equality of strategies: programs compared with FusedProgram::== (every field), not only
// through describe() as ExecutionStrategy::== does.
::testing::AssertionResult same_strategy(const ExecutionStrategy& a, const ExecutionStrategy& b) {
  if (!(a == b)) return ::testing::AssertionFailure() << a.to_string() << " vs " << b.to_string();
  if (a.kind() == ExecutionStrategy::Kind::Optimization) {
    const auto* fa = dynamic_cast<const FusedOptimization*>(a.opt().get());
    const auto* fb = dynamic_cast<const FusedOptimization*>(b.opt().get());
    if (!fa || !fb) return ::testing::AssertionFailure() << "not a FusedOptimization";
    if (!(fa->program() == fb->program()) || fa->len() != fb->len() ||
        fa->program().structural_hash() != fb->program().structural_hash())
      return ::testing::AssertionFailure() << "programs differ:\n" << fa->describe() << "\nvs\n" << fb->describe();
  }
  for (std::size_t i = 0; i < a.children().size(); ++i)
    if (auto r = same_strategy(a.children()[i], b.children()[i]); !r) return r;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_stores(const ExecutionPlanStore& a, const ExecutionPlanStore& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " plans";
  for (PlanId id = 0; id < a.size(); ++id) {
    if (a.plan(id)->operations != b.plan(id)->operations)
      return ::testing::AssertionFailure() << "plan " << id << ": operations differ";
    if (!(a.plan(id)->optimization == b.plan(id)->optimization))
      return ::testing::AssertionFailure() << "plan " << id << ": optimization differs";
    if (auto r = same_strategy(a.plan(id)->optimization.strategy, b.plan(id)->optimization.strategy); !r)
      return ::testing::AssertionFailure() << "plan " << id << ": " << r.message();
    if (*a.triggers(id) != *b.triggers(id))
      return ::testing::AssertionFailure() << "plan " << id << ": triggers differ";
  }
  return ::testing::AssertionSuccess();
}

// A store at its fixed point for `templates`: runs them until a whole pass explores nothing.
void explore_until_stable(const std::vector<Template>& templates, ExecutionPlanStore& store) {
  for (int pass = 0; pass < 6; ++pass)
    if (run_all(templates, store).explorations == 0) return;
  ADD_FAILURE() << "the store did not reach a fixed point in 6 passes";
}

// ---- Files.

// A private temporary directory, removed (whatever its mode) at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kiln-plan-cache-test.XXXXXX").string();
    const char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<std::uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Header layout (plan_cache.h): 13 fixed bytes, the version string, payload length, checksum.
std::size_t payload_offset(const std::vector<std::uint8_t>& file) { return 13 + file[12] + 16; }
std::size_t checksum_offset(const std::vector<std::uint8_t>& file) { return 13 + file[12] + 8; }

// 64-bit FNV-1a, written independently of the implementation.
std::uint64_t fnv1a(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
// Recomputes the payload length and checksum after the payload was changed on purpose, so the
// decoder proper (not only the checksum) sees the corruption.
void fix_header(std::vector<std::uint8_t>& file) {
  const std::size_t off = payload_offset(file);
  const std::uint64_t len = file.size() - off;
  const std::uint64_t sum = fnv1a(file.data() + off, file.size() - off);
  for (int i = 0; i < 8; ++i) {
    file[checksum_offset(file) - 8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(len >> (8 * i));
    file[checksum_offset(file) + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(sum >> (8 * i));
  }
}

// A small store from the three hand-written programs (a few KiB: every truncation is tested).
void small_store(ExecutionPlanStore& store) { explore_until_stable(hand_written(), store); }

// =============================================================================================

TEST(PlanCache, SavedPlansAreCacheHitsInTheNextRun) {
  const auto templates = all_templates(42, 60);
  ExecutionPlanStore first;
  const Pass exploring = run_all(templates, first);
  EXPECT_GT(exploring.explorations, 0u);
  explore_until_stable(templates, first);
  const Pass warm = run_all(templates, first);  // the reference: the same programs on a warm store
  ASSERT_EQ(warm.explorations, 0u);

  TempDir dir;
  auto saved = save_plan_cache(first, dir.path());
  ASSERT_TRUE(saved.ok()) << saved.error().to_string();
  EXPECT_EQ(saved->saved, first.size());
  EXPECT_EQ(saved->skipped, 0u);
  EXPECT_EQ(saved->file, dir.path() / "plans.kpc");

  // The next daemon run: a fresh store, loaded from disk.
  ExecutionPlanStore second;
  auto capture = std::make_shared<LogCapture>();
  const PlanCacheLoadReport report =
      load_plan_cache(second, dir.path(), FusionLog::to_capture(LogLevel::Basic, capture));
  ASSERT_TRUE(report.ok()) << report.reason;
  EXPECT_TRUE(report.found);
  EXPECT_EQ(report.loaded, first.size());
  EXPECT_EQ(report.merged, 0u);
  ASSERT_EQ(capture->lines().size(), 1u);
  EXPECT_NE(capture->lines()[0].find("[plan-cache] loaded"), std::string::npos);
  EXPECT_TRUE(same_stores(first, second));

  const Pass replay = run_all(templates, second);
  EXPECT_EQ(replay.explorations, 0u) << "every segment hits a loaded plan";
  EXPECT_EQ(replay.cache_hits, warm.cache_hits);
  EXPECT_GT(replay.cache_hits, 0u);
  EXPECT_GT(replay.fused, 0u);
  EXPECT_TRUE(same_records(warm, replay)) << "same strategies, same executions";
  EXPECT_EQ(second.size(), first.size()) << "no plan added by the replay";

  // Every fused program kind the default fusers produce for these programs went through the file.
  std::set<std::string> names;
  for (const auto& r : replay.records)
    if (r.fused) names.insert(r.name);
  EXPECT_TRUE(names.count("ElementWise")) << ::testing::PrintToString(names);
  EXPECT_TRUE(names.count("Matmul")) << ::testing::PrintToString(names);
  EXPECT_TRUE(names.count("Reduce")) << ::testing::PrintToString(names);
  // (ReduceBroadcasted does not win on these programs: ReduceBroadcastedProgramRoundTrips.)
}

TEST(PlanCache, EncodingIsCanonical) {
  ExecutionPlanStore store;
  explore_until_stable(all_templates(7, 30), store);
  const SerializedPlans s = serialize_plans(store);
  ASSERT_EQ(s.saved, store.size());
  DecodedPlans d = decode_plans(s.bytes, PlanStoreOptions{}.search_options);
  ASSERT_TRUE(d.ok()) << d.reason;
  ASSERT_EQ(d.plans.size(), store.size());
  ExecutionPlanStore copy;
  for (PlanRecord& rec : d.plans) {
    KILN_EXPECT_OK(validate_plan(rec.plan, rec.triggers));
    auto added = copy.add(std::move(rec.plan), rec.triggers.front());
    for (std::size_t i = 1; i < rec.triggers.size(); ++i) copy.add_trigger(added.id, rec.triggers[i]);
  }
  EXPECT_TRUE(same_stores(store, copy));
  EXPECT_EQ(serialize_plans(copy).bytes, s.bytes) << "re-encoding a decoded file gives the same bytes";
  for (PlanId id = 0; id < store.size(); ++id)
    EXPECT_TRUE(validate_plan(*store.plan(id), *store.triggers(id)).ok()) << "every live plan validates";
}

// A ReduceBroadcasted program (stages, each a Reduce program with fallbacks) from the fuser
// itself, on the spec's workflow 1 (fusers_test.cc), through the file and back.
TEST(PlanCache, ReduceBroadcastedProgramRoundTrips) {
  const auto f32 = ir::dtypes::f32;
  auto T = [](std::uint64_t id, Shape shape, TensorStatus s) {
    return TensorIr{TensorId(id), std::move(shape), s, ir::dtypes::f32};
  };
  const auto NI = TensorStatus::NotInit, RW = TensorStatus::ReadWrite;
  std::vector<Operation> ops = {
      Operation{OpKind::Base_Ones, Family::BaseFloat, f32, 0, {T(0, {1, 2}, NI)}, {}, {}, {}, {}},
      Operation{OpKind::Numeric_SumDim,
                Family::NumericFloat,
                f32,
                1,
                {T(0, {1, 2}, RW), T(1, {1, 0}, NI)},
                {},
                {},
                {1, 1},
                {}},
      Operation{OpKind::Numeric_Add,
                Family::NumericFloat,
                f32,
                2,
                {T(1, {1, 0}, RW), T(2, {1, 0}, RW), T(3, {1, 0}, NI)},
                {},
                {},
                {},
                {}},
      Operation{OpKind::Numeric_Add,
                Family::NumericFloat,
                f32,
                2,
                {T(3, {1, 0}, RW), T(4, {1, 2}, RW), T(5, {1, 2}, NI)},
                {},
                {},
                {},
                {}},
      Operation{OpKind::Numeric_SumDim,
                Family::NumericFloat,
                f32,
                1,
                {T(5, {1, 2}, RW), T(6, {1, 0}, NI)},
                {},
                {},
                {1, 1},
                {}},
  };
  ReduceBroadcastedFuser fuser(64);
  for (const Operation& op : ops) fuser.fuse(op);
  ASSERT_TRUE(fuser.properties().ready);
  const OptimizationPtr opt = fuser.finish();
  ASSERT_EQ(opt->name(), "ReduceBroadcasted");
  ASSERT_EQ(opt->len(), 5u);
  const Ordering all{0, 1, 2, 3, 4};
  ExecutionPlanStore store;
  store.add(
      ExecutionPlan{ops, BlockOptimization(ExecutionStrategy::optimization(opt, all, fuser.properties().score), all)},
      ExecutionTrigger::on_sync());
  store.add_trigger(0, ExecutionTrigger::on_operations({ops[0]}));
  KILN_ASSERT_OK(validate_plan(*store.plan(0), *store.triggers(0)));
  ExecutionPlanStore copy;
  const auto r = load_plans(serialize_plans(store).bytes, copy);
  ASSERT_TRUE(r.ok()) << r.reason;
  EXPECT_EQ(r.loaded, 1u);
  EXPECT_TRUE(same_stores(store, copy));
  const auto& program = dynamic_cast<const FusedOptimization&>(*copy.plan(0)->optimization.strategy.opt()).program();
  EXPECT_EQ(program.stages.size(), 2u);
}

TEST(PlanCache, LoadDeduplicatesAgainstPlansAlreadyThere) {
  const auto templates = all_templates(3, 20);
  ExecutionPlanStore full;
  explore_until_stable(templates, full);
  const SerializedPlans s = serialize_plans(full);

  // A store that already explored some of the programs (the same sequences, found again).
  ExecutionPlanStore partial;
  explore_until_stable({templates.begin(), templates.begin() + 5}, partial);
  const std::size_t before = partial.size();
  ASSERT_GT(before, 0u);
  const PlanCacheLoadReport r = load_plans(s.bytes, partial);
  ASSERT_TRUE(r.ok()) << r.reason;
  EXPECT_EQ(r.loaded + r.merged, full.size());
  EXPECT_GT(r.merged, 0u);
  EXPECT_EQ(partial.size(), before + r.loaded);
  // Every plan of the file is findable by its operations, with at least the file's triggers.
  for (PlanId id = 0; id < full.size(); ++id) {
    const auto& ops = full.plan(id)->operations;
    bool found = false;
    for (PlanId other : partial.find_starting_with(ops.front())) {
      if (partial.plan(other)->operations != ops) continue;
      found = true;
      for (const auto& t : *full.triggers(id)) {
        const auto mine = partial.triggers(other);
        EXPECT_NE(std::find(mine->begin(), mine->end(), t), mine->end()) << "trigger merged";
      }
    }
    EXPECT_TRUE(found) << "plan " << id;
  }
  // Loading the same file again adds nothing.
  const std::size_t after = partial.size();
  const PlanCacheLoadReport again = load_plans(s.bytes, partial);
  KILN_ASSERT_OK(again);
  EXPECT_EQ(again.loaded, 0u);
  EXPECT_EQ(again.merged, full.size());
  EXPECT_EQ(partial.size(), after);
  EXPECT_EQ(run_all(templates, partial).explorations, 0u);
}

// An optimization kind the format cannot rebuild.
class OpaqueOptimization final : public Optimization {
 public:
  std::size_t len() const override { return 1; }
  std::string_view name() const override { return "Opaque"; }
};

TEST(PlanCache, PlansWithUnserializableOptimizationsAreSkipped) {
  ExecutionPlanStore store;
  small_store(store);
  const std::size_t real = store.size();
  // Copy a real plan's first op and give it an optimization of an unknown kind.
  ExecutionPlan opaque;
  opaque.operations = {store.plan(0)->operations.front()};
  opaque.operations.front().tensors.front().id = ir::TensorId(999);  // distinct from plan 0
  opaque.optimization = BlockOptimization(
      ExecutionStrategy::optimization(std::make_shared<OpaqueOptimization>(), Ordering{0}, 5), Ordering{0});
  ASSERT_TRUE(store.add(std::move(opaque), ExecutionTrigger::always()).inserted);

  TempDir dir;
  auto saved = save_plan_cache(store, dir.path());
  ASSERT_TRUE(saved.ok()) << saved.error().to_string();
  EXPECT_EQ(saved->saved, real);
  EXPECT_EQ(saved->skipped, 1u);
  ExecutionPlanStore fresh;
  const auto r = load_plan_cache(fresh, dir.path(), FusionLog{});
  ASSERT_TRUE(r.ok()) << r.reason;
  EXPECT_EQ(r.loaded, real);
  EXPECT_FALSE(validate_plan(*store.plan(real), *store.triggers(real)).ok());
}

TEST(PlanCache, EmptyStoreRoundTrips) {
  ExecutionPlanStore empty;
  const SerializedPlans s = serialize_plans(empty);
  EXPECT_EQ(s.saved, 0u);
  ExecutionPlanStore other;
  const auto r = load_plans(s.bytes, other);
  ASSERT_TRUE(r.ok()) << r.reason;
  EXPECT_EQ(r.loaded, 0u);
}

// ---- Untrusted bytes.

TEST(PlanCache, HeaderProblemsHaveTheirReason) {
  ExecutionPlanStore store;
  small_store(store);
  const std::vector<std::uint8_t> good = serialize_plans(store).bytes;
  KILN_ASSERT_OK(decode_plans(good, PlanStoreOptions{}.search_options));
  auto check = [&](std::vector<std::uint8_t> bytes, PlanCacheProblem want, const char* what) {
    ExecutionPlanStore target;
    const auto r = load_plans(bytes, target);
    EXPECT_EQ(r.problem, want) << what << ": " << plan_cache_problem_name(r.problem) << " — " << r.reason;
    EXPECT_FALSE(r.reason.empty()) << what;
    EXPECT_EQ(target.size(), 0u) << what << ": nothing reaches the store";
  };
  auto flip = [&](std::size_t at) {
    auto b = good;
    b[at] ^= 0x40;
    return b;
  };
  check(flip(0), PlanCacheProblem::BadMagic, "magic");
  check({'h', 'e', 'l', 'l', 'o'}, PlanCacheProblem::BadMagic, "text");
  check(flip(4), PlanCacheProblem::FormatVersion, "format version");
  check(flip(6), PlanCacheProblem::SearchOptions, "search options");
  check(flip(8), PlanCacheProblem::OpTable, "op table fingerprint");
  check(flip(13), PlanCacheProblem::KilnVersion, "kiln version string");
  check(flip(checksum_offset(good)), PlanCacheProblem::Checksum, "checksum field");
  check(flip(payload_offset(good) + 3), PlanCacheProblem::Checksum, "payload byte");
  check(flip(good.size() - 1), PlanCacheProblem::Checksum, "last byte");
  auto longer = good;
  longer.push_back(0);
  check(longer, PlanCacheProblem::Malformed, "trailing byte");

  // Another kiln version wrote it (or reads it).
  check(serialize_plans(store, "0.0.0-other").bytes, PlanCacheProblem::KilnVersion, "older kiln");
  EXPECT_EQ(decode_plans(good, PlanStoreOptions{}.search_options, "9.9.9").problem, PlanCacheProblem::KilnVersion);
  EXPECT_NE(decode_plans(good, PlanStoreOptions{}.search_options, "9.9.9").reason.find("9.9.9"), std::string::npos);
}

// Plans found with the row fuser are not what a search without it would find (and the reverse):
// a store loads only a file its own search wrote.
TEST(PlanCache, AFileFromAnotherSearchIsIgnored) {
  ExecutionPlanStore with_row(PlanStoreOptions{.search_options = kSearchRowFuser});
  small_store(with_row);
  const std::vector<std::uint8_t> bytes = serialize_plans(with_row).bytes;
  ExecutionPlanStore without_row;  // default: Burn's fusers
  const auto r = load_plans(bytes, without_row);
  EXPECT_EQ(r.problem, PlanCacheProblem::SearchOptions);
  EXPECT_NE(r.reason.find("row fuser on"), std::string::npos) << r.reason;
  EXPECT_EQ(without_row.size(), 0u);

  ExecutionPlanStore same(PlanStoreOptions{.search_options = kSearchRowFuser});
  const auto ok = load_plans(bytes, same);
  EXPECT_TRUE(ok.ok()) << ok.reason;
  EXPECT_EQ(same.size(), with_row.size());
  EXPECT_EQ(search_options_of(FuserOptions{}), 0u);
  EXPECT_EQ(search_options_of(FuserOptions{.row_fuser = true}), kSearchRowFuser);
}

TEST(PlanCache, EveryTruncationIsRejectedAsTruncated) {
  ExecutionPlanStore store;
  small_store(store);
  const std::vector<std::uint8_t> good = serialize_plans(store).bytes;
  ASSERT_LT(good.size(), 64u * 1024) << "small enough to truncate at every length";
  for (std::size_t len = 0; len < good.size(); ++len) {
    const auto r = decode_plans(std::span(good).first(len), PlanStoreOptions{}.search_options);
    ASSERT_EQ(r.problem, PlanCacheProblem::Truncated) << "length " << len << ": " << r.reason;
    ASSERT_TRUE(r.plans.empty());
  }
}

TEST(PlanCache, RandomByteFlipsAreAlwaysDetected) {
  ExecutionPlanStore store;
  small_store(store);
  const std::vector<std::uint8_t> good = serialize_plans(store).bytes;
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 4000; ++iter) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    bool changed = false;
    for (int f = 0; f < flips; ++f) {
      const std::size_t at = rng() % bytes.size();
      const auto mask = static_cast<std::uint8_t>(1 + rng() % 255);
      bytes[at] ^= mask;
    }
    changed = bytes != good;
    if (!changed) continue;
    ExecutionPlanStore target;
    const auto r = load_plans(bytes, target);
    // Header fields are each checked and the payload is checksummed: nothing changed goes unseen.
    ASSERT_FALSE(r.ok()) << "iteration " << iter;
    ASSERT_EQ(target.size(), 0u);
  }
}

// The checksum fixed up after each change: the decoder itself must reject (or accept a still
// valid file) without crashing, overreading or allocating wildly. Pass under ASan/UBSan.
TEST(PlanCache, CorruptPayloadWithValidChecksumNeverCrashes) {
  ExecutionPlanStore store;
  small_store(store);
  const std::vector<std::uint8_t> good = serialize_plans(store).bytes;
  const std::size_t off = payload_offset(good);
  std::mt19937_64 rng(99);
  std::size_t rejected = 0, accepted = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    auto bytes = good;
    const int mode = static_cast<int>(rng() % 4);
    if (mode == 0) {  // flip bytes
      const int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f)
        bytes[off + rng() % (bytes.size() - off)] ^= static_cast<std::uint8_t>(1 + rng() % 255);
    } else if (mode == 1) {  // a random byte value (large varints, enums out of range)
      bytes[off + rng() % (bytes.size() - off)] = static_cast<std::uint8_t>(rng());
    } else if (mode == 2) {  // truncate the payload
      bytes.resize(off + rng() % (bytes.size() - off));
    } else {  // insert or delete a byte
      const std::size_t at = off + rng() % (bytes.size() - off);
      if (rng() % 2)
        bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint8_t>(rng()));
      else
        bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(at));
    }
    fix_header(bytes);
    ExecutionPlanStore target;
    const auto r = load_plans(bytes, target);
    if (r.ok()) {
      // A change the format cannot tell from a real plan (a tensor id, a score): still valid.
      ++accepted;
      for (PlanId id = 0; id < target.size(); ++id)
        KILN_ASSERT_OK(validate_plan(*target.plan(id), *target.triggers(id)));
    } else {
      ++rejected;
      ASSERT_EQ(r.problem, PlanCacheProblem::Malformed) << r.reason;
      ASSERT_EQ(target.size(), 0u);
    }
  }
  EXPECT_GT(rejected, 3000u);
  RecordProperty("accepted", static_cast<int>(accepted));
}

// ---- Directories.

TEST(PlanCacheDir, MissingDirectoryOrFileLoadsNothing) {
  TempDir dir;
  ExecutionPlanStore store;
  auto r = load_plan_cache(store, dir.path() / "absent", FusionLog{});
  KILN_EXPECT_OK(r);
  EXPECT_FALSE(r.found);
  r = load_plan_cache(store, dir.path(), FusionLog{});
  KILN_EXPECT_OK(r);
  EXPECT_FALSE(r.found);
  EXPECT_EQ(r.loaded, 0u);
}

TEST(PlanCacheDir, SaveCreatesAPrivateDirectoryAndLeavesNoTemporaryFile) {
  TempDir dir;
  ExecutionPlanStore store;
  small_store(store);
  const fs::path cache = dir.path() / "a" / "b" / "plans";
  auto saved = save_plan_cache(store, cache);
  ASSERT_TRUE(saved.ok()) << saved.error().to_string();
  struct stat st {};
  ASSERT_EQ(::stat(cache.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((cache / "plans.kpc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), saved->bytes);
  // Saving again replaces the file atomically; nothing else is left in the directory.
  KILN_ASSERT_OK(save_plan_cache(store, cache));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(cache)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"plans.kpc"});
}

TEST(PlanCacheDir, UnsafeDirectoriesAreRefused) {
  ExecutionPlanStore store;
  small_store(store);
  for (mode_t mode : {0770, 0707, 0777, 0720}) {
    TempDir dir;
    KILN_ASSERT_OK(save_plan_cache(store, dir.path()));
    ASSERT_EQ(::chmod(dir.path().c_str(), mode), 0);
    auto saved = save_plan_cache(store, dir.path());
    ASSERT_FALSE(saved.ok()) << std::oct << mode;
    EXPECT_EQ(saved.error().code, ErrorCode::Config);
    EXPECT_NE(saved.error().message.find("writable by group or others"), std::string::npos) << saved.error().message;
    ExecutionPlanStore fresh;
    const auto r = load_plan_cache(fresh, dir.path(), FusionLog{});
    EXPECT_EQ(r.problem, PlanCacheProblem::UnsafeDirectory) << r.reason;
    EXPECT_EQ(fresh.size(), 0u);
  }
  // Owned by another user (only root can arrange that).
  if (::geteuid() == 0) {
    TempDir dir;
    KILN_ASSERT_OK(save_plan_cache(store, dir.path()));
    ASSERT_EQ(::chown(dir.path().c_str(), 65534, 65534), 0);
    auto saved = save_plan_cache(store, dir.path());
    ASSERT_FALSE(saved.ok());
    EXPECT_NE(saved.error().message.find("owned by uid 65534"), std::string::npos) << saved.error().message;
    ExecutionPlanStore fresh;
    EXPECT_EQ(load_plan_cache(fresh, dir.path(), FusionLog{}).problem, PlanCacheProblem::UnsafeDirectory);
    ASSERT_EQ(::chown(dir.path().c_str(), 0, 0), 0);
  }
  // Not a directory.
  TempDir dir;
  write_file(dir.path() / "file", {1, 2, 3});
  EXPECT_FALSE(save_plan_cache(store, dir.path() / "file").ok());
}

// kilnd tells "nothing saved yet" from "the directory was refused" by the report alone.
TEST(PlanCacheDir, ReportTellsARefusedDirectoryFromNothingSaved) {
  ExecutionPlanStore store;
  small_store(store);
  TempDir dir;
  ExecutionPlanStore fresh;

  auto r = load_plan_cache(fresh, dir.path() / "absent", FusionLog{});
  EXPECT_TRUE(r.nothing_saved());
  EXPECT_FALSE(r.directory_refused);
  r = load_plan_cache(fresh, dir.path(), FusionLog{});  // the directory, but no file yet
  EXPECT_TRUE(r.nothing_saved());
  EXPECT_FALSE(r.directory_refused);

  const fs::path cache = dir.path() / "cache";
  KILN_ASSERT_OK(save_plan_cache(store, cache));
  r = load_plan_cache(fresh, cache, FusionLog{});
  ASSERT_TRUE(r.ok()) << r.reason;
  EXPECT_TRUE(r.found);
  EXPECT_FALSE(r.nothing_saved());
  EXPECT_FALSE(r.directory_refused);

  // Unsafe, with a good file in it: refused, and not "nothing saved".
  ASSERT_EQ(::chmod(cache.c_str(), 0770), 0);
  auto capture = std::make_shared<LogCapture>();
  ExecutionPlanStore other;
  r = load_plan_cache(other, cache, FusionLog::to_capture(LogLevel::Basic, capture));
  EXPECT_TRUE(r.directory_refused);
  EXPECT_FALSE(r.nothing_saved());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.problem, PlanCacheProblem::UnsafeDirectory) << r.reason;
  EXPECT_EQ(other.size(), 0u);
  ASSERT_EQ(capture->lines().size(), 1u) << "one warning, from load_plan_cache";
  EXPECT_NE(capture->lines()[0].find("unsafe directory"), std::string::npos) << capture->lines()[0];
  ASSERT_EQ(::chmod(cache.c_str(), 0700), 0);

  // A directory that cannot even be examined (a path through a regular file): refused too.
  write_file(dir.path() / "file", {1, 2, 3});
  r = load_plan_cache(other, dir.path() / "file" / "cache", FusionLog{});
  EXPECT_TRUE(r.directory_refused);
  EXPECT_FALSE(r.nothing_saved());
  EXPECT_EQ(r.problem, PlanCacheProblem::Unreadable) << r.reason;

  // A bad file in a good directory: found and ignored, the directory itself accepted.
  write_file(cache / "plans.kpc", {'K', 'P', 'L'});
  r = load_plan_cache(other, cache, FusionLog{});
  EXPECT_TRUE(r.found);
  EXPECT_FALSE(r.directory_refused);
  EXPECT_FALSE(r.nothing_saved());
  EXPECT_EQ(r.problem, PlanCacheProblem::Truncated);
}

TEST(PlanCacheDir, CorruptFileIsIgnoredWithAWarning) {
  TempDir dir;
  ExecutionPlanStore store;
  small_store(store);
  KILN_ASSERT_OK(save_plan_cache(store, dir.path()));
  const fs::path file = dir.path() / "plans.kpc";
  auto bytes = read_file(file);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file(file, bytes);

  auto capture = std::make_shared<LogCapture>();
  ExecutionPlanStore fresh;
  const auto r = load_plan_cache(fresh, dir.path(), FusionLog::to_capture(LogLevel::Basic, capture));
  EXPECT_TRUE(r.found);
  EXPECT_EQ(r.problem, PlanCacheProblem::Checksum);
  EXPECT_EQ(fresh.size(), 0u);
  ASSERT_EQ(capture->lines().size(), 1u);
  EXPECT_NE(capture->lines()[0].find("[plan-cache] ignoring"), std::string::npos) << capture->lines()[0];
  EXPECT_NE(capture->lines()[0].find("checksum"), std::string::npos) << capture->lines()[0];

  // Truncated on disk, and a directory where the file should be.
  write_file(file, {'K', 'P', 'L'});
  EXPECT_EQ(load_plan_cache(fresh, dir.path(), FusionLog{}).problem, PlanCacheProblem::Truncated);
  fs::remove(file);
  fs::create_directory(file);
  EXPECT_EQ(load_plan_cache(fresh, dir.path(), FusionLog{}).problem, PlanCacheProblem::Unreadable);
  // A symlink is not followed.
  fs::remove(file);
  TempDir other;
  KILN_ASSERT_OK(save_plan_cache(store, other.path()));
  fs::create_symlink(other.path() / "plans.kpc", file);
  EXPECT_EQ(load_plan_cache(fresh, dir.path(), FusionLog{}).problem, PlanCacheProblem::Unreadable);
  EXPECT_EQ(fresh.size(), 0u);
}

TEST(PlanCacheDir, TooLargeFileIsNotRead) {
  TempDir dir;
  ::chmod(dir.path().c_str(), 0700);
  const fs::path file = dir.path() / "plans.kpc";
  {
    std::ofstream out(file, std::ios::binary);
    out << "KPLN";
  }
  fs::resize_file(file, kMaxPlanCacheBytes + 1);  // sparse: no disk used
  ExecutionPlanStore fresh;
  EXPECT_EQ(load_plan_cache(fresh, dir.path(), FusionLog{}).problem, PlanCacheProblem::TooLarge);
}

// ---- Autosaver.

using namespace std::chrono_literals;

// Real plans to publish into the stores the autosaver watches, explored once for every test.
const ExecutionPlanStore& learned() {
  static ExecutionPlanStore store;
  static const bool explored = (small_store(store), true);
  (void)explored;
  return store;
}

// Publishes learned plan `id` into `store`, as a stream that explored it would.
std::vector<Operation> publish(ExecutionPlanStore& store, PlanId id) {
  const PlanPin plan = learned().plan(id);
  EXPECT_TRUE(store.add(*plan, learned().triggers(id)->front()).inserted);
  return plan->operations;
}

// A trigger no plan has yet: each one is a change of the store.
ExecutionTrigger fresh_trigger(std::uint64_t k) {
  Operation op = learned().plan(0)->operations.front();
  op.tensors.front().id = ir::TensorId(100000 + k);
  return ExecutionTrigger::on_operations({op});
}

// Waits for `done` with a deadline far above any expected delay: the tests check what the saver
// does, never how fast a loaded machine lets it.
template <class Done>
bool eventually(Done done, std::chrono::seconds limit = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The plan with these operations as the next daemon run would see it (nullopt: not on disk).
std::optional<TriggerList> on_disk(const fs::path& dir, const std::vector<Operation>& ops) {
  ExecutionPlanStore fresh;
  if (!load_plan_cache(fresh, dir, FusionLog{}).found) return std::nullopt;
  for (PlanId id : fresh.find_starting_with(ops.front()))
    if (fresh.plan(id)->operations == ops) return *fresh.triggers(id);
  return std::nullopt;
}

// Counts on_save calls and keeps the last error, for the tests to read from their own thread.
struct SaveLog {
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::mutex mu;
  std::string last_error;  // guarded by mu
  std::function<void(const Result<PlanCacheSaveReport>&)> callback() {
    return [this](const Result<PlanCacheSaveReport>& r) {
      if (r.ok()) {
        ok.fetch_add(1);
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      last_error = r.error().to_string();
      failed.fetch_add(1);
    };
  }
};

TEST(PlanCacheAutosaver, NewPlanIsOnDiskWithoutStop) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  ExecutionPlanStore live;
  SaveLog log;
  PlanCacheAutosaver saver(live, cache, {.debounce = 50ms, .poll_interval = 10ms, .on_save = log.callback()});
  const std::vector<Operation> ops = publish(live, 0);
  ASSERT_TRUE(eventually([&] { return on_disk(cache, ops).has_value(); })) << "never saved";
  // Not stopped: the file was written by the background saver, as a SIGKILL would find it.
  ASSERT_TRUE(eventually([&] { return log.ok.load() >= 1; }));
  const PlanCacheAutosaverStats st = saver.stats();
  EXPECT_GE(st.saves, 1u);
  EXPECT_EQ(st.failures, 0u);
  EXPECT_EQ(st.last_error, "");
  EXPECT_EQ(st.saved_generation, live.generation());
  EXPECT_EQ(log.failed.load(), 0);

  // A second plan later: saved too, next to the first.
  const std::vector<Operation> more = publish(live, 1);
  ASSERT_TRUE(eventually([&] { return on_disk(cache, more).has_value(); }));
  EXPECT_TRUE(on_disk(cache, ops).has_value());
}

TEST(PlanCacheAutosaver, ConstantlyChangingStoreIsStillSaved) {
  TempDir dir;
  ExecutionPlanStore live;
  const std::vector<Operation> ops = publish(live, 0);
  const std::uint64_t before = live.generation();
  // The store never stays quiet for an hour: only max_delay can start a save.
  PlanCacheAutosaver saver(live, dir.path(), {.debounce = 1h, .max_delay = 50ms, .poll_interval = 5ms});
  std::atomic<bool> writing{true};
  std::thread writer([&] {
    for (std::uint64_t k = 0; writing.load(); ++k) {
      live.add_trigger(0, fresh_trigger(k));
      std::this_thread::sleep_for(1ms);
    }
  });
  // Two saves while the changes go on: the saver keeps saving, not only once.
  const bool saved = eventually([&] { return saver.stats().saves >= 2; });
  writing.store(false);
  writer.join();
  ASSERT_TRUE(saved) << "never saved while the store kept changing";
  const PlanCacheAutosaverStats st = saver.stats();
  EXPECT_GT(st.saved_generation, before);
  EXPECT_EQ(st.failures, 0u);
  const auto triggers = on_disk(dir.path(), ops);
  ASSERT_TRUE(triggers.has_value());
  EXPECT_GT(triggers->size(), 1u) << "changes made while the saver ran are in the file";
}

TEST(PlanCacheAutosaver, StopWritesTheLastChange) {
  TempDir dir;
  ExecutionPlanStore live;
  SaveLog log;
  std::vector<Operation> ops;
  {
    // Deadlines no test reaches: only stop() can save.
    PlanCacheAutosaver saver(live, dir.path(), {.debounce = 1h, .max_delay = 1h, .on_save = log.callback()});
    ops = publish(live, 0);
    EXPECT_EQ(saver.stats().saves, 0u);
    saver.stop();
    EXPECT_EQ(saver.stats().saves, 1u);
    EXPECT_EQ(saver.stats().saved_generation, live.generation());
    EXPECT_EQ(log.ok.load(), 1) << "stop() returns after the final on_save";
    EXPECT_TRUE(on_disk(dir.path(), ops).has_value());
    saver.stop();  // idempotent: nothing more to write, nothing written
    EXPECT_EQ(saver.stats().saves, 1u);
  }  // and the destructor after stop() neither
  EXPECT_EQ(log.ok.load(), 1);

  // The destructor alone stops (and saves) too.
  {
    PlanCacheAutosaver saver(live, dir.path(), {.debounce = 1h, .max_delay = 1h});
    live.add_trigger(0, fresh_trigger(1));
  }
  const auto triggers = on_disk(dir.path(), ops);
  ASSERT_TRUE(triggers.has_value());
  EXPECT_EQ(triggers->back(), fresh_trigger(1));
}

TEST(PlanCacheAutosaver, NothingIsWrittenWhenNothingChanged) {
  TempDir dir;
  const fs::path cache = dir.path() / "cache";
  ExecutionPlanStore live;
  publish(live, 0);  // before the saver: as if loaded from the cache at start
  publish(live, 1);
  SaveLog log;
  PlanCacheAutosaver saver(live, cache,
                           {.debounce = 1ms, .max_delay = 1ms, .poll_interval = 1ms, .on_save = log.callback()});
  // Republishing what is there is no change.
  EXPECT_FALSE(live.add(*learned().plan(0), learned().triggers(0)->front()).inserted);
  live.add_trigger(0, learned().triggers(0)->front());
  // Many polls' worth of time (no event to wait for: it must not happen).
  std::this_thread::sleep_for(200ms);
  saver.stop();
  const PlanCacheAutosaverStats st = saver.stats();
  EXPECT_EQ(st.saves, 0u);
  EXPECT_EQ(st.failures, 0u);
  EXPECT_EQ(log.ok.load() + log.failed.load(), 0);
  EXPECT_FALSE(fs::exists(cache)) << "not even the directory was created";
}

TEST(PlanCacheAutosaver, FailingDirectoryIsReportedWithoutSpinning) {
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);  // unsafe: save_plan_cache refuses it
  ExecutionPlanStore live;
  SaveLog log;
  PlanCacheAutosaver saver(
      live, dir.path(),
      {.debounce = 1ms, .max_delay = 1ms, .poll_interval = 1ms, .error_backoff = 1h, .on_save = log.callback()});
  publish(live, 0);
  ASSERT_TRUE(eventually([&] { return log.failed.load() >= 1; })) << "the error never reached on_save";
  // More changes, and many polls, inside the back-off: no further attempt.
  for (std::uint64_t k = 0; k < 50; ++k) {
    live.add_trigger(0, fresh_trigger(k));
    std::this_thread::sleep_for(2ms);
  }
  std::this_thread::sleep_for(100ms);
  PlanCacheAutosaverStats st = saver.stats();
  EXPECT_EQ(st.failures, 1u);
  EXPECT_EQ(st.saves, 0u);
  EXPECT_NE(st.last_error.find("writable by group or others"), std::string::npos) << st.last_error;
  EXPECT_EQ(log.failed.load(), 1);
  {
    std::lock_guard<std::mutex> lock(log.mu);
    EXPECT_EQ(log.last_error, st.last_error);
  }
  // stop() still makes its one last attempt (and reports it); nothing is thrown.
  saver.stop();
  st = saver.stats();
  EXPECT_EQ(st.failures, 2u);
  EXPECT_EQ(log.failed.load(), 2);
  EXPECT_EQ(log.ok.load(), 0);
  EXPECT_FALSE(fs::exists(dir.path() / "plans.kpc"));
}

TEST(PlanCacheAutosaver, RetriesAfterTheBackOffAndRecovers) {
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  ExecutionPlanStore live;
  SaveLog log;
  PlanCacheAutosaver saver(live, dir.path(),
                           {.debounce = 1ms,
                            .poll_interval = 1ms,
                            .error_backoff = 20ms,
                            .max_error_backoff = 100ms,
                            .on_save = log.callback()});
  const std::vector<Operation> ops = publish(live, 0);
  ASSERT_TRUE(eventually([&] { return log.failed.load() >= 1; }));
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);  // the owner fixes the directory
  // No further change: the pending plan is written once the back-off has passed.
  ASSERT_TRUE(eventually([&] { return on_disk(dir.path(), ops).has_value(); }));
  ASSERT_TRUE(eventually([&] { return log.ok.load() >= 1; }));
  const PlanCacheAutosaverStats st = saver.stats();
  EXPECT_EQ(st.saves, 1u);
  EXPECT_EQ(st.last_error, "") << "a success clears it";
  EXPECT_EQ(st.saved_generation, live.generation());
}

}  // namespace
}  // namespace kiln::fusion::testing

// Property: over thousands of random operation sequences, every operation is executed exactly
// once, in an order that respects every data dependency and every drop, whatever strategies
// were chosen, cached or fresh (the same templates run repeatedly on a shared store, at two
// sizes, so cache hits, re-explorations and shape-id fallbacks all occur).
#include <gtest/gtest.h>

#include "kiln/fusion/fusers.h"
#include "random_program.h"

namespace kiln::fusion::testing {
namespace {

void run_property(std::uint64_t seed, int num_templates, int repeats, std::size_t max_blocks) {
  std::mt19937_64 rng(seed);
  FusionLog log;
  ExecutionPlanStore store;
  std::vector<Template> templates;
  for (int i = 0; i < num_templates; ++i) templates.push_back(random_template(rng, 4 + static_cast<int>(rng() % 20)));
  ProcessorOptions options;
  options.max_blocks = max_blocks;
  std::uint64_t next_id = 1;
  std::uint64_t fused_runs = 0, hits = 0;
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t i = 0; i < templates.size(); ++i) {
      // A fresh stream per program run keeps the check local; the store is shared by all.
      RecordingExecutor executor;
      FusionStream stream(default_fusers(log, FuserOptions{}), options, log);
      ProgramRunner runner(stream, store, executor);
      const std::uint64_t n = (r % 2 == 0) ? 8 : 16;
      runner.run(templates[i], next_id, n);
      stream.drain(store, executor);
      ASSERT_EQ(stream.queue().size(), 0u);
      ASSERT_TRUE(check_execution(runner.registered, executor.executed()))
          << "seed " << seed << " template " << i << " repeat " << r << " max_blocks " << max_blocks;
      for (const auto& rec : executor.records()) fused_runs += rec.fused ? 1 : 0;
      hits += stream.processor().stats().cache_hits;
    }
  }
  // The property is only meaningful if fused kernels and cached plans actually occurred.
  EXPECT_GT(fused_runs, 0u) << "seed " << seed;
  EXPECT_GT(hits, 0u) << "seed " << seed;
}

TEST(FusionProperty, EveryOpExecutedOnceInAValidOrder) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) run_property(seed, 25, 3, 5);
}

TEST(FusionProperty, SmallMaxBlocksStillValid) {
  for (std::uint64_t seed = 100; seed <= 115; ++seed) run_property(seed, 20, 2, 2);
}

TEST(FusionProperty, OneStreamManyProgramsBackToBack) {
  // Programs run back to back on one stream: segments span program boundaries.
  std::mt19937_64 rng(7);
  FusionLog log;
  ExecutionPlanStore store;
  RecordingExecutor executor;
  FusionStream stream(default_fusers(log, FuserOptions{}), ProcessorOptions{}, log);
  ProgramRunner runner(stream, store, executor);
  std::uint64_t next_id = 1;
  std::vector<Template> templates;
  for (int i = 0; i < 10; ++i) templates.push_back(random_template(rng, 12));
  for (int r = 0; r < 300; ++r) runner.run(templates[rng() % templates.size()], next_id, r % 3 == 0 ? 4 : 8);
  stream.drain(store, executor);
  EXPECT_TRUE(check_execution(runner.registered, executor.executed()));
}

}  // namespace
}  // namespace kiln::fusion::testing

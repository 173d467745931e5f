// Many threads, each with its own stream (processor, queue, executor), share one plan store and
// explore the same and different sequences at once: no duplicate plans, no lost plans, every
// execution valid. Run under the tsan preset to check for data races.
#include <gtest/gtest.h>

#include <thread>

#include "kiln/fusion/fusers.h"
#include "random_program.h"

namespace kiln::fusion::testing {
namespace {

TEST(FusionConcurrency, SharedStoreManyStreams) {
  constexpr int kThreads = 8;
  std::mt19937_64 rng(2024);
  std::vector<Template> shared;
  for (int i = 0; i < 12; ++i) shared.push_back(random_template(rng, 6 + static_cast<int>(rng() % 10)));
  ExecutionPlanStore store;
  FusionLog log;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(static_cast<std::uint64_t>(t) + 1);
      std::vector<Template> own;
      for (int i = 0; i < 3; ++i) own.push_back(random_template(local, 8));
      std::uint64_t next_id = static_cast<std::uint64_t>(t + 1) << 40;
      for (int r = 0; r < 150; ++r) {
        const Template& tpl = (r % 4 == 3) ? own[local() % own.size()] : shared[local() % shared.size()];
        RecordingExecutor executor;
        FusionStream stream(default_fusers(log, FuserOptions{}), ProcessorOptions{}, log);
        ProgramRunner runner(stream, store, executor);
        runner.run(tpl, next_id, (r % 2) ? 8 : 16);
        stream.drain(store, executor);
        auto ok = check_execution(runner.registered, executor.executed());
        if (!ok) {
          failures[static_cast<std::size_t>(t)] = ok.message();
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;

  // No duplicates: no two plans have identical operation lists; every plan is findable by its
  // first op.
  const std::size_t n = store.size();
  ASSERT_GT(n, 0u);
  for (PlanId i = 0; i < n; ++i) {
    const auto& ops = store.plan(i)->operations;
    auto found = store.find_starting_with(ops[0]);
    EXPECT_NE(std::find(found.begin(), found.end(), i), found.end()) << "plan " << i << " lost from the index";
    for (PlanId j : found) {
      if (j == i) continue;
      EXPECT_FALSE(store.plan(j)->operations == ops) << "plans " << i << " and " << j << " are duplicates";
    }
  }
}

}  // namespace
}  // namespace kiln::fusion::testing

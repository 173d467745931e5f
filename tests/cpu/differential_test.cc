// Differential tests: random programs run fused (FusionStream + default fusers + CpuExecutor)
// and op by op on the reference executor; see differential_util.h for the programs and bounds.
//
//   KILN_DIFF_PROGRAMS=<n>   how many random programs (default 10000; 3000 under AddressSanitizer,
//                            4000 under ThreadSanitizer)
//   KILN_DIFF_SEED=<seed>    run only that program (the seed a failure printed)
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "differential_util.h"

namespace kiln::cpu::difftest {
namespace {

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

// Sized to keep the whole test under ~60 s in the Debug + ASan/UBSan build on 2 cores (about
// 6 ms a program there, 1.2 ms in Release). Under ThreadSanitizer 10000 programs took 216 s of
// the 300 s limit beside another test; TSan is there for the threads, which every program
// exercises alike, so 4000 (about 90 s) keep the margin.
std::uint64_t default_programs() {
#if defined(__SANITIZE_ADDRESS__)
  return 3000;
#elif defined(__SANITIZE_THREAD__)
  return 4000;
#else
  return 10000;
#endif
}

std::string kind_counts(const CpuDeviceStats& s) {
  std::ostringstream os;
  os << "Elementwise=" << s.launches_by_kind[0] << " Matmul=" << s.launches_by_kind[1]
     << " Reduce=" << s.launches_by_kind[2] << " ReduceBroadcasted=" << s.launches_by_kind[3] << " (row-interleaved "
     << s.row_interleaved << ")"
     << " NhwcRelayout=" << s.launches_by_kind[4] << " Row=" << s.launches_by_kind[5] << " (temporaries in row windows "
     << s.row_window_temporaries << ")"
     << " replays=" << s.fused_replays << " fast_ops=" << s.fast_ops << " reference_ops=" << s.reference_ops
     << " inplace=" << s.inplace_reuses << " cache hits/misses=" << s.kernel_cache_hits << "/" << s.kernel_cache_misses;
  return os.str();
}

void add(CpuDeviceStats& total, const CpuDeviceStats& s) {
  total.fused_launches += s.fused_launches;
  total.fused_replays += s.fused_replays;
  total.fast_ops += s.fast_ops;
  total.reference_ops += s.reference_ops;
  total.kernel_cache_hits += s.kernel_cache_hits;
  total.kernel_cache_misses += s.kernel_cache_misses;
  total.inplace_reuses += s.inplace_reuses;
  total.row_interleaved += s.row_interleaved;
  total.row_window_temporaries += s.row_window_temporaries;
  for (std::size_t k = 0; k < total.launches_by_kind.size(); ++k) total.launches_by_kind[k] += s.launches_by_kind[k];
}

// Each program on fresh devices and a fresh plan store, so that a seed replays exactly. With
// kiln's row fuser (the default) on every program; without it (Burn's fusers only) on a quarter
// of them.
class DifferentialSearch : public ::testing::TestWithParam<bool> {};

TEST_P(DifferentialSearch, RandomPrograms) {
  const bool row_fuser = GetParam();
  std::vector<std::uint64_t> seeds;
  if (std::getenv("KILN_DIFF_SEED") != nullptr) {
    seeds.push_back(env_u64("KILN_DIFF_SEED", 0));
  } else {
    const std::uint64_t n = env_u64("KILN_DIFF_PROGRAMS", default_programs()) / (row_fuser ? 1 : 4);
    for (std::uint64_t i = 0; i < n; ++i) seeds.push_back(1000 + i);
  }
  CpuDeviceStats total;
  std::uint64_t ops = 0, checks = 0;
  int failures = 0;
  std::vector<std::pair<double, std::uint64_t>> slowest;
  for (std::uint64_t seed : seeds) {
    const auto t0 = std::chrono::steady_clock::now();
    const DiffProgram p = Generator(seed, seed).generate();
    FusedSide fused(2, fusion::FuserOptions{.row_fuser = row_fuser});
    ReferenceSide ref;
    fused.run(p);
    ref.run(p);
    slowest.emplace_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), seed);
    ops += p.ops.size();
    checks += p.checks.size();
    add(total, fused.device.stats());
    const std::string diff = compare(p, fused.device, ref.device);
    if (!diff.empty()) {
      ADD_FAILURE() << "program differs (replay: KILN_DIFF_SEED=" << seed << ")\n" << p.to_string() << diff;
      if (++failures >= 5) break;
    }
  }
  std::sort(slowest.rbegin(), slowest.rend());
  if (std::getenv("KILN_DIFF_VERBOSE") != nullptr)
    for (std::size_t i = 0; i < std::min<std::size_t>(10, slowest.size()); ++i)
      std::printf("  slow: seed %llu %.3f s\n", static_cast<unsigned long long>(slowest[i].second), slowest[i].first);
  std::printf("[differential] %zu programs, %llu ops, %llu outputs compared; fused: %s\n", seeds.size(),
              static_cast<unsigned long long>(ops), static_cast<unsigned long long>(checks),
              kind_counts(total).c_str());
  // The generator must actually exercise every fused program kind.
  if (seeds.size() >= 200) {
    EXPECT_GT(total.launches_by_kind[0], 0u);
    EXPECT_GT(total.launches_by_kind[1], 0u);
    EXPECT_GT(total.launches_by_kind[2], 0u);
    EXPECT_GT(total.inplace_reuses, 0u);
    EXPECT_GT(total.fused_replays, 0u);
    const std::uint64_t rows = total.launches_by_kind[static_cast<std::size_t>(fusion::ProgramKind::Row)];
    if (row_fuser) {
      EXPECT_GT(rows, 0u);
      EXPECT_GT(total.row_window_temporaries, 0u);
    } else {
      EXPECT_EQ(rows, 0u);
    }
  }
}

std::string row_fuser_name(const ::testing::TestParamInfo<bool>& param) { return param.param ? "On" : "Off"; }
INSTANTIATE_TEST_SUITE_P(RowFuser, DifferentialSearch, ::testing::Bool(), row_fuser_name);

// Runs one instance of a structure on a reused fused side and on a fresh reference, compares them
// and forgets the instance's tensors; `next_id` moves past the instance's ids.
bool rerun_matches(FusedSide& side, const DiffProgram& p, std::uint64_t& next_id, const std::string& label) {
  next_id = p.end_id;
  ReferenceSide ref;
  side.run(p);
  ref.run(p);
  const std::string diff = compare(p, side.device, ref.device);
  release(p, side.device);
  if (diff.empty()) return true;
  ADD_FAILURE() << label << " differs\n" << p.to_string() << diff;
  return false;
}

// One plan store, stream and device for several instances of each program structure, with new
// sizes, scalars and data each time: cached plans and cached compiled forms must bind the new
// values (each instance is compared with the reference).
TEST(Differential, CachedPlanReruns) {
  const std::uint64_t templates = env_u64("KILN_DIFF_RERUN_TEMPLATES", default_programs() / 10);
  const std::uint64_t instances = 4;
  std::uint64_t plan_hits = 0, kernel_hits = 0, fused = 0;
  int failures = 0;
  for (std::uint64_t t = 0; t < templates; ++t) {
    const std::uint64_t seed = 500000 + t;
    FusedSide side;
    std::uint64_t next_id = 1;
    for (std::uint64_t i = 0; i < instances; ++i) {
      failures += !rerun_matches(side, Generator(seed, seed * 16 + i, next_id).generate(), next_id,
                                 "rerun " + std::to_string(i) + " of structure seed " + std::to_string(seed));
    }
    plan_hits += side.stream.processor().stats().cache_hits;
    kernel_hits += side.device.stats().kernel_cache_hits;
    fused += side.device.stats().fused_launches;
    if (failures >= 5) break;
  }
  std::printf(
      "[differential] reruns: %llu structures x %llu instances: %llu cached plans executed, %llu fused "
      "launches, %llu compiled-form cache hits\n",
      static_cast<unsigned long long>(templates), static_cast<unsigned long long>(instances),
      static_cast<unsigned long long>(plan_hits), static_cast<unsigned long long>(fused),
      static_cast<unsigned long long>(kernel_hits));
  if (templates >= 20) {
    EXPECT_GT(plan_hits, 0u);
    EXPECT_GT(kernel_hits, 0u);
  }
}

// Beyond Burn: a plan store and a compiled-form cache bounded far below what the programs need
// (8 plans, 8 compiled forms). Each structure runs twice in a row (its plans are hits), and
// structures are interleaved over rounds, so plans and compiled forms are evicted between
// instances and while a stream holds them: every instance must compute what the reference does.
TEST(Differential, TinyBoundedCachesEvictAndRebuild) {
  const std::uint64_t structures =
      std::max<std::uint64_t>(8, env_u64("KILN_DIFF_RERUN_TEMPLATES", default_programs() / 10) / 4);
  constexpr std::uint64_t kRounds = 3, kBound = 8;
  CpuDeviceOptions device_options{.threads = 2};
  device_options.max_kernels = kBound;
  FusedSide side(device_options, fusion::PlanStoreOptions{.max_plans = kBound});
  int failures = 0;
  std::uint64_t next_id = 1;
  for (std::uint64_t round = 0; round < kRounds && failures < 5; ++round) {
    for (std::uint64_t i = 0; i < 2 * structures && failures < 5; ++i) {
      const std::uint64_t seed = 700000 + i / 2;
      failures += !rerun_matches(side, Generator(seed, seed * 16 + round * 2 + i % 2, next_id).generate(), next_id,
                                 "round " + std::to_string(round) + " of structure seed " + std::to_string(seed));
      EXPECT_LE(side.store.size(), kBound);
      EXPECT_LE(side.device.kernel_cache_size(), kBound);
    }
  }
  const CpuDeviceStats st = side.device.stats();
  std::printf(
      "[differential] bounded caches: %llu structures x %llu rounds: %llu plans evicted, %llu compiled forms "
      "evicted, %llu cached plans executed\n",
      static_cast<unsigned long long>(structures), static_cast<unsigned long long>(kRounds),
      static_cast<unsigned long long>(side.store.evicted()), static_cast<unsigned long long>(st.kernel_cache_evictions),
      static_cast<unsigned long long>(side.stream.processor().stats().cache_hits));
  EXPECT_GT(side.store.evicted(), 0u);
  EXPECT_GT(st.kernel_cache_evictions, 0u);
  EXPECT_GT(side.stream.processor().stats().cache_hits, 0u) << "cached plans ran between evictions";
}

}  // namespace
}  // namespace kiln::cpu::difftest

// Collective groups over Gloo's TCP transport on loopback: several ranks in one process, each
// on its own thread as each daemon's session thread would be. Every reduce op and dtype against
// the same reduction computed on one device; a rank that dies or stalls; a job that meets again.
#include "kiln/distributed/group.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/reference/tensor.h"
#include "kiln/testing/status.h"

namespace kiln::distributed {
namespace {

using namespace std::chrono_literals;
using ir::ReduceOperation;
using ::kiln::testing::StatusIs;
namespace dt = ir::dtypes;

DistributedConfig config_for(std::uint32_t rank, std::uint32_t world, std::uint16_t port,
                             std::chrono::milliseconds timeout = 10s) {
  return DistributedConfig{"train", rank, world, TcpAddress{"127.0.0.1", port}, "", timeout};
}

// A world of groups: rank 0 first (it serves the store on a free port), then the others.
std::vector<std::unique_ptr<CollectiveGroup>> make_world(std::uint32_t world, std::chrono::milliseconds timeout = 10s) {
  std::vector<std::unique_ptr<CollectiveGroup>> groups;
  Result<std::unique_ptr<CollectiveGroup>> g0 = CollectiveGroup::create(config_for(0, world, 0, timeout), "kiln test");
  EXPECT_TRUE(g0.ok()) << g0.error().to_string();
  const std::uint16_t port = (*g0)->config().rendezvous.port;
  groups.push_back(std::move(g0).value());
  for (std::uint32_t r = 1; r < world; ++r) {
    Result<std::unique_ptr<CollectiveGroup>> g =
        CollectiveGroup::create(config_for(r, world, port, timeout), "kiln test");
    EXPECT_TRUE(g.ok()) << g.error().to_string();
    groups.push_back(std::move(g).value());
  }
  return groups;
}

// Runs fn(rank) on one thread per rank (a collective blocks until every rank has called it).
std::vector<Status> on_every_rank(std::size_t ranks, const std::function<Status(std::uint32_t)>& fn) {
  std::vector<std::future<Status>> running;
  for (std::uint32_t r = 0; r < ranks; ++r) running.push_back(std::async(std::launch::async, fn, r));
  std::vector<Status> out;
  for (auto& f : running) out.push_back(f.get());
  return out;
}

// Rank r's element i as a double: small integers whose sums, products, minima and maxima are
// exact in every dtype tested, so any order of reduction gives the same bits. A float mean
// divides once: f32 rounds it as the reference's f64 rounded to f32 does (double rounding is
// innocuous for a division when 53 >= 2 * 24 + 2), and so on for f16 and bf16 through f32.
double element(std::uint32_t rank, std::size_t i, ReduceOperation op, bool is_unsigned) {
  const std::uint64_t h = (i * 2654435761u + rank * 40503u + 17) % 97;
  if (op == ReduceOperation::Prod) {
    const double factor = std::array{1.0, 2.0, 1.0, -1.0, 1.0}[h % 5];
    return is_unsigned ? std::abs(factor) : factor;
  }
  const double v = static_cast<double>(h % 23);
  return is_unsigned ? v : v - 11.0;
}

// The tensor of `dtype` holding `values` (encoded by the reference module's element codec).
std::vector<std::byte> encode(ir::DType dtype, const std::vector<double>& values) {
  std::vector<std::byte> out(values.size() * dtype.size_bytes());
  for (std::size_t i = 0; i < values.size(); ++i) reference::element::store_f64(out.data(), dtype, i, values[i]);
  return out;
}

// The reduction on one device: over ranks, element by element.
std::vector<double> reduce_on_one_device(const std::vector<std::vector<double>>& per_rank, ReduceOperation op,
                                         bool integral) {
  std::vector<double> out = per_rank[0];
  for (std::size_t r = 1; r < per_rank.size(); ++r)
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double v = per_rank[r][i];
      switch (op) {
        case ReduceOperation::Sum:
        case ReduceOperation::Mean: out[i] += v; break;
        case ReduceOperation::Min: out[i] = std::min(out[i], v); break;
        case ReduceOperation::Max: out[i] = std::max(out[i], v); break;
        case ReduceOperation::Prod: out[i] *= v; break;
      }
    }
  if (op == ReduceOperation::Mean)
    for (double& v : out) v = integral ? std::trunc(v / per_rank.size()) : v / per_rank.size();
  return out;
}

void check_all_reduce(std::vector<std::unique_ptr<CollectiveGroup>>& groups, ir::DType dtype, ReduceOperation op,
                      std::size_t n) {
  const std::size_t world = groups.size();
  std::vector<std::vector<double>> values(world, std::vector<double>(n));
  for (std::uint32_t r = 0; r < world; ++r)
    for (std::size_t i = 0; i < n; ++i) values[r][i] = element(r, i, op, dtype.is_uint());
  const std::vector<std::byte> expected = encode(dtype, reduce_on_one_device(values, op, dtype.is_integral()));
  std::vector<std::vector<std::byte>> data(world);
  for (std::uint32_t r = 0; r < world; ++r) data[r] = encode(dtype, values[r]);
  const std::vector<Status> st =
      on_every_rank(world, [&](std::uint32_t r) { return groups[r]->all_reduce(dtype, data[r], op); });
  for (std::uint32_t r = 0; r < world; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].error().to_string();
    ASSERT_EQ(data[r], expected) << "rank " << r << " of " << world << ", " << dtype.name() << " "
                                 << ir::reduce_operation_name(op) << " of " << n << " elements";
  }
}

TEST(GroupTest, EveryReduceOpAndDtypeMatchesOneDevice) {
  for (std::uint32_t world : {2u, 3u}) {
    auto groups = make_world(world);
    for (ir::DType dtype : {dt::f32, dt::f64, dt::f16, dt::bf16, dt::i64, dt::i32, dt::i16, dt::i8, dt::u8, dt::u32})
      for (ReduceOperation op : {ReduceOperation::Sum, ReduceOperation::Mean, ReduceOperation::Min,
                                 ReduceOperation::Max, ReduceOperation::Prod})
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}})
          check_all_reduce(groups, dtype, op, n);
    for (const auto& g : groups) {
      EXPECT_EQ(g->status().state, GroupState::Ready);
      EXPECT_EQ(g->status().meetings, 1u);  // one meeting served every collective
      EXPECT_EQ(g->status().failures, 0u);
    }
  }
}

TEST(GroupTest, LargeTensorsOnFourRanks) {
  auto groups = make_world(4);
  check_all_reduce(groups, dt::f32, ReduceOperation::Sum, std::size_t{1} << 20);
  check_all_reduce(groups, dt::bf16, ReduceOperation::Mean, (std::size_t{1} << 20) + 3);
}

TEST(GroupTest, SixtyFourMebibytesOnTwoRanks) {
  auto groups = make_world(2);
  check_all_reduce(groups, dt::f32, ReduceOperation::Sum, std::size_t{16} << 20);
}

TEST(GroupTest, OneRankIsTheIdentityAndBoolIsRefused) {
  auto groups = make_world(1);
  std::vector<std::byte> data = encode(dt::f32, {1.5, -2.0});
  const std::vector<std::byte> before = data;
  KILN_ASSERT_OK(groups[0]->all_reduce(dt::f32, data, ReduceOperation::Mean));
  EXPECT_EQ(data, before);
  std::vector<std::byte> flags(4);
  EXPECT_THAT(groups[0]->all_reduce(dt::boolean, flags, ReduceOperation::Sum),
              StatusIs(ErrorCode::Unsupported, "float and integer tensors, not bool"));
}

// A rank whose daemon dies: its peers' next collective fails well within the timeout, naming
// it; once it is back, the job meets again and goes on.
TEST(GroupTest, ADeadRankIsNamedAndTheJobMeetsAgain) {
  const auto timeout = 3s;
  auto groups = make_world(3, timeout);
  check_all_reduce(groups, dt::f32, ReduceOperation::Sum, 100);
  const std::uint16_t port = groups[0]->config().rendezvous.port;
  groups[2].reset();  // its sockets close, as a killed process's would

  std::vector<std::vector<std::byte>> data(2, encode(dt::f32, std::vector<double>(1000, 1.0)));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st =
      on_every_rank(2, [&](std::uint32_t r) { return groups[r]->all_reduce(dt::f32, data[r], ReduceOperation::Sum); });
  const auto took = std::chrono::steady_clock::now() - start;
  for (const Status& s : st) EXPECT_THAT(s, StatusIs(ErrorCode::Execution, "rank(s) 2 of job 'train' left"));
  EXPECT_LT(took, timeout + 1s);
  EXPECT_EQ(groups[0]->status().state, GroupState::Failed);
  EXPECT_EQ(groups[0]->status().failures, 1u);

  Result<std::unique_ptr<CollectiveGroup>> back = CollectiveGroup::create(config_for(2, 3, port, timeout), "kiln test");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  groups[2] = std::move(back).value();
  check_all_reduce(groups, dt::f32, ReduceOperation::Sum, 1000);
  EXPECT_EQ(groups[0]->status().meetings, 2u);
  EXPECT_EQ(groups[0]->status().state, GroupState::Ready);
}

// A rank that stalls (connected, never calling): the others fail at the timeout, saying every
// daemon is still connected; the job meets again once all call.
TEST(GroupTest, AStalledRankTimesOutAndTheJobMeetsAgain) {
  const auto timeout = 1s;
  auto groups = make_world(3, timeout);
  check_all_reduce(groups, dt::i32, ReduceOperation::Max, 10);
  std::vector<std::vector<std::byte>> data(2, encode(dt::i32, std::vector<double>(10, 1.0)));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st =
      on_every_rank(2, [&](std::uint32_t r) { return groups[r]->all_reduce(dt::i32, data[r], ReduceOperation::Sum); });
  const auto took = std::chrono::steady_clock::now() - start;
  for (const Status& s : st) EXPECT_THAT(s, StatusIs(ErrorCode::Execution, "every rank's daemon is still connected"));
  EXPECT_LT(took, timeout + 1s);
  // Rank 2 calls late: its peers have left that collective, so it fails too.
  std::vector<std::byte> late = encode(dt::i32, std::vector<double>(10, 1.0));
  EXPECT_FALSE(groups[2]->all_reduce(dt::i32, late, ReduceOperation::Sum).ok());
  check_all_reduce(groups, dt::i32, ReduceOperation::Sum, 10);
}

// An errored input: the rank abandons the collective and its peers fail at once.
TEST(GroupTest, AnAbandonedCollectiveFailsItsPeersAtOnce) {
  const auto timeout = 5s;
  auto groups = make_world(2, timeout);
  check_all_reduce(groups, dt::f32, ReduceOperation::Sum, 10);
  std::vector<std::byte> data = encode(dt::f32, std::vector<double>(10, 1.0));
  const auto start = std::chrono::steady_clock::now();
  auto peer =
      std::async(std::launch::async, [&] { return groups[0]->all_reduce(dt::f32, data, ReduceOperation::Sum); });
  std::this_thread::sleep_for(100ms);
  groups[1]->abandon("its input failed");
  EXPECT_FALSE(peer.get().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, timeout);
  EXPECT_EQ(groups[1]->status().last_error, "its input failed");
  check_all_reduce(groups, dt::f32, ReduceOperation::Sum, 10);
}

// Broadcast: every rank ends with the root's bytes, for each root; all_gather: every rank's
// bytes in rank order, on every rank, interleaved with an all_reduce on the same tags.
TEST(GroupTest, BroadcastAndAllGatherMoveEveryRanksBytes) {
  constexpr std::uint32_t kWorld = 3;
  auto groups = make_world(kWorld);
  auto bytes_of = [](std::uint32_t rank, std::size_t n) {
    std::vector<std::byte> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 31 + rank * 7 + 1) & 0xff);
    return b;
  };
  for (std::uint32_t root = 0; root < kWorld; ++root) {
    std::vector<std::vector<std::byte>> data(kWorld);
    for (std::uint32_t r = 0; r < kWorld; ++r) data[r] = bytes_of(r, 1001);
    const std::vector<Status> st =
        on_every_rank(kWorld, [&](std::uint32_t r) { return groups[r]->broadcast(data[r], root); });
    for (std::uint32_t r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].error().to_string();
      EXPECT_TRUE(data[r] == bytes_of(root, 1001)) << "rank " << r << ", root " << root;
    }
  }
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5000}}) {
    std::vector<std::vector<std::byte>> all(kWorld, std::vector<std::byte>(n * kWorld));
    const std::vector<Status> st = on_every_rank(kWorld, [&](std::uint32_t r) {
      const std::vector<std::byte> mine = bytes_of(r, n);
      return groups[r]->all_gather(mine, all[r]);
    });
    std::vector<std::byte> expected;
    for (std::uint32_t r = 0; r < kWorld; ++r) {
      const std::vector<std::byte> b = bytes_of(r, n);
      expected.insert(expected.end(), b.begin(), b.end());
    }
    for (std::uint32_t r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].error().to_string();
      EXPECT_TRUE(all[r] == expected) << "rank " << r << ", " << n << " bytes each";
    }
    check_all_reduce(groups, dt::i32, ReduceOperation::Sum, 7);
  }
  std::vector<std::byte> mine(4), wrong(5);
  EXPECT_THAT(groups[0]->all_gather(mine, wrong), StatusIs(ErrorCode::Invalid, "4 bytes from each of 3 ranks"));
  EXPECT_THAT(groups[0]->broadcast(mine, kWorld), StatusIs(ErrorCode::Invalid, "root 3 is not a rank"));
}

}  // namespace
}  // namespace kiln::distributed

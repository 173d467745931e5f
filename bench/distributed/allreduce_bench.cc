// kiln-bench-allreduce: kiln's all-reduce across CPU daemons against Gloo called directly, with
// the same ranks and sizes, side by side in one run (rounds alternate the two).
//
//   gloo  one thread per rank in this process, each with its own Gloo context over the TCP
//         transport on loopback (rendezvous: Gloo's in-memory HashStore): ring all-reduce (sum,
//         f32) of a buffer in place. What the library costs.
//   kiln  one kilnd per rank (--dist-* flags, rendezvous on loopback), a client of the job on
//         each: all_reduce(sum) of a tensor already on the device, consumed (its result is the
//         next rep's input: in place, as Gloo's), then a sync, as a training step does. What a
//         user of kiln pays on top: the stream's drain, the message and its answer.
//
// A rep is timed from a barrier of all ranks to the last rank's return; the median of the reps
// is printed in the peer kit's line format (bench-peers README), with the bus bandwidth
// (2 (n-1)/n × bytes / time, as nccl-tests define it) as gbps.
//
// Usage: kiln-bench-allreduce --kilnd PATH [--ranks 2,4] [--sizes 1048576,16777216] [--reps 5] [--rounds 2]
//        (sizes in f32 elements; 16777216 = 64 MiB)
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include "kiln/apps/kilnd_process.h"
#include "kiln/runtime/session.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string kilnd;
  std::vector<std::size_t> ranks{2, 4};
  std::vector<std::size_t> sizes{std::size_t{1} << 20, std::size_t{1} << 24};
  int reps = 5;
  int rounds = 2;
};

std::vector<std::size_t> parse_list(const char* text) {
  std::vector<std::size_t> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoull(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return out;
}

// Runs body(rank) on one thread per rank `reps` times after a barrier each; returns the median
// over reps of the slowest rank's time, in seconds.
double time_reps(std::size_t ranks, int reps, const std::function<void(std::size_t)>& setup,
                 const std::function<void(std::size_t)>& body) {
  std::vector<double> per_rep(static_cast<std::size_t>(reps), 0.0);
  std::barrier sync(static_cast<std::ptrdiff_t>(ranks));
  std::vector<std::thread> threads;
  std::mutex mu;
  for (std::size_t r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      setup(r);
      for (int i = 0; i < reps + 1; ++i) {  // the first rep warms up
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        body(r);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (i == 0) continue;
        std::lock_guard lock(mu);
        per_rep[static_cast<std::size_t>(i - 1)] = std::max(per_rep[static_cast<std::size_t>(i - 1)], s);
      }
    });
  for (auto& t : threads) t.join();
  std::sort(per_rep.begin(), per_rep.end());
  return per_rep[per_rep.size() / 2];
}

double gloo_all_reduce(std::size_t ranks, std::size_t n, int reps) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::shared_ptr<gloo::Context>> contexts(ranks);
  std::vector<std::vector<float>> data(ranks, std::vector<float>(n, 1.0f));
  return time_reps(
      ranks, reps,
      [&](std::size_t r) {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(r), static_cast<int>(ranks));
        context->connectFullMesh(*store, device);
        contexts[r] = context;
      },
      [&](std::size_t r) {
        gloo::AllreduceOptions o(contexts[r]);
        o.setOutput(data[r].data(), n);
        o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
        gloo::allreduce(o);
      });
}

double kiln_all_reduce(const Options& opt, std::size_t ranks, std::size_t n, int reps) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kiln-bench-allreduce-{}", ::getpid());
  // Rank 0 takes a free port for the rendezvous and says which; the others follow.
  std::vector<std::unique_ptr<kiln::apps::KilndProcess>> daemons;
  std::uint16_t port = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    daemons.push_back(std::make_unique<kiln::apps::KilndProcess>(
        opt.kilnd, dir / fmt::format("rank{}", r),
        std::vector<std::string>{"--dist-job", "bench", "--dist-rank", std::to_string(r), "--dist-world-size",
                                 std::to_string(ranks), "--dist-rendezvous", fmt::format("tcp:127.0.0.1:{}", port),
                                 "--threads", "1"}));
    if (r == 0) {
      const std::optional<std::uint16_t> served = daemons[0]->served_rendezvous_port();
      if (!served) {
        std::fprintf(stderr, "kiln-bench-allreduce: rank 0 did not start:\n%s", daemons[0]->log().c_str());
        std::exit(1);
      }
      port = *served;
    }
  }
  std::vector<std::unique_ptr<kiln::ipc::RemoteTarget>> targets(ranks);
  std::vector<std::unique_ptr<kiln::runtime::Session>> sessions(ranks);
  std::vector<std::optional<kiln::runtime::Tensor>> inputs(ranks);
  std::atomic<bool> failed{false};  // written by every rank's thread
  const double t = time_reps(
      ranks, reps,
      [&](std::size_t r) {
        auto target = daemons[r]->connect("bench");
        if (!target.ok()) {
          std::fprintf(stderr, "kiln-bench-allreduce: rank %zu: %s\n%s", r, target.error().to_string().c_str(),
                       daemons[r]->log().c_str());
          std::exit(1);
        }
        targets[r] = std::move(target).value();
        sessions[r] = std::make_unique<kiln::runtime::Session>(*targets[r]);
        std::vector<float> ones(n, 1.0f);
        inputs[r] = sessions[r]->from_host(std::span<const float>(ones), {n}).value();
      },
      [&](std::size_t r) {
        // The result replaces the input, as Gloo's all-reduce works in place (and a training
        // step's gradient is consumed by its reduction).
        kiln::runtime::Session& s = *sessions[r];
        auto out = s.all_reduce(std::move(*inputs[r]), kiln::ir::ReduceOperation::Sum, {});
        if (!out.ok() || !s.sync().ok()) {
          failed = true;
          return;
        }
        inputs[r] = std::move(out).value();
      });
  inputs.clear();  // tensors before their sessions
  sessions.clear();
  targets.clear();
  daemons.clear();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (failed) {
    std::fprintf(stderr, "kiln-bench-allreduce: a kiln all_reduce failed\n");
    std::exit(1);
  }
  return t;
}

void print(const char* peer, std::size_t ranks, std::size_t n, double seconds, int reps) {
  const double bytes = double(n) * 4.0;
  const double bus = 2.0 * double(ranks - 1) / double(ranks) * bytes / seconds / 1e9;
  std::printf("peer=%s workload=allreduce n=%zu ns_per_elem=%.4g gbps=%.3f threads=%zu reps=%d ms=%.3f ranks=%zu\n",
              peer, n, seconds * 1e9 / double(n), bus, ranks, reps, seconds * 1e3, ranks);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--kilnd")
      opt.kilnd = argv[i + 1];
    else if (k == "--ranks")
      opt.ranks = parse_list(argv[i + 1]);
    else if (k == "--sizes")
      opt.sizes = parse_list(argv[i + 1]);
    else if (k == "--reps")
      opt.reps = std::max(1, std::atoi(argv[i + 1]));
    else if (k == "--rounds")
      opt.rounds = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "kiln-bench-allreduce: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (opt.kilnd.empty()) {
    std::fprintf(stderr,
                 "usage: kiln-bench-allreduce --kilnd PATH [--ranks 2,4] [--sizes N,...] [--reps R] [--rounds K]\n");
    return 2;
  }
  for (int round = 0; round < opt.rounds; ++round)
    for (std::size_t ranks : opt.ranks)
      for (std::size_t n : opt.sizes) {
        print("gloo", ranks, n, gloo_all_reduce(ranks, n, opt.reps), opt.reps);
        print("kiln", ranks, n, kiln_all_reduce(opt, ranks, n, opt.reps), opt.reps);
      }
  return 0;
}

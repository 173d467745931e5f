// Operating the daemon (issue 26): live control through the control command (limits, disconnect,
// drain, jobs, clients), its refusal for other uids, the metrics (their numbers against the
// status, their HTTP endpoint) and the JSON log lines. One process: a DaemonService over the CPU
// device, clients over real sockets; kilnctl itself for the other-uid check.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../runtime/ipc_harness.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/ipc/daemon_metrics.h"
#include "kiln/ipc/log_format.h"
#include "kiln/ipc/metrics_server.h"
#include "kiln/ipc/unix_socket.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"
#include "peer_user.h"

namespace kiln::ipc {
namespace {

using kiln::testing::IpcHarness;
using kiln::testing::ok;
using kiln::testing::wait_until;
using runtime::Session;
using runtime::Tensor;

std::unique_ptr<runtime::Device> make_device(cpu::CpuBackend** backend = nullptr) {
  runtime::RuntimeOptions o;
  o.threads = 2;
  o.fusion = fusion::FusionConfig{};
  o.config_path = "";
  auto cpu = std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 1, .jit = cpu::CpuJitMode::Off});
  if (backend != nullptr) *backend = cpu.get();
  return ok(runtime::Device::create(std::move(cpu), std::move(o)));
}

// A tensor of `n` floats kept on the device by `s`.
Tensor upload(Session& s, std::size_t n, float v = 1.0f) {
  return ok(s.from_host(std::vector<float>(n, v), {static_cast<std::uint64_t>(n)}));
}

// The value of `name{labels}` in an exposition ("kiln_clients", "" or "job=\"a\",owner_uid=\"0\"").
std::optional<double> sample(const std::string& text, const std::string& name, const std::string& labels = "") {
  const std::string key = labels.empty() ? name + " " : name + "{" + labels + "} ";
  for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
  return std::nullopt;
}

TEST(DaemonControl, LimitsSetLiveApplyToTheNextCharge) {
  auto dev = make_device();
  IpcHarness h(*dev, "quota-job");
  Session s(h.target());
  Tensor a = upload(s, 1 << 18);  // 1 MiB
  EXPECT_EQ(ok(h.target().control(ControlVerb::Limits, "job_memory_mib=1")),
            "job_memory_mib = 1\njob_queued_ops = 0 (unlimited)\nuid_memory_mib = 0 (unlimited)\n"
            "uid_queued_ops = 1048576\nuid_jobs = 64\nstaging_mib = 0 (unlimited)\nmax_connections = 1024\n"
            "max_connections_per_uid = 128\n");
  EXPECT_EQ(h.service().limits().job_memory_bytes, std::uint64_t{1} << 20);
  // The job holds 1 MiB: the next byte is refused, with the quota named; nothing was freed.
  Result<Tensor> over = s.from_host(std::vector<float>(4, 1.0f), {4});
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message.find("job 'quota-job' memory quota of 1.0 MiB exceeded"), std::string::npos)
      << over.error().message;
  // A uid quota set live sees what the uid holds already (the uid's use is always counted).
  KILN_ASSERT_OK(h.target().control(ControlVerb::Limits, "job_memory_mib=0 uid_memory_mib=1"));
  over = s.from_host(std::vector<float>(4, 1.0f), {4});
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message.find("memory quota of 1.0 MiB exceeded"), std::string::npos) << over.error().message;
  KILN_ASSERT_OK(h.target().control(ControlVerb::Limits, "uid_memory_mib=0"));
  Tensor b = upload(s, 4);
  EXPECT_EQ(ok(s.to_host(std::move(a)))[0], 1.0f);
  // All or nothing, with the key named.
  Result<std::string> bad = h.target().control(ControlVerb::Limits, "job_queued_ops=5 job_memory=3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("limits: unknown key 'job_memory'; the keys that change live: job_memory_mib"),
            std::string::npos)
      << bad.error().message;
  EXPECT_EQ(h.service().limits().job_queued_ops, 0u);
  bad = h.target().control(ControlVerb::Limits, "max_connections=0");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("max_connections must be >= 1"), std::string::npos) << bad.error().message;
  bad = h.target().control(ControlVerb::Limits, "uid_jobs=-1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("uid_jobs must be a non-negative integer, not '-1'"), std::string::npos);
  EXPECT_EQ(
      ok(h.target().control(ControlVerb::Limits, "", true)),
      "{\"job_memory_mib\":0,\"job_queued_ops\":0,\"uid_memory_mib\":0,\"uid_queued_ops\":1048576,\"uid_jobs\":64,"
      "\"staging_mib\":0,\"max_connections\":1024,\"max_connections_per_uid\":128}");
}

TEST(DaemonControl, ConnectionLimitsChangeLive) {
  auto dev = make_device();
  IpcHarness h(*dev);
  KILN_ASSERT_OK(h.target().control(ControlVerb::Limits, "max_connections_per_uid=1"));
  RemoteOptions r;
  r.runtime_dir = h.dir();
  r.socket_name = "kilnd-test.sock";
  r.job = "second";
  // The limit reaches the control server's strand asynchronously: the next connections see it.
  std::string refusal;
  EXPECT_TRUE(wait_until([&] {
    auto c = RemoteTarget::connect(r);
    if (c.ok()) return false;
    refusal = c.error().message;
    return true;
  }));
  EXPECT_NE(refusal.find("daemon.max_connections_per_uid = 1"), std::string::npos) << refusal;
  EXPECT_GE(*sample(h.service().metrics().to_prometheus(), "kiln_refused_connections_total",
                    "reason=\"uid_connection_limit\""),
            1.0);
  KILN_ASSERT_OK(h.target().control(ControlVerb::Limits, "max_connections_per_uid=128"));
  EXPECT_TRUE(wait_until([&] { return RemoteTarget::connect(r).ok(); }));
}

// Issue 26's target: a disconnect frees the client's memory and leaves the others running.
TEST(DaemonControl, DisconnectFreesTheClientsMemoryAndLeavesTheOthersRunning) {
  auto dev = make_device();
  IpcHarness h(*dev, "operator");
  auto victim = h.connect("victim");
  auto bystander = h.connect("bystander");
  Session vs(*victim), bs(*bystander);
  constexpr std::size_t kFloats = 4 << 20;  // 16 MiB each
  Tensor v1 = upload(vs, kFloats, 2.0f), v2 = upload(vs, kFloats, 3.0f);
  Tensor b1 = upload(bs, kFloats, 5.0f);
  KILN_ASSERT_OK(vs.sync());
  KILN_ASSERT_OK(bs.sync());
  const std::uint64_t before = dev->backend().memory_stats().bytes_in_use;
  ASSERT_GE(before, 3 * kFloats * sizeof(float));
  const std::string clients = ok(h.target().control(ControlVerb::Clients, "", true));
  const std::size_t at = clients.find("\"job\":\"victim\"");
  ASSERT_NE(at, std::string::npos) << clients;
  const std::size_t id_at = clients.rfind("\"id\":", at);
  const std::uint64_t victim_id = std::stoull(clients.substr(id_at + 5));
  const std::string answer = ok(h.target().control(ControlVerb::Disconnect, std::to_string(victim_id)));
  EXPECT_NE(answer.find(fmt::format("client {} (job victim", victim_id)), std::string::npos) << answer;
  EXPECT_NE(answer.find("2 tensor(s) (32.0 MiB) freed"), std::string::npos) << answer;
  // Freed when the answer came: the victim's 32 MiB are back, the bystander's 16 MiB are not.
  const std::uint64_t after = dev->backend().memory_stats().bytes_in_use;
  EXPECT_LE(after + 2 * kFloats * sizeof(float), before) << before << " -> " << after;
  EXPECT_GE(after, kFloats * sizeof(float));
  // The bystander computes on; the victim's next request fails, it does not hang.
  Tensor sum = ok(bs.add(b1, upload(bs, kFloats, 1.0f)));
  const std::vector<float> got = ok(bs.to_host(std::move(sum)));
  EXPECT_EQ(got.front(), 6.0f);
  EXPECT_EQ(got.back(), 6.0f);
  EXPECT_FALSE(vs.to_host(std::move(v1)).ok());
  // The operator cannot end its own connection, nor a client that is not there.
  Result<std::string> bad = h.target().control(ControlVerb::Disconnect, std::to_string(victim_id));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(fmt::format("no client {}", victim_id)), std::string::npos) << bad.error().message;
  bad = h.target().control(ControlVerb::Disconnect, "seven");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'seven' is not a client id"), std::string::npos);
  (void)v2;
}

TEST(DaemonControl, DrainRefusesNewClientsButTheOperatorsKilnctl) {
  auto dev = make_device();
  IpcHarness h(*dev, "kilnctl-" + std::to_string(::getuid()));  // the operator's tool
  auto worker = h.connect("worker");
  // The daemon lists a client once its session starts, just after the handshake's answer.
  ASSERT_TRUE(wait_until([&] { return h.service().status().clients.size() == 2; }));
  EXPECT_EQ(ok(h.target().control(ControlVerb::Drain, "start")),
            "draining: new clients are refused; 1 client(s) connected besides kilnctl\n");
  RemoteOptions r;
  r.runtime_dir = h.dir();
  r.socket_name = "kilnd-test.sock";
  r.job = "late";
  Result<std::unique_ptr<RemoteTarget>> late = RemoteTarget::connect(r);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.error().message.find("the daemon is draining (kilnctl drain)"), std::string::npos)
      << late.error().message;
  r.job = "kilnctl-" + std::to_string(::getuid());
  EXPECT_TRUE(RemoteTarget::connect(r).ok()) << "the operator's kilnctl gets in while draining";
  worker.reset();
  EXPECT_TRUE(wait_until([&] {
    return ok(h.target().control(ControlVerb::Drain, "status", true)) == "{\"draining\":true,\"clients\":0}";
  }));
  const std::string metrics = h.service().metrics().to_prometheus();
  EXPECT_EQ(sample(metrics, "kiln_draining"), 1.0);
  EXPECT_EQ(sample(metrics, "kiln_refused_connections_total", "reason=\"draining\""), 1.0);
  KILN_ASSERT_OK(h.target().control(ControlVerb::Drain, "resume"));
  r.job = "late";
  EXPECT_TRUE(RemoteTarget::connect(r).ok());
  Result<std::string> bad = h.target().control(ControlVerb::Drain, "now");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("expected start, status or resume"), std::string::npos);
}

TEST(DaemonControl, ReloadAndStopNeedTheOwnersHooks) {
  auto dev = make_device();
  IpcHarness h(*dev);
  Result<std::string> r = h.target().control(ControlVerb::Reload);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no configuration file"), std::string::npos) << r.error().message;
  // Atomics: the hooks run on the session's thread, and the answer reaches this thread through
  // the ring's shared memory, mapped at another address (no happens-before ThreadSanitizer sees).
  std::atomic<int> reloads{0}, stops{0};
  h.service().set_control_hooks(ControlHooks{
      [&]() -> Result<std::string> { return std::string("reloaded " + std::to_string(++reloads)); }, [&] { ++stops; }});
  EXPECT_EQ(ok(h.target().control(ControlVerb::Reload)), "reloaded 1");
  KILN_ASSERT_OK(h.target().control(ControlVerb::Stop));
  EXPECT_EQ(stops, 1);
}

TEST(DaemonControl, JobsAndClientsListEveryOne) {
  auto dev = make_device();
  IpcHarness h(*dev, "alpha");
  auto beta = h.connect("beta");
  Session s(*beta);
  Tensor t = upload(s, 256);
  KILN_ASSERT_OK(s.sync());
  const std::string jobs = ok(h.target().control(ControlVerb::Jobs));
  EXPECT_NE(jobs.find("JOB"), std::string::npos) << jobs;
  EXPECT_NE(jobs.find("alpha"), std::string::npos) << jobs;
  EXPECT_NE(jobs.find("beta"), std::string::npos) << jobs;
  EXPECT_NE(jobs.find("1.0 KiB"), std::string::npos) << jobs;
  const std::string json = ok(h.target().control(ControlVerb::Jobs, "", true));
  EXPECT_NE(json.find("{\"name\":\"beta\",\"owner_uid\":" + std::to_string(::geteuid()) +
                      ",\"clients\":1,\"tensor_bytes\":1024,\"queued_ops\":0}"),
            std::string::npos)
      << json;
  const std::string clients = ok(h.target().control(ControlVerb::Clients));
  EXPECT_NE(clients.find(std::to_string(::getpid())), std::string::npos) << clients;
  (void)t;
}

// The metrics add up with the status, and count rejections and requests.
TEST(DaemonControl, MetricsAddUpWithTheStatus) {
  cpu::CpuBackend* cpu = nullptr;
  auto dev = make_device(&cpu);
  IpcHarness h(*dev, "watcher");
  h.service().set_backend_counters([cpu] {
    const cpu::CpuDeviceStats st = cpu->stats();
    BackendCounters c;
    c.fused_launches = st.fused_launches;
    c.single_ops = st.fast_ops + st.reference_ops;
    c.fused_replays = st.fused_replays;
    c.fallbacks_by_reason = st.fallbacks_by_reason;
    return c;
  });
  auto w1 = h.connect("train"), w2 = h.connect("train");
  auto s1 = std::make_unique<Session>(*w1);
  Session s2(*w2);
  for (Session* s : {s1.get(), &s2}) {
    for (int step = 0; step < 3; ++step) {
      Tensor x = upload(*s, 1024, 0.5f);
      Tensor y = ok(s->exp(ok(s->mul(ok(s->add(x, 1.0)), x))));
      EXPECT_NEAR(ok(s->to_host(std::move(y)))[0], std::exp(0.75), 1e-5);
    }
  }
  std::optional<Tensor> kept = upload(*s1, 4096);
  KILN_ASSERT_OK(s1->sync());
  // A drop is not answered: the last step's drops on the second connection are settled only by a
  // request behind them on that connection (without it, a loaded host saw 4 KiB too many).
  KILN_ASSERT_OK(s2.sync());
  const DaemonStatus st = h.service().status();
  const std::string m = h.service().metrics().to_prometheus();
  EXPECT_EQ(sample(m, "kiln_clients"), double(st.clients.size()));
  EXPECT_EQ(sample(m, "kiln_plans"), double(st.plans));
  EXPECT_EQ(sample(m, "kiln_plan_cache_hits_total"), double(st.cache_hits));
  EXPECT_EQ(sample(m, "kiln_plan_cache_misses_total"), double(st.explorations));
  EXPECT_EQ(sample(m, "kiln_launches_total", "kind=\"fused\""), double(st.fused_launches));
  EXPECT_GE(st.fused_launches, 6u);
  EXPECT_EQ(sample(m, "kiln_memory_bytes"), double(st.memory_bytes));
  const std::string train = "job=\"train\",owner_uid=\"" + std::to_string(::geteuid()) + "\"";
  EXPECT_EQ(sample(m, "kiln_job_clients", train), 2.0);
  EXPECT_EQ(sample(m, "kiln_job_memory_bytes", train), 4096.0 * 4);
  // add, mul and exp per step, 3 steps, 2 clients (uploads are not operations).
  EXPECT_EQ(sample(m, "kiln_job_ops_total", train), 18.0);
  EXPECT_GE(sample(m, "kiln_job_ops_executed_total", train).value_or(0), 18.0);  // and the drops
  // Only this job ran anything: its plan counters are the device's.
  EXPECT_EQ(sample(m, "kiln_job_plan_cache_hits_total", train), double(st.cache_hits));
  EXPECT_EQ(sample(m, "kiln_job_plan_cache_misses_total", train), double(st.explorations));
  EXPECT_EQ(sample(m, "kiln_job_plans_created_total", train), double(st.plans));
  // Each step is one elementwise block: the job's plans asked for the launches the backend made.
  EXPECT_EQ(sample(m, "kiln_job_launches_total", train + ",kind=\"fused\""), double(st.fused_launches));
  // Every read is one answered request; the histogram's count says so.
  EXPECT_EQ(sample(m, "kiln_request_duration_seconds_count", "command=\"read\""), 6.0);
  EXPECT_EQ(sample(m, "kiln_request_duration_seconds_bucket", "command=\"read\",le=\"+Inf\""), 6.0);
  // The counts survive the clients: a job's counters go with the job, the device's stay.
  kept.reset();
  s1.reset();
  w1.reset();
  EXPECT_TRUE(wait_until([&] { return h.service().status().clients.size() == st.clients.size() - 1; }));
  const std::string later = h.service().metrics().to_prometheus();
  EXPECT_EQ(sample(later, "kiln_request_duration_seconds_count", "command=\"read\""), 6.0);
  EXPECT_EQ(sample(later, "kiln_job_ops_total", train), 18.0) << "the departed client's ops stay with its job";
  EXPECT_EQ(sample(later, "kiln_job_plan_cache_hits_total", train), sample(later, "kiln_plan_cache_hits_total"))
      << "the departed client's streams' counters stay with its job";
  EXPECT_EQ(sample(later, "kiln_job_clients", train), 1.0);
}

TEST(DaemonControl, RejectedRequestsAreCountedByCode) {
  auto dev = make_device();
  IpcHarness h(*dev, "bad-client");
  Session s(h.target());
  Tensor t = upload(s, 4);
  EXPECT_FALSE(h.target().control(ControlVerb::Disconnect, "seven").ok());  // refused by the daemon
  const std::string m = h.service().metrics().to_prometheus();
  double rejected = 0;
  for (const char* code : {"invalid_handle", "invalid"})
    rejected += sample(m, "kiln_rejected_requests_total", std::string("code=\"") + code + "\"").value_or(0);
  EXPECT_EQ(rejected, 1.0) << m;
  EXPECT_EQ(sample(m, "kiln_job_rejected_requests_total", "job=\"bad-client\",code=\"invalid\""), 1.0) << m;
  (void)t;
}

TEST(DaemonControl, TheExpositionIsWellFormed) {
  DaemonMetrics m;
  m.device = "cpu";
  JobMetrics j;
  j.name = "we\"ird\\job\nname";
  j.fallbacks["aten::flip"] = 3;
  m.jobs.push_back(j);
  m.requests[static_cast<std::size_t>(CommandKind::Sync) - 1].counts[0] = 2;                    // <= 1 us
  m.requests[static_cast<std::size_t>(CommandKind::Sync) - 1].counts[kLatencyBuckets - 1] = 1;  // > 2.5 s
  m.requests[static_cast<std::size_t>(CommandKind::Sync) - 1].sum_ns = 3'000'000'000;
  const std::string text = m.to_prometheus();
  EXPECT_NE(text.find("kiln_job_clients{job=\"we\\\"ird\\\\job\\nname\",owner_uid=\"0\"} 0\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kiln_request_duration_seconds_bucket{command=\"sync\",le=\"1e-06\"} 2\n"), std::string::npos)
      << text.substr(text.find("kiln_request_duration_seconds_bucket"), 300);
  EXPECT_NE(text.find("kiln_request_duration_seconds_bucket{command=\"sync\",le=\"2.5\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kiln_request_duration_seconds_bucket{command=\"sync\",le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("kiln_request_duration_seconds_sum{command=\"sync\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("kiln_request_duration_seconds_count{command=\"sync\"} 3\n"), std::string::npos);
  EXPECT_EQ(text.find("command=\"read\""), std::string::npos) << "kinds never answered have no series";
  // Every line is a comment or "name{labels} value".
  std::size_t lines = 0;
  for (std::size_t at = 0; at < text.size(); at = text.find('\n', at) + 1, ++lines) {
    const std::string line = text.substr(at, text.find('\n', at) - at);
    if (line.rfind("# ", 0) == 0) continue;
    EXPECT_EQ(line.rfind("kiln_", 0), 0u) << line;
    EXPECT_NE(line.rfind(' '), std::string::npos) << line;
  }
  EXPECT_GT(lines, 40u);
}

TEST(DaemonControl, LatencyHistogramsBucketByUpperBound) {
  LatencyHistogram h;
  h.observe(std::chrono::nanoseconds(1000));  // le 1 us
  h.observe(std::chrono::nanoseconds(1001));  // le 2.5 us
  h.observe(std::chrono::seconds(10));        // +Inf
  h.observe(std::chrono::nanoseconds(-5));    // a clock that went back counts as 0
  const LatencySnapshot s = h.snapshot();
  EXPECT_EQ(s.counts[0], 2u);
  EXPECT_EQ(s.counts[1], 1u);
  EXPECT_EQ(s.counts[kLatencyBuckets - 1], 1u);
  EXPECT_EQ(s.count(), 4u);
  EXPECT_EQ(s.sum_ns, 10'000'002'001u);
}

// kilnctl plans: the store's listing with who created and ran each plan, one plan as DOT, and
// clear by job (retired plans are no longer matched: the job's next run explores again).
TEST(DaemonControl, PlansListShowAndClearByJob) {
  auto dev = make_device();
  IpcHarness h(*dev, "operator");
  auto run_program = [&](const std::string& job) {
    auto client = h.connect(job);
    {
      Session s(*client);
      Tensor x = upload(s, 256, 0.5f);
      Tensor y = ok(s.tanh(ok(s.exp(ok(s.mul(x, 2.0))))));
      EXPECT_NEAR(ok(s.to_host(std::move(y)))[0], std::tanh(std::exp(1.0)), 1e-5);
    }
    client.reset();
    EXPECT_TRUE(wait_until([&] { return h.service().status().clients.size() == 1; }));
  };
  run_program("alpha");
  const std::uint64_t explorations = dev->totals().explorations;
  run_program("beta");  // the same program: beta hits alpha's plans
  EXPECT_EQ(dev->totals().explorations, explorations);
  const std::string json = ok(h.target().control(ControlVerb::Plans, "list hits 0", true));
  EXPECT_NE(json.find("\"created_by\":\"alpha\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"used_by\":[\"beta\"]"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"created_by\":\"beta\""), std::string::npos) << json;
  const std::string text = ok(h.target().control(ControlVerb::Plans, "list"));
  EXPECT_NE(text.find(fmt::format("{} plans (0 evicted, 0 retired)", dev->plan_store().size())), std::string::npos)
      << text;
  EXPECT_NE(text.find("CREATED BY"), std::string::npos) << text;
  const fusion::PlanId first = dev->plan_store().ids().front();
  const std::string dot = ok(h.target().control(ControlVerb::Plans, fmt::format("show {} dot", first)));
  EXPECT_EQ(dot.rfind(fmt::format("digraph plan_{} {{", first), 0), 0u) << dot;
  EXPECT_NE(dot.find("subgraph cluster_0"), std::string::npos) << dot;
  EXPECT_NE(
      ok(h.target().control(ControlVerb::Plans, fmt::format("show {}", first))).find(fmt::format("plan #{}:", first)),
      std::string::npos);
  Result<std::string> bad = h.target().control(ControlVerb::Plans, "show 99999 dot");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("no plan 99999 in the store"), std::string::npos) << bad.error().message;
  bad = h.target().control(ControlVerb::Plans, fmt::format("show {} svg", first));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("format 'svg': expected text or dot"), std::string::npos);
  bad = h.target().control(ControlVerb::Plans, "clear gamma");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("no job 'gamma'"), std::string::npos);
  // beta created nothing; alpha's plans go, and the next run explores again.
  EXPECT_EQ(ok(h.target().control(ControlVerb::Plans, "clear beta")).rfind("retired 0 of", 0), 0u);
  const std::size_t plans = dev->plan_store().size();
  EXPECT_EQ(ok(h.target().control(ControlVerb::Plans, "clear alpha")),
            fmt::format("retired {} of {} plans (created by job alpha); plans held by running streams finish their "
                        "runs\n",
                        plans, plans));
  EXPECT_EQ(dev->plan_store().size(), 0u);
  run_program("beta");
  EXPECT_GT(dev->totals().explorations, explorations) << "retired plans are no longer matched";
  EXPECT_NE(ok(h.target().control(ControlVerb::Plans, "list", true)).find("\"created_by\":\"beta\""),
            std::string::npos);
}

// ---- The HTTP endpoint

// One HTTP exchange on a connected socket: sends `request`, reads to EOF.
std::string exchange(int fd, const std::string& request) {
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  return fd;
}

int connect_tcp(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  return fd;
}

TEST(MetricsEndpoint, ServesTheExpositionOverHttpOnAUnixSocket) {
  auto dev = make_device();
  IpcHarness h(*dev, "scraped");
  MetricsServerOptions o;
  o.default_unix_path = h.dir() + "/kilnd-test.metrics";
  o.body = [&] { return h.service().metrics().to_prometheus(); };
  auto server = ok(MetricsServer::start(o));
  EXPECT_EQ(server->address(), "unix:" + h.dir() + "/kilnd-test.metrics");
  // The daemon lists the harness's client once its session starts, just after the handshake.
  ASSERT_TRUE(wait_until([&] { return h.service().status().clients.size() == 1; }));
  const std::string path = h.dir() + "/kilnd-test.metrics";
  const std::string got = exchange(connect_unix(path), "GET /metrics HTTP/1.1\r\nHost: kilnd\r\n\r\n");
  ASSERT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos);
  const std::string body = got.substr(got.find("\r\n\r\n") + 4);
  EXPECT_NE(got.find(fmt::format("Content-Length: {}\r\n", body.size())), std::string::npos);
  EXPECT_EQ(sample(body, "kiln_clients"), 1.0);
  EXPECT_EQ(server->scrapes(), 1u);
  EXPECT_EQ(exchange(connect_unix(path), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  EXPECT_EQ(exchange(connect_unix(path), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(exchange(connect_unix(path), "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange(connect_unix(path), "GET /metrics HTTP/1.1\r\n" + std::string(9000, 'x')).rfind("HTTP/1.1 400", 0),
            0u);
  const std::string head = exchange(connect_unix(path), "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK", 0), 0u);
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");
  // The socket file is the daemon user's own (0600 without an allowed group), and goes at stop.
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  server->stop();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(MetricsEndpoint, ServesOnALoopbackPort) {
  MetricsServerOptions o;
  o.listen = ok(parse_metrics_listen("tcp:127.0.0.1:0", false));
  o.body = [] { return std::string("kiln_up 1\n"); };
  auto server = ok(MetricsServer::start(o));
  const std::string address = server->address();
  ASSERT_EQ(address.rfind("tcp:127.0.0.1:", 0), 0u) << address;
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(14)));
  const std::string got = exchange(connect_tcp(port), "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(got.substr(got.find("\r\n\r\n") + 4), "kiln_up 1\n");
}

TEST(MetricsEndpoint, ListenSettingsAreChecked) {
  EXPECT_EQ(ok(parse_metrics_listen("unix", false)).kind, MetricsListen::Kind::Unix);
  EXPECT_EQ(ok(parse_metrics_listen("unix:/run/kiln/m.sock", false)).path, "/run/kiln/m.sock");
  const MetricsListen v6 = ok(parse_metrics_listen("tcp:[::1]:9464", false));
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 9464);
  auto message = [](std::string_view text, bool remote = false) {
    Result<MetricsListen> r = parse_metrics_listen(text, remote);
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_NE(message("tcp:0.0.0.0:9464").find("not a loopback address"), std::string::npos);
  EXPECT_EQ(message("tcp:0.0.0.0:9464", true), "ok");
  EXPECT_NE(message("tcp:127.0.0.1:99999").find("port '99999' is not 0..65535"), std::string::npos);
  EXPECT_NE(message("tcp:localhost:9464").find("'localhost' is not an IP address"), std::string::npos);
  EXPECT_NE(message("unix:relative").find("must be absolute"), std::string::npos);
  EXPECT_NE(message("http://x").find("expected unix, unix:PATH"), std::string::npos);
}

// ---- JSON logs

TEST(JsonLogs, EveryLineIsOneObjectWithItsClientJobAndStream) {
  EXPECT_EQ(
      json_log_line("2026-12-06T12:00:00.000001Z", "info", 42, 7, "plain", nullptr),
      "{\"time\":\"2026-12-06T12:00:00.000001Z\",\"level\":\"info\",\"pid\":42,\"thread\":7,\"msg\":\"plain\"}\n");
  const LogScope session(3, "my \"job\"");
  {
    const LogScope stream(std::nullopt, "", 9);
    EXPECT_EQ(json_log_line("t", "warn", 1, 2, "line\nwith \\ and \x01", current_log_scope()),
              "{\"time\":\"t\",\"level\":\"warn\",\"pid\":1,\"thread\":2,\"client\":3,\"job\":\"my \\\"job\\\"\","
              "\"stream\":9,\"msg\":\"line\\nwith \\\\ and \\u0001\"}\n");
  }
  EXPECT_EQ(json_log_line("t", "info", 1, 2, "m", current_log_scope()),
            "{\"time\":\"t\",\"level\":\"info\",\"pid\":1,\"thread\":2,\"client\":3,\"job\":\"my "
            "\\\"job\\\"\",\"msg\":\"m\"}\n");
  EXPECT_FALSE(parse_log_format("xml").ok());
}

// ---- Only the daemon's uid and root

TEST(DaemonControl, OtherUidsAreRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: it creates the user " << kiln::testing::kPeerUser;
  ASSERT_EQ(kiln::testing::ensure_peer_user(), "");
  const group* g = getgrnam(kiln::testing::kPeerGroup);
  ASSERT_NE(g, nullptr);
  char tmpl[] = "/tmp/kiln-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  ASSERT_EQ(chmod(tmpl, 0755), 0);
  const std::string dir = std::string(tmpl) + "/run";
  auto dev = make_device();
  DaemonOptions o;
  o.server.runtime_dir = dir;
  o.server.socket_name = daemon_socket_name("cpu");
  o.server.allowed_gid = g->gr_gid;
  auto service = ok(DaemonService::start(*dev, o));
  for (const char* command : {"jobs", "clients", "limits", "limits set uid_jobs=1", "disconnect 1", "drain", "reload",
                              "metrics", "stop", "plans", "plans clear"}) {
    const auto [rc, out] = kiln::testing::run_as_peer(
        kiln::testing::kPeerGroup, std::string(KILN_KILNCTL_PATH) + " " + command + " --runtime-dir " + dir);
    EXPECT_EQ(rc, 1) << command << ": " << out;
    EXPECT_NE(out.find("is for the daemon's user (uid 0) and root only"), std::string::npos) << command << ": " << out;
  }
  EXPECT_EQ(service->limits().uid_jobs, DaemonOptions{}.uid_jobs) << "nothing changed";
  // The peer still reads the status (its own share of it).
  const auto [rc, out] = kiln::testing::kilnctl_as_peer(dir, kiln::testing::kPeerGroup, daemon_socket_name("cpu"));
  EXPECT_EQ(rc, 0) << out;
  service->stop();
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

}  // namespace
}  // namespace kiln::ipc

// kiln_hostile: one hostile client against a running daemon, for tests that need another uid
// (run under setpriv) and for the scripts that measure what a hostile client costs the others
// (scripts/measure-hostile.sh). Not installed.
//
//   kiln_hostile --runtime-dir DIR --socket NAME [--job NAME] [--seconds S] MODE
//     join          connect under the job; print "accepted" or "refused: REASON"; hold S seconds
//     spam-doorbell ring the command doorbell for S seconds without sending; print the writes
//     never-pop     fill the completion ring and never pop it; hold S seconds
//     flood         open up to 200 connections and hold them S seconds; print accepted/refused
//     alloc         ask for a zeros tensor of --mib MiB (f32) and sync; print "sync: ok" or the error
//
// Exit status: 0 when the mode ran (a refusal in `join` is a result, printed), 2 on bad usage.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "hostile.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/ir/builders.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kiln_hostile --runtime-dir DIR --socket NAME [--job NAME] [--seconds S] "
               "[--mib N] join|spam-doorbell|never-pop|flood|alloc\n");
  return 2;
}

// A zeros tensor of `mib` MiB, then a sync: the allocation happens on the daemon's device, and the
// sync reports its failure (issue 19.2). The daemon must survive a request past its memory limit.
int alloc(const kiln::testing::hostile::Target& target, const std::string& job, std::uint64_t mib) {
  kiln::ipc::RemoteOptions o;
  o.runtime_dir = target.runtime_dir;
  o.socket_name = target.socket_name;
  o.job = job;
  auto remote = kiln::ipc::RemoteTarget::connect(o);
  if (!remote.ok()) {
    std::printf("refused: %s\n", remote.error().message.c_str());
    return 0;
  }
  kiln::ipc::RemoteTarget& t = **remote;
  const kiln::ir::Shape shape{mib, std::uint64_t{1} << 18};  // rows of 1 MiB of f32
  const kiln::ir::TensorId zeros = t.new_tensor_id();
  auto op = kiln::ir::build::creation(kiln::ir::Family::BaseFloat, kiln::ir::OpKind::Base_Zeros, shape,
                                      kiln::ir::dtypes::f32, zeros);
  if (!op.ok()) return usage();
  const kiln::runtime::StreamId stream(0);
  kiln::Status st = t.register_op(stream, std::move(op).value());
  if (st.ok()) st = t.drain(stream);
  std::printf("sync: %s\n", st.ok() ? "ok" : st.error().to_string().c_str());
  (void)t.drop(stream, kiln::ir::TensorIr{zeros, shape, kiln::ir::TensorStatus::ReadWrite, kiln::ir::dtypes::f32});
  (void)t.drain(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace hostile = kiln::testing::hostile;
  hostile::Target target;
  std::string job = "hostile", mode;
  double seconds = 1.0;
  std::uint64_t mib = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--runtime-dir" && has_value)
      target.runtime_dir = argv[++i];
    else if (a == "--socket" && has_value)
      target.socket_name = argv[++i];
    else if (a == "--job" && has_value)
      job = argv[++i];
    else if (a == "--seconds" && has_value)
      seconds = std::atof(argv[++i]);
    else if (a == "--mib" && has_value)
      mib = std::strtoull(argv[++i], nullptr, 10);
    else if (mode.empty() && a.rfind("--", 0) != 0)
      mode = a;
    else
      return usage();
  }
  if (mode.empty() || target.socket_name.empty()) return usage();
  const auto hold = std::chrono::milliseconds(static_cast<long long>(seconds * 1000));

  if (mode == "flood") {
    hostile::Flood f = hostile::flood_connections(target, 200, job);
    std::printf("accepted %zu refused %llu%s%s\n", f.open.size(), static_cast<unsigned long long>(f.refused),
                f.refused ? ": " : "", f.last_refusal.c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(hold);
    return 0;
  }
  if (mode == "alloc") return alloc(target, job, mib);
  auto conn = hostile::connect(target, job);
  if (!conn.ok()) {
    std::printf("refused: %s\n", conn.error().message.c_str());
    return 0;
  }
  if (mode == "join") {
    std::printf("accepted\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(hold);
  } else if (mode == "spam-doorbell") {
    const std::uint64_t writes = hostile::spam_doorbell(*conn, hold);
    std::printf("doorbell writes %llu\n", static_cast<unsigned long long>(writes));
  } else if (mode == "never-pop") {
    const std::uint64_t sent = hostile::fill_without_popping(*conn, std::chrono::seconds(30));
    std::printf("sent %llu commands, popped none\n", static_cast<unsigned long long>(sent));
    std::fflush(stdout);
    std::this_thread::sleep_for(hold);
  } else {
    return usage();
  }
  return 0;
}

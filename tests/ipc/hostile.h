// Hostile clients for the daemon's tests and scripts: each misbehaves the way issue 19 tried the
// daemon (predicting export tokens, claiming jobs, flooding connections, never popping
// completions, spamming doorbells), through the real control socket and segment, never by
// reaching into the daemon.
//
// Used by tests/ipc/hostile_test.cc in process and by the kiln_hostile tool (hostile_main.cc)
// that scripts and tests run as another user or next to a real kilnd.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/ipc/control_client.h"
#include "kiln/ipc/protocol.h"

namespace kiln::testing::hostile {

struct Target {
  std::string runtime_dir;
  std::string socket_name;
};

inline Result<ipc::ClientConnection> connect(const Target& t, const std::string& job) {
  ipc::ClientOptions o;
  o.runtime_dir = t.runtime_dir;
  o.socket_name = t.socket_name;
  o.job = job;
  return ipc::connect_to_daemon(o);
}

// Sends status requests (whose completions are the largest the daemon writes unasked for data)
// and never pops a completion, until the daemon stops taking commands: its completion ring is
// full and its session waits for room. Returns the commands sent.
inline std::uint64_t fill_without_popping(ipc::ClientConnection& c, std::chrono::milliseconds give_up) {
  std::vector<std::uint8_t> msg;
  std::uint64_t sent = 0;
  const auto end = std::chrono::steady_clock::now() + give_up;
  while (std::chrono::steady_clock::now() < end) {
    msg.clear();
    if (!ipc::encode_command(ipc::Command{sent + 1, ipc::StatusCmd{true}}, msg).ok()) break;
    // A command ring that stays full for 200 ms: the daemon is stuck on our completions.
    if (!c.endpoint().send(msg, std::chrono::milliseconds(200)).ok()) break;
    ++sent;
  }
  return sent;
}

// Rings the daemon's command doorbell without sending anything, for `how_long`. Returns the
// doorbell writes made.
inline std::uint64_t spam_doorbell(ipc::ClientConnection& c, std::chrono::milliseconds how_long) {
  const int bell = c.endpoint().bell_fd(ipc::Bell::CommandData);
  const auto end = std::chrono::steady_clock::now() + how_long;
  std::uint64_t writes = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 256; ++i) {
      const eventfd_t one = 1;
      if (::write(bell, &one, sizeof one) == static_cast<ssize_t>(sizeof one)) ++writes;
    }
  }
  return writes;
}

// Opens up to `n` connections under one job name and keeps them: the accepted ones, and the
// refusal messages of the others (the last one's reason is what a user would see).
struct Flood {
  std::vector<ipc::ClientConnection> open;
  std::uint64_t refused = 0;
  std::string last_refusal;
};
inline Flood flood_connections(const Target& t, std::size_t n, const std::string& job) {
  Flood f;
  for (std::size_t i = 0; i < n; ++i) {
    auto c = connect(t, job);
    if (c.ok()) {
      f.open.push_back(std::move(c).value());
    } else {
      ++f.refused;
      f.last_refusal = c.error().message;
    }
  }
  return f;
}

// The next `n` outputs of a std::mt19937_64 whose last 312 outputs were `seen` (the attack that
// rebuilt the daemon's old token generator): each output is untempered into the state word it
// came from, and an engine loaded with those 312 words goes on exactly where the seen one was.
inline std::vector<std::uint64_t> predict_mt19937_64(std::span<const std::uint64_t> seen, std::size_t n) {
  constexpr std::size_t kWords = 312;
  if (seen.size() < kWords) return {};
  auto untemper = [](std::uint64_t y) {
    y ^= y >> 43;
    y ^= (y << 37) & 0xFFF7EEE000000000ull;
    std::uint64_t x = y;
    for (int i = 0; i < 4; ++i) x = y ^ ((x << 17) & 0x71D67FFFEDA60000ull);
    y = x;
    for (int i = 0; i < 3; ++i) x = y ^ ((x >> 29) & 0x5555555555555555ull);
    return x;
  };
  std::stringstream state;
  for (std::size_t i = seen.size() - kWords; i < seen.size(); ++i) state << untemper(seen[i]) << ' ';
  state << kWords;  // the position: the next output regenerates the state
  std::mt19937_64 engine;
  state >> engine;
  std::vector<std::uint64_t> next(n);
  for (auto& v : next) v = engine();
  return next;
}

}  // namespace kiln::testing::hostile

// IpcHarness: a daemon service over a test's Device, listening in a private runtime directory,
// and one client connection to it — so that a suite written against runtime::Session runs
// through the IPC client library and the daemon unchanged (the API suite is built this way as
// runtime_api_test_ipc).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "kiln/ipc/daemon.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/testing/status.h"

namespace kiln::testing {

// Polls `done` every 10 ms until it holds or `limit` passes; whether it held. A deadline for a
// condition, never a speed.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

class IpcHarness {
 public:
  // `options`: the daemon's, but for the runtime directory and socket, which the harness picks.
  explicit IpcHarness(runtime::Device& device, std::string job = "test", ipc::DaemonOptions options = {}) {
    char tmpl[] = "/tmp/kiln-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    ipc::DaemonOptions o = std::move(options);
    o.server.runtime_dir = dir_;
    o.server.socket_name = "kilnd-test.sock";
    auto service = ipc::DaemonService::start(device, o);
    if (!service.ok()) {
      ADD_FAILURE() << service.error().to_string();
      return;
    }
    service_ = std::move(service).value();
    remote_ = connect(std::move(job));
  }
  ~IpcHarness() {
    remote_.reset();
    if (service_) service_->stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  IpcHarness(const IpcHarness&) = delete;
  IpcHarness& operator=(const IpcHarness&) = delete;

  // Another client of the same daemon.
  std::unique_ptr<ipc::RemoteTarget> connect(std::string job) {
    ipc::RemoteOptions r;
    r.runtime_dir = dir_;
    r.socket_name = "kilnd-test.sock";
    r.job = std::move(job);
    auto remote = ipc::RemoteTarget::connect(r);
    if (!remote.ok()) {
      ADD_FAILURE() << remote.error().to_string();
      return nullptr;
    }
    return std::move(remote).value();
  }

  ipc::RemoteTarget& target() { return *remote_; }
  ipc::DaemonService& service() { return *service_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::unique_ptr<ipc::DaemonService> service_;
  std::unique_ptr<ipc::RemoteTarget> remote_;
};

}  // namespace kiln::testing

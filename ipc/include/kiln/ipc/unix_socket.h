// Unix-socket plumbing shared by the daemon and client sides: the runtime directory, socket
// paths, peer credentials and descriptor passing (SCM_RIGHTS).
//
// Thread-safety: plain functions over file descriptors the caller owns.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ipc/fd.h"
#include "kiln/ipc/handshake.h"

namespace kiln::ipc {

// The CPU daemon's socket (daemon_socket_name("cpu")): what a client and a server use unless
// told otherwise; a GPU daemon listens on kilnd-cuda-<N>.sock.
inline constexpr const char* kDefaultSocketName = "kilnd-cpu.sock";

// $XDG_RUNTIME_DIR/kiln when XDG_RUNTIME_DIR is set, else /tmp/kiln-<euid>.
std::string default_runtime_dir();

// A device's daemon files are named from one stem: "kilnd-cpu", "kilnd-cuda-0" (the socket
// adds ".sock": daemon_socket_name, the lock ".lock": device_lock_name).
std::string daemon_file_stem(const std::string& device);
// The control socket's file name for a device: "kilnd-cpu.sock", "kilnd-cuda-0.sock". One
// daemon per device: a second one finds the first answering on this name and refuses to start.
std::string daemon_socket_name(const std::string& device);

// Creates `path` (one level; its parent must exist) with mode 0700, or 0710 with group
// `group` when other users of that group may connect (they need search permission to reach
// the socket, never listing). An existing directory is accepted only if it is a real
// directory (not a symlink) owned by our euid with exactly that mode; otherwise an error says
// why ("runtime dir /run/user/1000/kiln has mode 0755, expected 0700").
Status ensure_runtime_dir(const std::string& path, std::optional<gid_t> group = std::nullopt);

// dir + "/" + name, or an error if it does not fit sockaddr_un (107 bytes).
Result<std::string> socket_path(const std::string& dir, const std::string& name);

// SO_PEERCRED (+ SO_PEERGROUPS when available) of a connected Unix socket.
Result<PeerCredentials> peer_credentials(int socket_fd);

// Sends all of `bytes` with `fds` attached to the first byte (SCM_RIGHTS). Waits up to
// `timeout` for room if the socket is non-blocking and full. MSG_NOSIGNAL: a closed peer is an
// error value, not SIGPIPE.
Status send_with_fds(int socket_fd, std::span<const std::uint8_t> bytes, std::span<const int> fds,
                     std::chrono::milliseconds timeout);

// Reads exactly out.size() bytes (blocking socket; SO_RCVTIMEO bounds each read), appending
// every descriptor that arrives to `fds` (close-on-exec; extras are the caller's to reject).
// Errors: EOF before the end ("connection closed after N of M bytes"), a timeout, truncated
// control data.
Status recv_exact_with_fds(int socket_fd, std::span<std::uint8_t> out, std::vector<UniqueFd>& fds);

}  // namespace kiln::ipc

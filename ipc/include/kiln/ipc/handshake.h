// The control-socket handshake as plain data: peer credentials and the policy that admits them,
// job names, and the hello / reply frames. No I/O here (control_server.h, control_client.h).
//
// Frames on the control socket (little-endian):
//   prefix = magic u32, version u16, body_len u16        (8 bytes; this prefix never changes
//                                                        between versions, so a daemon and a
//                                                        client of different versions can
//                                                        still tell each other so)
//   hello  (client -> daemon): magic "KLNH", body = job name (1..kMaxJobNameBytes bytes)
//   reply  (daemon -> client): magic "KLNR", body = status u8 (0 accepted, 1 refused),
//          reserved u8 (0), reason_len u16, num_fds u32, client_id u64, reason bytes
//          An accepted reply carries num_fds = 5 descriptors (SCM_RIGHTS, attached to its
//          bytes): the segment memfd, then the doorbells in Bell order (endpoint.h).
//
// Thread-safety: pure functions.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/result.h"

namespace kiln::ipc {

inline constexpr std::uint32_t kHelloMagic = 0x484E4C4B;  // "KLNH"
inline constexpr std::uint32_t kReplyMagic = 0x524E4C4B;  // "KLNR"
inline constexpr std::size_t kFramePrefixBytes = 8;
inline constexpr std::size_t kMaxJobNameBytes = 64;
inline constexpr std::size_t kMaxReasonBytes = 512;
inline constexpr std::size_t kMaxFrameBodyBytes = 1024;  // any version: bounds what the daemon reads
inline constexpr std::uint32_t kHandshakeFds = 5;        // memfd + 4 doorbells

// Who is on the other end of a Unix socket, from SO_PEERCRED (and SO_PEERGROUPS when the kernel
// has it: supplementary groups, so an allowed group works for members whose primary group it
// is not).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

// Who may connect. The daemon's own uid always may; members of `allowed_gid` may too.
struct CredentialPolicy {
  uid_t own_uid = 0;
  std::optional<gid_t> allowed_gid;
  // Own uid = this process's effective uid.
  static CredentialPolicy for_this_process(std::optional<gid_t> allowed_gid = std::nullopt);
};

// Ok, or ErrorCode::Invalid with the reason the client sees after "refused: ":
// "uid 1001 not allowed" (or "uid 1001 (gid 1001) not allowed: not the daemon's uid 1000 nor
// in group 2000" when a group is configured).
Status check_peer(const CredentialPolicy& policy, const PeerCredentials& peer);

// The client's side: the daemon at the other end of the socket (SO_PEERCRED, as of its
// listen()) must run as `own_uid` (the client's effective uid) or as root; anything else is a
// socket another user planted, not trusted. Ok, or ErrorCode::Invalid: "the daemon runs as uid
// 1001, neither this process's uid 1000 nor root".
Status check_daemon_peer(uid_t own_uid, const PeerCredentials& daemon);

// A job name (quotas apply per job): 1..64 bytes of [A-Za-z0-9._-], not starting with '.'.
// Errors name the first bad character: "job name: byte 0x2f at 3 is not allowed (use A-Z a-z
// 0-9 . _ -)".
Status validate_job_name(std::string_view job);

struct FramePrefix {
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  std::uint16_t body_len = 0;
};
// Decodes the 8-byte prefix; checks only that body_len <= kMaxFrameBodyBytes.
Result<FramePrefix> decode_prefix(std::span<const std::uint8_t> bytes);

struct Hello {
  std::uint16_t version = 0;
  std::string job;
};
std::vector<std::uint8_t> encode_hello(const Hello& hello);
// Decodes a hello frame body (after its prefix); the job name is validated.
Result<Hello> decode_hello(const FramePrefix& prefix, std::span<const std::uint8_t> body);

struct Reply {
  std::uint16_t version = 0;
  bool accepted = false;
  std::uint32_t num_fds = 0;
  std::uint64_t client_id = 0;
  std::string reason;  // for a refusal; at most kMaxReasonBytes (longer ones are truncated)
};
std::vector<std::uint8_t> encode_reply(const Reply& reply);
// Decodes a reply frame body (after its prefix). Only the version-independent checks when
// prefix.version differs from ours (the caller reports the mismatch).
Result<Reply> decode_reply(const FramePrefix& prefix, std::span<const std::uint8_t> body);

}  // namespace kiln::ipc

#include "kiln/ipc/handshake.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace kiln::ipc {

namespace {
void put_le(std::vector<std::uint8_t>& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint64_t get_le(std::span<const std::uint8_t> b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{b[at + static_cast<std::size_t>(i)]} << (8 * i);
  return v;
}
Error bad(const std::string& what) { return make_error(ErrorCode::Decode, "handshake: " + what); }
}  // namespace

CredentialPolicy CredentialPolicy::for_this_process(std::optional<gid_t> allowed_gid) {
  return CredentialPolicy{::geteuid(), allowed_gid};
}

Status check_peer(const CredentialPolicy& policy, const PeerCredentials& peer) {
  if (peer.uid == policy.own_uid) return Status::Ok();
  if (policy.allowed_gid) {
    const gid_t g = *policy.allowed_gid;
    if (peer.gid == g || std::find(peer.groups.begin(), peer.groups.end(), g) != peer.groups.end()) {
      return Status::Ok();
    }
    return make_error(ErrorCode::Invalid, "uid " + std::to_string(peer.uid) + " (gid " + std::to_string(peer.gid) +
                                              ") not allowed: not the daemon's uid " + std::to_string(policy.own_uid) +
                                              " nor in group " + std::to_string(g));
  }
  return make_error(ErrorCode::Invalid, "uid " + std::to_string(peer.uid) + " not allowed");
}

Status check_daemon_peer(uid_t own_uid, const PeerCredentials& daemon) {
  if (daemon.uid == own_uid || daemon.uid == 0) return Status::Ok();
  return make_error(ErrorCode::Invalid, "the daemon runs as uid " + std::to_string(daemon.uid) +
                                            ", neither this process's uid " + std::to_string(own_uid) + " nor root");
}

Status validate_job_name(std::string_view job) {
  if (job.empty() || job.size() > kMaxJobNameBytes) {
    return make_error(ErrorCode::Invalid, "job name: length " + std::to_string(job.size()) + " is outside [1, " +
                                              std::to_string(kMaxJobNameBytes) + "]");
  }
  for (std::size_t i = 0; i < job.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(job[i]);
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || (c == '.' && i > 0);
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      return make_error(ErrorCode::Invalid, "job name: byte " + std::string(hex) + " at " + std::to_string(i) +
                                                " is not allowed (use A-Z a-z 0-9 . _ -, not starting with .)");
    }
  }
  return Status::Ok();
}

Result<FramePrefix> decode_prefix(std::span<const std::uint8_t> b) {
  if (b.size() != kFramePrefixBytes) return bad("frame prefix of " + std::to_string(b.size()) + " bytes");
  FramePrefix p;
  p.magic = static_cast<std::uint32_t>(get_le(b, 0, 4));
  p.version = static_cast<std::uint16_t>(get_le(b, 4, 2));
  p.body_len = static_cast<std::uint16_t>(get_le(b, 6, 2));
  if (p.body_len > kMaxFrameBodyBytes) {
    return bad("frame body of " + std::to_string(p.body_len) + " bytes exceeds the limit " +
               std::to_string(kMaxFrameBodyBytes));
  }
  return p;
}

std::vector<std::uint8_t> encode_hello(const Hello& h) {
  std::vector<std::uint8_t> out;
  const std::size_t n = std::min(h.job.size(), kMaxFrameBodyBytes);  // over-long: the daemon refuses it
  put_le(out, kHelloMagic, 4);
  put_le(out, h.version, 2);
  put_le(out, n, 2);
  out.insert(out.end(), h.job.begin(), h.job.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

Result<Hello> decode_hello(const FramePrefix& p, std::span<const std::uint8_t> body) {
  if (p.magic != kHelloMagic) return bad("bad hello magic (not a kiln client)");
  if (body.size() != p.body_len) return bad("hello body size mismatch");
  Hello h;
  h.version = p.version;
  h.job.assign(body.begin(), body.end());
  KILN_RETURN_IF_ERROR(validate_job_name(h.job));
  return h;
}

std::vector<std::uint8_t> encode_reply(const Reply& r) {
  const std::size_t reason_len = std::min(r.reason.size(), kMaxReasonBytes);
  std::vector<std::uint8_t> out;
  put_le(out, kReplyMagic, 4);
  put_le(out, r.version, 2);
  put_le(out, 16 + reason_len, 2);
  out.push_back(r.accepted ? 0 : 1);
  out.push_back(0);
  put_le(out, reason_len, 2);
  put_le(out, r.num_fds, 4);
  put_le(out, r.client_id, 8);
  out.insert(out.end(), r.reason.begin(), r.reason.begin() + static_cast<std::ptrdiff_t>(reason_len));
  return out;
}

Result<Reply> decode_reply(const FramePrefix& p, std::span<const std::uint8_t> body) {
  if (p.magic != kReplyMagic) return bad("bad reply magic (not a kiln daemon)");
  if (body.size() != p.body_len || body.size() < 16)
    return bad("reply body of " + std::to_string(body.size()) + " bytes");
  Reply r;
  r.version = p.version;
  const auto status = body[0];
  if (status > 1 || body[1] != 0) return bad("reply status byte " + std::to_string(status));
  r.accepted = status == 0;
  const auto reason_len = static_cast<std::size_t>(get_le(body, 2, 2));
  r.num_fds = static_cast<std::uint32_t>(get_le(body, 4, 4));
  r.client_id = get_le(body, 8, 8);
  if (reason_len > kMaxReasonBytes || reason_len != body.size() - 16)
    return bad("reply reason length " + std::to_string(reason_len));
  r.reason.assign(body.begin() + 16, body.end());
  return r;
}

}  // namespace kiln::ipc

// Bytes in kiln's binary formats (the IR codec, the plan cache, the IPC protocol, the CUDA
// kernel cache): little-endian fixed-width integers, canonical LEB128 varints and zigzag.
//
//   Writing: put_* onto any sink with byte(uint8_t) and bytes(const uint8_t*, size_t) (the IR
//   codec counts first, then writes into memory sized for it), or ByteWriter, which appends to
//   a vector.
//   Reading: ByteReader, bounds-checked; the first failure is recorded with the offset of the
//   value it concerns and every caller unwinds with `false`. Each format words the final error
//   its own way from error_offset() and error() (the message without the offset).
//
//   std::vector<std::uint8_t> out;
//   ByteWriter w(out);
//   w.varint(300);
//   ByteReader r(out);
//   std::uint64_t v = 0;
//   if (!r.varint(v, "length")) report(r.error_offset(), r.error());
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// A 64-bit varint takes at most 10 bytes (the 10th carries one bit).
inline constexpr std::size_t kMaxVarintBytes = 10;

constexpr std::uint64_t zigzag(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ (v < 0 ? ~std::uint64_t{0} : std::uint64_t{0});
}
constexpr std::int64_t unzigzag(std::uint64_t u) {
  // (u >> 1) ^ -(u & 1), written without signed overflow.
  return static_cast<std::int64_t>((u >> 1) ^ (~(u & 1) + 1));
}

// The `n` little-endian bytes at `p` (n <= 8).
constexpr std::uint64_t load_le(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

// ---- Writing onto a sink.

template <class Sink>
void put_u8(Sink& s, std::uint8_t v) {
  s.byte(v);
}
template <class Sink>
void put_le(Sink& s, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) s.byte(static_cast<std::uint8_t>(v >> (8 * i)));
}
template <class Sink>
void put_u16(Sink& s, std::uint16_t v) {
  put_le(s, v, 2);
}
template <class Sink>
void put_u32(Sink& s, std::uint32_t v) {
  put_le(s, v, 4);
}
template <class Sink>
void put_u64(Sink& s, std::uint64_t v) {
  put_le(s, v, 8);
}
template <class Sink>
void put_varint(Sink& s, std::uint64_t v) {
  while (v >= 0x80) {
    s.byte(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  s.byte(static_cast<std::uint8_t>(v));
}
template <class Sink>
void put_svarint(Sink& s, std::int64_t v) {
  put_varint(s, zigzag(v));
}

// Appends to a vector it does not own.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::uint8_t>& out) : out_(out) {}

  // The sink interface of the put_* functions.
  void byte(std::uint8_t b) { out_.push_back(b); }
  void bytes(const std::uint8_t* p, std::size_t n) { out_.insert(out_.end(), p, p + n); }

  void u8(std::uint8_t v) { byte(v); }
  void u16(std::uint16_t v) { put_u16(*this, v); }
  void u32(std::uint32_t v) { put_u32(*this, v); }
  void u64(std::uint64_t v) { put_u64(*this, v); }
  void boolean(bool v) { byte(v ? 1 : 0); }
  void varint(std::uint64_t v) { put_varint(*this, v); }
  void svarint(std::int64_t v) { put_svarint(*this, v); }
  template <class E>
  void enumeration(E e) {
    byte(static_cast<std::uint8_t>(e));
  }
  void bytes(std::span<const std::uint8_t> b) { bytes(b.data(), b.size()); }
  void bytes(std::string_view s) { bytes(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()); }
  // Overwrites 4 bytes already written at `at` (a length known only at the end).
  void patch_u32(std::size_t at, std::uint32_t v) {
    for (std::size_t i = 0; i < 4; ++i) out_[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
  }
  std::size_t size() const { return out_.size(); }
  std::vector<std::uint8_t>& out() { return out_; }

 private:
  std::vector<std::uint8_t>& out_;
};

// ---- Reading.

class ByteReader {
 public:
  // `base_offset`: where `bytes` start in the enclosing file or message, so that errors name
  // offsets a reader of the whole file can find.
  explicit ByteReader(std::span<const std::uint8_t> bytes, std::size_t base_offset = 0)
      : bytes_(bytes), base_(base_offset) {}

  std::size_t offset() const { return base_ + pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }

  bool failed() const { return failed_; }
  std::size_t error_offset() const { return error_offset_; }
  const std::string& error() const { return error_; }

  // Records the first failure, about the value that starts at `at`; always returns false.
  bool fail(std::size_t at, std::string message);
  bool fail(std::string message) { return fail(offset(), std::move(message)); }
  // Prefixes context ("operation #3: ") to the recorded message; returns false.
  bool wrap(std::string_view context);

  // False (recorded) when fewer than `n` bytes remain.
  bool need(std::size_t n, const char* what) { return remaining() >= n || truncated(n, what); }
  bool u8(std::uint8_t& v, const char* what) {
    if (!need(1, what)) return false;
    v = bytes_[pos_++];
    return true;
  }
  // A little-endian unsigned integer of sizeof(T) bytes.
  template <class T>
  bool fixed(T& v, const char* what) {
    static_assert(std::numeric_limits<T>::is_integer && !std::numeric_limits<T>::is_signed && sizeof(T) <= 8);
    if (!need(sizeof(T), what)) return false;
    v = static_cast<T>(load_le(bytes_.data() + pos_, sizeof(T)));
    pos_ += sizeof(T);
    return true;
  }
  // A byte that must be 0 or 1.
  bool boolean(bool& v, const char* what);
  // Canonical LEB128: at most 10 bytes, no bits beyond 64, no redundant trailing 0x00 byte.
  // Inline: the op path decodes a few dozen per operation.
  bool varint(std::uint64_t& v, const char* what) {
    const std::size_t start = pos_;
    std::uint64_t x = 0;
    for (std::size_t i = 0; i < kMaxVarintBytes; ++i) {
      if (pos_ >= bytes_.size()) return bad_varint(start, what, i, VarintProblem::Truncated);
      const std::uint8_t b = bytes_[pos_++];
      if (i == kMaxVarintBytes - 1 && b > 1) return bad_varint(start, what, i, VarintProblem::Overflow);
      x |= static_cast<std::uint64_t>(b & 0x7f) << (7 * i);
      if ((b & 0x80) == 0) {
        if (b == 0 && i > 0) return bad_varint(start, what, i, VarintProblem::NotShortest);
        v = x;
        return true;
      }
    }
    // Unreachable: the 10th byte either fails above or ends the varint (b <= 1 has no 0x80 bit).
    return bad_varint(start, what, kMaxVarintBytes, VarintProblem::TooLong);
  }
  bool svarint(std::int64_t& v, const char* what) {
    std::uint64_t u = 0;
    if (!varint(u, what)) return false;
    v = unzigzag(u);
    return true;
  }
  // An enum stored as one byte, checked against its largest value.
  template <class E>
  bool enumeration(E& out, std::uint8_t max, const char* what) {
    const std::size_t at = offset();
    std::uint8_t v = 0;
    if (!u8(v, what)) return false;
    if (v > max) return unknown_enum(at, what, v, max);
    out = static_cast<E>(v);
    return true;
  }
  // A varint count, checked against `cap` and against what the remaining bytes can hold (each
  // element needs at least `min_bytes`), before the caller reserves anything.
  bool count(std::size_t& n, std::size_t min_bytes, const char* what,
             std::size_t cap = std::numeric_limits<std::size_t>::max()) {
    const std::size_t at = offset();
    std::uint64_t v = 0;
    if (!varint(v, what)) return false;
    if (v > cap || v > remaining() / min_bytes) return bad_count(at, what, v, min_bytes, cap);
    n = static_cast<std::size_t>(v);
    return true;
  }
  // The next `n` bytes.
  bool take(std::size_t n, std::span<const std::uint8_t>& out, const char* what) {
    if (!need(n, what)) return false;
    out = bytes_.subspan(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  enum class VarintProblem : std::uint8_t { Truncated, Overflow, NotShortest, TooLong };
  // The failure paths, out of line: they format messages.
  bool truncated(std::size_t n, const char* what);
  bool bad_varint(std::size_t start, const char* what, std::size_t byte, VarintProblem problem);
  bool bad_count(std::size_t at, const char* what, std::uint64_t v, std::size_t min_bytes, std::size_t cap);
  bool unknown_enum(std::size_t at, const char* what, std::uint8_t v, std::uint8_t max);

  std::span<const std::uint8_t> bytes_;
  std::size_t base_;
  std::size_t pos_ = 0;
  bool failed_ = false;
  std::size_t error_offset_ = 0;
  std::string error_;
};

}  // namespace kiln

// JSON string contents for the daemon's hand-written JSON (status, kilnctl answers, log lines):
// quotes and backslashes escaped, control characters as \uXXXX (a newline as \n), UTF-8 as is.
// Internal to kiln::ipc_server.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace kiln::ipc {

inline std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += ch;
    }
  }
  return out;
}

// The same, quoted.
inline std::string json_text(std::string_view s) { return "\"" + json_escape(s) + "\""; }

}  // namespace kiln::ipc

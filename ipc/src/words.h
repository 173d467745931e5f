// The words of a control command's arguments (kilnctl's "job_memory_mib=4096 uid_jobs=8",
// "list hits 50", "show 7 dot"): split on runs of spaces. Internal to kiln::ipc_server.
#pragma once

#include <string_view>
#include <vector>

namespace kiln::ipc {

inline std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  for (std::size_t at = text.find_first_not_of(' '); at != std::string_view::npos;
       at = text.find_first_not_of(' ', at)) {
    const std::size_t end = std::min(text.find(' ', at), text.size());
    words.push_back(text.substr(at, end - at));
    at = end;
  }
  return words;
}

}  // namespace kiln::ipc

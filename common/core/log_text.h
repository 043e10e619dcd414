// Text from clients (job names, cancel reasons, ids) goes into log lines; one line per event
// must stay one line, or a job named "x\ncoordinator: job-000009 SUCCEEDED" forges entries.
#ifndef BATON_COMMON_CORE_LOG_TEXT_H_
#define BATON_COMMON_CORE_LOG_TEXT_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace baton {

// `text` with every control character (newline, carriage return, tab, escape, DEL and the
// rest below 0x20) written as a C escape (\n, \r, \t, \x1b), and backslashes doubled so
// an escape in the input cannot pass for one of these. Other bytes (UTF-8 included) stay.
inline std::string OneLine(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out.push_back(ch);
        }
    }
  }
  return out;
}

}  // namespace baton

#endif  // BATON_COMMON_CORE_LOG_TEXT_H_

// Text from clients (job names, cancel reasons, ids) goes into log lines; one line per event
// must stay one line, or a job named "x\ncoordinator: job-000009 SUCCEEDED" forges entries.
// Text from clients and files (paths, names, ids, JSON) also goes into error messages; there
// it is bounded as well, so a 1 MB spec field cannot make a 1 MB reply or log line.
#ifndef BATON_COMMON_CORE_LOG_TEXT_H_
#define BATON_COMMON_CORE_LOG_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
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

// How much of a client's or a file's text an error message quotes by default: a long path
// fits whole; three quotes still make a message well under 1 KB.
inline constexpr size_t kMaxEchoBytes = 160;

namespace log_text_internal {

// The length of the well-formed UTF-8 sequence of two to four bytes at the start of `s`
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or 0.
inline size_t Utf8SequenceLength(absl::string_view s) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = at(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  }
  if (n == 0 || s.size() < n || at(1) < lo || at(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (at(i) < 0x80 || at(i) > 0xbf) return 0;
  }
  return n;
}

}  // namespace log_text_internal

// `text` as an error message quotes it: OneLine's escapes, every byte that is not part of
// well-formed UTF-8 (and the C1 controls U+0080 .. U+009F) written as \xHH too, so the
// message is valid UTF-8 and shows what the bytes were; at most `max_bytes` bytes of that,
// never half a character or escape, followed by "...(N more bytes)" for the N bytes of
// `text` left out. Short, printable text comes back as it is, so a message still names the
// value verbatim.
inline std::string EchoInput(absl::string_view text, size_t max_bytes = kMaxEchoBytes) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t n = 1;
    std::string piece;
    if (c < 0x80) {
      piece = OneLine(text.substr(i, 1));
    } else if ((n = log_text_internal::Utf8SequenceLength(text.substr(i))) != 0 &&
               !(c == 0xc2 && static_cast<unsigned char>(text[i + 1]) <= 0x9f)) {
      piece = std::string(text.substr(i, n));
    } else {
      n = 1;
      piece = absl::StrFormat("\\x%02x", c);
    }
    if (out.size() + piece.size() > max_bytes) break;
    out += piece;
    i += n;
  }
  if (i < text.size()) absl::StrAppend(&out, "...(", text.size() - i, " more bytes)");
  return out;
}

// protobuf's JSON parser reports a description, then the input around the error and a
// caret line under it: the description alone (which may quote a field name), as EchoInput
// quotes it.
inline std::string JsonParseError(absl::string_view message) {
  return EchoInput(message.substr(0, message.find('\n')), 2 * kMaxEchoBytes);
}

}  // namespace baton

#endif  // BATON_COMMON_CORE_LOG_TEXT_H_

#include "coordinator/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rpc/security.h"
#include "common/core/mutex.h"

namespace baton {
namespace {

bool ValidName(absl::string_view name) {
  // Also a path component (a user's default checkpoint directory, users/NAME).
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '@' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kSubmitter:
      return "submitter";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<std::vector<Authenticator::Entry>> Authenticator::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--auth_tokens: cannot read ", path));
  std::vector<Entry> out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    absl::string_view text = line;
    if (size_t hash = text.find('#'); hash != absl::string_view::npos) text = text.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(text, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", why));
    };
    if (fields.size() != 3) return bad("want three fields: token name role");
    Entry e;
    e.token = std::string(fields[0]);
    if (e.token.size() < kMinTokenChars) {
      return bad(absl::StrCat("the token is shorter than ", kMinTokenChars, " characters"));
    }
    if (!ValidName(fields[1])) {
      return bad(
          "the name must be 1 to 64 of letters, digits, '.', '_', '@' and '-', not . or ..");
    }
    e.principal.name = std::string(fields[1]);
    if (fields[2] == "viewer") {
      e.principal.role = Role::kViewer;
    } else if (fields[2] == "submitter") {
      e.principal.role = Role::kSubmitter;
    } else if (fields[2] == "admin") {
      e.principal.role = Role::kAdmin;
    } else {
      return bad(absl::StrCat("unknown role \"", fields[2], "\" (viewer, submitter or admin)"));
    }
    for (const Entry& other : out) {
      if (SecretsEqual(other.token, e.token)) {
        return bad(absl::StrCat("the token of ", e.principal.name, " is also ",
                                other.principal.name, "'s"));
      }
    }
    out.push_back(std::move(e));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));
  return out;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  absl::StatusOr<std::vector<Entry>> entries = Load(path);
  if (!entries.ok()) return entries.status();
  auto a = std::make_unique<Authenticator>();
  a->path_ = path;
  MutexLock l(a->mu_);
  a->entries_ = *std::move(entries);
  return a;
}

absl::Status Authenticator::Reload() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<Entry>> entries = Load(path_);
  if (!entries.ok()) return entries.status();
  MutexLock lock(mu_);
  entries_ = *std::move(entries);
  return absl::OkStatus();
}

absl::StatusOr<Principal> Authenticator::Authenticate(absl::string_view authorization) const {
  if (path_.empty()) return Principal{kAnonymous, Role::kAdmin};
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "no token: send \"authorization: Bearer TOKEN\" (batonctl reads $BATON_TOKEN or "
        "--token_file)");
  }
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") && !absl::ConsumePrefix(&token, "bearer ")) {
    return absl::UnauthenticatedError("the authorization metadata is not \"Bearer TOKEN\"");
  }
  token = absl::StripAsciiWhitespace(token);
  MutexLock lock(mu_);
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {  // every entry compared: timing does not tell which
    if (SecretsEqual(e.token, token)) found = &e;
  }
  if (found == nullptr) return absl::UnauthenticatedError("unknown token");
  return found->principal;
}

absl::Status Authorize(const Principal& who, Role needed, absl::string_view what) {
  if (static_cast<int>(who.role) >= static_cast<int>(needed)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(who.name, " (", RoleName(who.role),
                                                  ") may not ", what, ": that needs the ",
                                                  RoleName(needed), " role"));
}

std::vector<std::string> OpenAccessWarnings(const AccessSetup& setup) {
  std::vector<std::string> out;
  if (!setup.tokens) {
    out.push_back(
        "no --auth_tokens: every caller is an admin, and may submit, cancel and export any "
        "job");
  }
  if (!setup.mutual_tls && !setup.join_token) {
    out.push_back(
        "no client certificates and no --join_token_file: anyone may register as a worker "
        "and be sent jobs (their specs, inline text included)");
  }
  if (!setup.tls) {
    out.push_back(
        "plaintext: requests, tokens and job specs cross the network unencrypted, and "
        "workers' tensor streams are guarded only by each job's random key, which travels "
        "in the clear (docs/security.md, \"Plaintext\")");
  }
  return out;
}

}  // namespace baton

#include "coordinator/checkpoint_dirs.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint.h"
#include "common/core/log_text.h"
#include "common/core/paths.h"

namespace baton {
namespace fs = std::filesystem;

namespace {

std::string Resolved(const std::string& root) {
  if (root.empty()) return "";
  std::error_code ec;
  fs::path p = fs::absolute(root, ec);
  if (ec) return root;
  fs::path canonical = fs::weakly_canonical(p, ec);
  return ec ? p.string() : canonical.string();
}

absl::Status Denied(const std::string& dir, const std::string& why) {
  return absl::PermissionDeniedError(
      absl::StrCat("checkpoint.dir: '", EchoInput(dir), "' ", why));
}

}  // namespace

std::string DefaultCheckpointDir(const std::string& root, const std::string& user) {
  return root.empty() ? "" : (fs::path(root) / kUsersCheckpointDir / user).string();
}

CheckpointDirs::CheckpointDirs(const std::string& root)
    : root_(Resolved(root)),
      users_(root_.empty() ? "" : (fs::path(root_) / kUsersCheckpointDir).string()) {}

std::string CheckpointDirs::DefaultDir(const std::string& user) const {
  return DefaultCheckpointDir(root_, user);
}

std::vector<std::string> CheckpointDirs::SelfAndAncestors(const std::string& dir) {
  std::vector<std::string> out;
  for (fs::path p(dir); !p.empty(); p = p.parent_path()) {
    out.push_back(p.string());
    if (p == p.parent_path()) break;  // "/"
  }
  return out;
}

absl::Status CheckpointDirs::Check(const std::string& dir, const std::string& user,
                                   bool admin) const {
  if (!users_.empty() && PathWithin(users_, dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.dir: '", EchoInput(dir), "' ",
        PathWithin(dir, users_) ? "" : absl::StrCat("contains '", users_, "', which "),
        "holds every user's default checkpoint directory (users/NAME); name one under '",
        DefaultDir(user), "' or elsewhere under the checkpoint root"));
  }
  if (!users_.empty() && !admin && PathWithin(dir, users_, /*dir_itself=*/false)) {
    const std::string name = fs::path(dir).lexically_relative(users_).begin()->string();
    if (name != user) {
      return Denied(dir, absl::StrCat("lies in '", DefaultDir(name), "', user ", name,
                                      "'s default checkpoint directory; yours is '",
                                      DefaultDir(user), "'"));
    }
  }
  for (const std::string& a : SelfAndAncestors(dir)) {
    if (auto it = job_dirs_.find(a); it != job_dirs_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.dir: '", EchoInput(dir), "' lies in '", EchoInput(a),
                       "', where ", it->second,
                       " writes its own checkpoints; name a directory beside it"));
    }
  }
  if (admin) return absl::OkStatus();
  auto refuse = [&](const std::string& other, const Owner& owner, bool inside) {
    return Denied(dir, absl::StrCat(inside ? "lies in" : "contains", " '", EchoInput(other),
                                    "', the checkpoint directory of ", owner.job_id,
                                    " submitted by ", owner.user,
                                    "; write your checkpoints elsewhere (an admin may)"));
  };
  for (const std::string& a : SelfAndAncestors(dir)) {
    if (auto it = owners_.find(a); it != owners_.end() && it->second.user != user) {
      return refuse(it->first, it->second, /*inside=*/true);
    }
  }
  // The directories under `dir`: the keys that start with "dir/".
  const std::string prefix = absl::EndsWith(dir, "/") ? dir : absl::StrCat(dir, "/");
  for (auto it = owners_.lower_bound(prefix);
       it != owners_.end() && absl::StartsWith(it->first, prefix); ++it) {
    if (it->second.user != user) return refuse(it->first, it->second, /*inside=*/false);
  }
  return absl::OkStatus();
}

bool CheckpointDirs::Add(const std::string& dir, const std::string& user,
                         const std::string& job_id) {
  job_dirs_.emplace(CheckpointJobDir(dir, job_id), job_id);
  if (!root_.empty() && (!PathWithin(dir, root_, /*dir_itself=*/false) ||
                         PathWithin(users_, dir))) {
    return false;
  }
  owners_.emplace(dir, Owner{user, job_id});
  return true;
}

}  // namespace baton

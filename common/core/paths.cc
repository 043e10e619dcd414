#include "common/core/paths.h"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/log_text.h"

namespace baton {
namespace fs = std::filesystem;

namespace {

// `path` absolute (against `base` when relative and given) and resolved as far as it exists.
fs::path Resolve(const std::string& path, const std::string& base, std::error_code& ec) {
  fs::path p(path);
  if (p.is_relative() && !base.empty()) p = fs::path(base) / p;
  p = fs::absolute(p, ec);
  if (ec) return {};
  return fs::weakly_canonical(p, ec);
}

}  // namespace

bool PathWithin(const std::string& path, const std::string& dir, bool dir_itself) {
  const fs::path p(path), d(dir);
  // Component by component: /data2 is not under /data. A trailing separator leaves an
  // empty last component.
  auto [di, pi] = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  const bool under = di == d.end() || (std::next(di) == d.end() && di->empty());
  const bool beyond = pi != p.end() && !(std::next(pi) == p.end() && pi->empty());
  return under && (beyond || dir_itself);
}

absl::StatusOr<std::string> ConfinePath(const std::string& path, const Confinement& c) {
  if (c.roots.empty()) return path;
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(c.field, ": empty path"));
  std::error_code ec;
  const fs::path resolved = Resolve(path, c.base, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(c.field, ": '", EchoInput(path), "' cannot be resolved: ", ec.message()));
  }
  for (const std::string& root : c.roots) {
    std::error_code rec;
    const fs::path r = Resolve(root, "", rec);
    if (rec) continue;
    if (PathWithin(resolved.string(), r.string(), c.root_itself)) return resolved.string();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      c.field, ": '", EchoInput(path), "' is outside ", c.roots_are, " (",
      absl::StrJoin(c.roots, ", "), ")",
      resolved.string() != path
          ? absl::StrCat("; it resolves to '", EchoInput(resolved.string()), "'")
          : std::string()));
}

std::string CheckpointRootFromFlag(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) return (exe.parent_path() / "checkpoints").string();
  return (fs::current_path(ec) / "checkpoints").string();
}

absl::StatusOr<std::string> ConfineCheckpointDir(const std::string& dir, const std::string& root) {
  Confinement c;
  c.field = "checkpoint.dir";
  c.roots = {root};
  c.roots_are = "this cluster's checkpoint root (--checkpoint_root)";
  c.base = root;
  c.root_itself = true;
  absl::StatusOr<std::string> in = ConfinePath(dir, c);
  if (!in.ok()) return in;
  absl::StatusOr<std::string> resolved_root = ConfinePath(root, c);
  if (resolved_root.ok() && PathWithin(*resolved_root, *in)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.field, ": '", EchoInput(dir), "' is the checkpoint root itself (", *resolved_root,
        "), which holds every job's checkpoints: name a directory under it (a spec that names "
        "none gets its user's own)"));
  }
  return in;
}

}  // namespace baton

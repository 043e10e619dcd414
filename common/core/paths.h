// Paths a job spec names, confined to the directories a service lets jobs use: a spec may
// name a training text under the data roots and a checkpoint directory under the
// checkpoint root, never /etc/shadow, another user's files, or "ckpt/../../..".
#ifndef BATON_COMMON_CORE_PATHS_H_
#define BATON_COMMON_CORE_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

struct Confinement {
  std::string field;               // the spec field, named by every error ("checkpoint.dir")
  std::vector<std::string> roots;  // empty: any path is accepted as given
  std::string roots_are;           // what the roots are, for errors ("the checkpoint root")
  // A relative path is taken relative to this directory (else the working directory).
  std::string base;
  // Whether a root itself is acceptable (a checkpoint root holds job directories), or only
  // paths strictly under one (a data root holds files).
  bool root_itself = false;
};

// Whether `path` lies under `dir` (or is it, with `dir_itself`), component by component:
// /data2 is not under /data; a trailing separator counts for nothing. Lexical: give it
// resolved paths (ConfinePath's results).
bool PathWithin(const std::string& path, const std::string& dir, bool dir_itself = true);

// `path` made absolute (against c.base when relative) and resolved (symlinks as far as the
// path exists, then "." and ".."), when it lies under one of c.roots, each resolved alike
// and compared component by component (/data2 is not under /data). INVALID_ARGUMENT
// naming c.field, the path, what it resolves to (both quoted as EchoInput does: escaped and
// bounded) and the roots otherwise. With no roots, `path` unchanged.
absl::StatusOr<std::string> ConfinePath(const std::string& path, const Confinement& c);

// The checkpoint root a service's --checkpoint_root flag names: the flag's directory, or
// by default checkpoints/ beside the running binary (next to the default data root).
std::string CheckpointRootFromFlag(const std::string& flag);

// Where a spec's checkpoint.dir lies on a service whose checkpoint root is `root`: a
// relative dir is taken under the root; the result must lie strictly under it (ConfinePath;
// errors name checkpoint.dir): the root itself holds every job's checkpoints, and is no
// single job's (or user's) to own.
absl::StatusOr<std::string> ConfineCheckpointDir(const std::string& dir, const std::string& root);

}  // namespace baton

#endif  // BATON_COMMON_CORE_PATHS_H_

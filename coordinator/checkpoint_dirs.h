// CheckpointDirs: where jobs' checkpoints go under the cluster's checkpoint root, and who may
// write where. The coordinator checks each submission against it and records the jobs it
// accepts; it is rebuilt from the job store at start.
//
// A job writes its checkpoints in <dir>/<job id>, its job directory, where dir is its spec's
// checkpoint.dir resolved under the root (ConfineCheckpointDir: never the root itself). The
// rules (Check):
//  - users/ under the root is reserved. users/NAME is the directory of NAME's jobs that name
//    none (DefaultDir), NAME's alone (admins excepted); users/ itself is no job's directory,
//    since it holds every user's.
//  - A directory belongs to the user of the first job that named it: another user's job may
//    name neither a directory inside it nor one containing it (admins excepted).
//  - No job's directory lies in another job's own directory (<dir>/<job>), whoever
//    submitted them: one job's pruning or removal never reaches into another's.
// So no user can take the root, users/ or another user's directory, and with them everyone
// else's checkpoints; what a directory recorded before these rules (the root itself, say)
// claimed is not recorded (Add), so it locks no one out.
//
// Paths are compared component by component (PathWithin), as resolved strings.
// Not thread-safe: the coordinator calls it under its lock.
#ifndef BATON_COORDINATOR_CHECKPOINT_DIRS_H_
#define BATON_COORDINATOR_CHECKPOINT_DIRS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace baton {

// The directory under a checkpoint root that holds each user's default directory.
inline constexpr char kUsersCheckpointDir[] = "users";

// The checkpoint.dir of a job of `user` whose spec names none: <root>/users/<user>, or ""
// without a root. `user` must be a valid principal name (no '/', not "." or "..").
std::string DefaultCheckpointDir(const std::string& root, const std::string& user);

class CheckpointDirs {
 public:
  // `root`: the cluster's checkpoint root (resolved here, as ConfineCheckpointDir resolves
  // it); empty: none (only the owner and job-directory rules apply).
  explicit CheckpointDirs(const std::string& root);

  // DefaultCheckpointDir under the resolved root.
  std::string DefaultDir(const std::string& user) const;

  // Whether a job of `user` (an admin or not) may write under `dir`, a checkpoint.dir
  // already confined under the root and resolved. INVALID_ARGUMENT naming checkpoint.dir
  // for users/ itself and for a directory inside another job's own directory;
  // PERMISSION_DENIED for another user's users/NAME or directory.
  absl::Status Check(const std::string& dir, const std::string& user, bool admin) const;

  // Records that job `job_id` of `user` writes under `dir` (resolved). The first job to
  // name a directory owns it. Returns false, recording no owner, for a directory the rules
  // no longer allow any job (the root itself, users/): it claims nothing.
  bool Add(const std::string& dir, const std::string& user, const std::string& job_id);

 private:
  struct Owner {
    std::string user;
    std::string job_id;
  };
  // Every directory from `dir` up to the file system's root, `dir` first.
  static std::vector<std::string> SelfAndAncestors(const std::string& dir);

  std::string root_;   // resolved; "" for none
  std::string users_;  // root_/users; "" without a root
  std::map<std::string, Owner> owners_;         // checkpoint.dir -> its first job's submitter
  std::map<std::string, std::string> job_dirs_;  // every recorded job's <dir>/<job> -> job id
};

}  // namespace baton

#endif  // BATON_COORDINATOR_CHECKPOINT_DIRS_H_

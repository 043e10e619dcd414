#include "common/checkpoint/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/core/file.h"
#include "common/checkpoint/block_stream.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/digest.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace baton {
namespace fs = std::filesystem;
namespace {

constexpr char kStepPrefix[] = "step-";
constexpr char kManifestPrefix[] = "manifest.rank-";
constexpr char kManifestSuffix[] = ".json";
constexpr char kOptimizerPrefix[] = "optimizer.";

absl::Status Errno(const std::string& what, const std::string& path, int err) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

std::string Sha256Hex(absl::string_view bytes) {
  Sha256 h;
  h.Update(bytes.data(), bytes.size());
  return DigestHex(h.Finish());
}

std::string BlockFileName(const std::string& block) { return block + ".safetensors"; }

absl::Status Fsync(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return Errno("open", path, errno);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("fsync", path, err);
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create directory ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

// The parameters of `blocks`, by block.
std::vector<std::vector<Parameter*>> ParamsOf(const std::vector<Module*>& blocks) {
  std::vector<std::vector<Parameter*>> out;
  for (Module* b : blocks) {
    out.emplace_back();
    b->CollectParameters(&out.back());
  }
  return out;
}

std::map<const Parameter*, std::vector<Optimizer::Slot>> SlotsByParam(
    const std::vector<Optimizer::Slot>& slots) {
  std::map<const Parameter*, std::vector<Optimizer::Slot>> out;
  for (const Optimizer::Slot& s : slots) out[s.param].push_back(s);
  return out;
}

std::string SlotTensorName(const Optimizer::Slot& s) {
  return absl::StrCat(kOptimizerPrefix, s.name, ".", s.param->name);
}

// Reads a block file named by `f` under `step_dir` and checks its SHA-256.
absl::StatusOr<std::string> ReadVerified(const std::string& step_dir,
                                         const CheckpointBlockFile& f) {
  const std::string path = (fs::path(step_dir) / f.file).string();
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) {
    return absl::DataLossError(absl::StrCat("block ", f.block, ": ", bytes.status().message()));
  }
  const std::string sha = Sha256Hex(*bytes);
  if (sha != f.sha256) {
    return absl::DataLossError(absl::StrCat("block ", f.block, ": ", path, " has SHA-256 ", sha,
                                            ", its manifest says ", f.sha256));
  }
  return bytes;
}

absl::StatusOr<int64_t> MetadataInt(const Safetensors& st, const std::string& key,
                                    const std::string& where) {
  const auto it = st.metadata.find(key);
  int64_t v = 0;
  if (it == st.metadata.end() || !absl::SimpleAtoi(it->second, &v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": metadata ", key, " is missing or not a count"));
  }
  return v;
}

}  // namespace

std::string CheckpointJobDir(const std::string& dir, const std::string& job) {
  return (fs::path(dir) / job).string();
}

std::string CheckpointStepDir(const std::string& job_dir, int64_t step) {
  return (fs::path(job_dir) / absl::StrCat(kStepPrefix, step)).string();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const std::atomic<bool>* stop) {
  // Unique per call in this process, so concurrent writers never share a temporary file.
  static std::atomic<uint64_t> temp_counter{0};
  // Written in pieces this large, `stop` read before each.
  constexpr size_t kPiece = size_t{8} << 20;
  const fs::path target(path);
  const std::string tmp =
      absl::StrCat(path, ".tmp-", getpid(), "-", temp_counter.fetch_add(1));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp, errno);
  size_t done = 0;
  while (done < bytes.size()) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
      close(fd);
      unlink(tmp.c_str());
      return absl::AbortedError(
          absl::StrCat("writing ", path, " stopped after ", done, " of ", bytes.size(), " bytes"));
    }
    const ssize_t n = write(fd, bytes.data() + done, std::min(kPiece, bytes.size() - done));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return Errno("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return Errno("fsync", tmp, err);
  }
  if (close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Errno("close", tmp, err);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Errno("rename to", path, err);
  }
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  return Fsync(parent.string(), /*directory=*/true);
}

absl::Status CheckCheckpointDirWritable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory ", dir, " cannot be created: ", ec.message()));
  }
  const std::string probe = (fs::path(dir) / absl::StrCat(".probe-", getpid())).string();
  absl::Status st = WriteFileAtomically(probe, "baton");
  if (!st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory ", dir, " is not writable: ", st.message()));
  }
  fs::remove(probe, ec);
  return absl::OkStatus();
}

int64_t CheckpointSnapshot::file_bytes() const {
  int64_t n = 0;
  for (const CheckpointBlockFile& f : files) n += f.bytes;
  return n;
}

absl::StatusOr<CheckpointSnapshot> SnapshotBlocks(const std::string& step_dir,
                                                  const CheckpointWriteInfo& info,
                                                  const std::vector<Module*>& blocks,
                                                  Optimizer& optimizer) {
  return SnapshotBlocks(step_dir, info, blocks, optimizer.Slots(), optimizer.steps_taken());
}

absl::StatusOr<CheckpointSnapshot> SnapshotBlocks(const std::string& step_dir,
                                                  const CheckpointWriteInfo& info,
                                                  const std::vector<Module*>& blocks,
                                                  const std::vector<Optimizer::Slot>& slot_list,
                                                  int64_t optimizer_steps) {
  if (info.block_indices.size() != blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", blocks.size(), " blocks but ",
                                                   info.block_indices.size(), " indices"));
  }
  const auto params = ParamsOf(blocks);
  const auto slots = SlotsByParam(slot_list);
  CheckpointSnapshot snap;
  snap.step_dir = step_dir;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const std::string& name = blocks[b]->name();
    std::vector<NamedTensor> tensors;
    for (Parameter* p : params[b]) tensors.push_back({p->name, &p->value});
    for (Parameter* p : params[b]) {
      const auto it = slots.find(p);
      if (it == slots.end()) continue;
      for (const Optimizer::Slot& s : it->second) tensors.push_back({SlotTensorName(s), s.state});
    }
    absl::StatusOr<std::string> bytes =
        EncodeSafetensors(tensors, {{"format", kCheckpointFormat},
                                    {"job", info.job},
                                    {"step", absl::StrCat(info.step)},
                                    {"block", name},
                                    {"optimizer_steps", absl::StrCat(optimizer_steps)}});
    if (!bytes.ok()) return bytes.status();
    snap.files.push_back(CheckpointBlockFile{name, info.block_indices[b], BlockFileName(name),
                                             Sha256Hex(*bytes),
                                             static_cast<int64_t>(bytes->size())});
    snap.contents.push_back(*std::move(bytes));
  }
  google::protobuf::Struct doc;
  auto& fields = *doc.mutable_fields();
  fields["format"].set_string_value(kCheckpointFormat);
  fields["job"].set_string_value(info.job);
  fields["step"].set_number_value(static_cast<double>(info.step));
  fields["rank"].set_number_value(info.rank);
  if (info.part > 0) fields["part"].set_number_value(info.part);
  fields["num_blocks"].set_number_value(info.num_blocks);
  auto* list = fields["blocks"].mutable_list_value();
  for (const CheckpointBlockFile& f : snap.files) {
    auto& b = *list->add_values()->mutable_struct_value()->mutable_fields();
    b["block"].set_string_value(f.block);
    b["index"].set_number_value(f.index);
    b["file"].set_string_value(f.file);
    b["sha256"].set_string_value(f.sha256);
    b["bytes"].set_number_value(static_cast<double>(f.bytes));
  }
  if (!google::protobuf::util::MessageToJsonString(doc, &snap.manifest).ok()) {
    return absl::InternalError(absl::StrCat(step_dir, ": cannot print the manifest"));
  }
  snap.manifest += "\n";
  snap.manifest_file = info.part == 0 ? absl::StrCat(kManifestPrefix, info.rank, kManifestSuffix)
                                      : absl::StrCat(kManifestPrefix, info.rank, ".part-",
                                                     info.part, kManifestSuffix);
  return snap;
}

absl::Status WriteSnapshot(const CheckpointSnapshot& snap, const std::atomic<bool>* stop) {
  if (absl::Status st = MakeDirs(snap.step_dir); !st.ok()) return st;
  for (size_t i = 0; i < snap.files.size(); ++i) {
    if (absl::Status st = WriteFileAtomically(
            (fs::path(snap.step_dir) / snap.files[i].file).string(), snap.contents[i], stop);
        !st.ok()) {
      return st;
    }
  }
  // Last: a manifest never names a file that is not there.
  return WriteFileAtomically((fs::path(snap.step_dir) / snap.manifest_file).string(),
                             snap.manifest, stop);
}

absl::StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& step_dir) {
  CheckpointIndex index;
  bool any = false;
  std::error_code ec;
  fs::directory_iterator it(step_dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(step_dir, ": ", ec.message()));
  std::vector<fs::path> manifests;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, kManifestPrefix) && absl::EndsWith(name, kManifestSuffix)) {
      manifests.push_back(e.path());
    }
  }
  std::sort(manifests.begin(), manifests.end());
  for (const fs::path& m : manifests) {
    absl::StatusOr<std::string> text = ReadFile(m.string());
    if (!text.ok()) return absl::DataLossError(text.status().message());
    google::protobuf::Struct doc;
    if (!google::protobuf::util::JsonStringToMessage(*text, &doc).ok()) {
      return absl::DataLossError(absl::StrCat(m.string(), " is not a JSON manifest"));
    }
    const auto& f = doc.fields();
    const auto step = f.find("step");
    const auto blocks = f.find("blocks");
    if (step == f.end() || blocks == f.end() ||
        blocks->second.kind_case() != google::protobuf::Value::kListValue) {
      return absl::DataLossError(absl::StrCat(m.string(), " lacks step or blocks"));
    }
    const int64_t s = static_cast<int64_t>(step->second.number_value());
    if (any && s != index.step) {
      return absl::DataLossError(absl::StrCat(m.string(), " is for step ", s, ", another for ",
                                              index.step));
    }
    index.step = s;
    any = true;
    const auto num = f.find("num_blocks");
    const int num_blocks = num == f.end() ? 0 : static_cast<int>(num->second.number_value());
    if (num_blocks < 1 || (index.num_blocks != 0 && num_blocks != index.num_blocks)) {
      return absl::DataLossError(absl::StrCat(m.string(), " has num_blocks ", num_blocks,
                                              index.num_blocks ? absl::StrCat(", another ", index.num_blocks) : ""));
    }
    index.num_blocks = num_blocks;
    for (const auto& v : blocks->second.list_value().values()) {
      const auto& bf = v.struct_value().fields();
      auto str = [&bf](const char* k) {
        const auto i = bf.find(k);
        return i == bf.end() ? std::string() : i->second.string_value();
      };
      CheckpointBlockFile b{str("block"), -1, str("file"), str("sha256"), 0};
      const auto bytes = bf.find("bytes");
      if (bytes != bf.end()) b.bytes = static_cast<int64_t>(bytes->second.number_value());
      const auto idx = bf.find("index");
      if (idx != bf.end()) b.index = static_cast<int>(idx->second.number_value());
      if (b.block.empty() || b.file.empty() || b.sha256.empty() || b.index < 0 ||
          b.index >= num_blocks ||
          b.file.find('/') != std::string::npos || b.file.find("..") != std::string::npos) {
        return absl::DataLossError(absl::StrCat(m.string(), ": a block entry is malformed"));
      }
      const auto [at, inserted] = index.blocks.emplace(b.block, b);
      if (!inserted && at->second.sha256 != b.sha256) {
        return absl::DataLossError(absl::StrCat(step_dir, ": block ", b.block,
                                                " is in two manifests with different files"));
      }
    }
  }
  if (!any) return absl::NotFoundError(absl::StrCat(step_dir, " has no manifest"));
  return index;
}

absl::StatusOr<int64_t> LoadBlocks(const std::string& step_dir,
                                   const std::vector<Module*>& blocks, Optimizer& optimizer) {
  int64_t optimizer_steps = -1;
  absl::StatusOr<int64_t> step = LoadBlocks(step_dir, blocks, optimizer.Slots(), &optimizer_steps);
  if (step.ok() && optimizer_steps >= 0) optimizer.set_steps_taken(optimizer_steps);
  return step;
}

absl::StatusOr<int64_t> LoadBlocks(const std::string& step_dir, const std::vector<Module*>& blocks,
                                   const std::vector<Optimizer::Slot>& slot_list,
                                   int64_t* steps_taken) {
  absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(step_dir);
  if (!index.ok()) return index.status();
  const auto params = ParamsOf(blocks);
  const auto slots = SlotsByParam(slot_list);
  int64_t optimizer_steps = -1;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const std::string& name = blocks[b]->name();
    const auto f = index->blocks.find(name);
    if (f == index->blocks.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(step_dir, " has no file for block ", name));
    }
    absl::StatusOr<std::string> bytes = ReadVerified(step_dir, f->second);
    if (!bytes.ok()) return bytes.status();
    const std::string where = absl::StrCat(step_dir, "/", f->second.file);
    absl::StatusOr<Safetensors> st = ParseSafetensors(*bytes);
    if (!st.ok()) {
      return absl::DataLossError(absl::StrCat(where, ": ", st.status().message()));
    }
    if (st->metadata["format"] != kCheckpointFormat || st->metadata["block"] != name) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is not a ", kCheckpointFormat, " file of block ", name));
    }
    absl::StatusOr<int64_t> steps = MetadataInt(*st, "optimizer_steps", where);
    if (!steps.ok()) return steps.status();
    if (optimizer_steps >= 0 && *steps != optimizer_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " says the optimizer took ", *steps, " steps, another block ", optimizer_steps));
    }
    optimizer_steps = *steps;
    // Every tensor the model expects, and no other.
    std::vector<std::pair<std::string, Tensor*>> expect;
    for (Parameter* p : params[b]) expect.emplace_back(p->name, &p->value);
    for (Parameter* p : params[b]) {
      const auto it = slots.find(p);
      if (it == slots.end()) continue;
      for (const Optimizer::Slot& s : it->second) expect.emplace_back(SlotTensorName(s), s.state);
    }
    for (const auto& [tname, dst] : expect) {
      if (!st->tensors.contains(tname)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " has no tensor ", tname,
            absl::StartsWith(tname, kOptimizerPrefix) ? " (written with another optimizer?)"
                                                      : ""));
      }
    }
    if (st->tensors.size() != expect.size()) {
      std::set<std::string> known;
      for (const auto& e : expect) known.insert(e.first);
      for (const auto& [tname, e] : st->tensors) {
        if (!known.contains(tname)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " has tensor ", tname, ", which this model and optimizer do not"));
        }
      }
    }
    // Shapes first, so that a mismatch loads nothing of this block.
    for (const auto& [tname, dst] : expect) {
      const SafetensorsEntry& e = st->tensors.at(tname);
      if (e.dtype != dst->dtype() || e.shape != dst->shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": ", tname, " is ", DTypeName(e.dtype), ShapeString(e.shape),
            " in the checkpoint but ", DTypeName(dst->dtype()), ShapeString(dst->shape()),
            " in the model"));
      }
    }
    for (const auto& [tname, dst] : expect) {
      if (absl::Status s = CopyEntryInto(st->tensors.at(tname), tname, dst); !s.ok()) return s;
    }
  }
  *steps_taken = optimizer_steps;
  return index->step;
}

std::vector<int64_t> ListCheckpointSteps(const std::string& job_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  fs::directory_iterator it(job_dir, ec);
  if (ec) return steps;
  for (const fs::directory_entry& e : it) {
    const std::string filename = e.path().filename().string();
    absl::string_view name = filename;
    int64_t step = 0;
    if (e.is_directory(ec) && absl::ConsumePrefix(&name, kStepPrefix) &&
        absl::SimpleAtoi(name, &step) && step >= 0 && absl::StrCat(step) == std::string(name)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::Status VerifyCheckpoint(const std::string& step_dir,
                              const std::vector<std::string>& block_names) {
  absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(step_dir);
  if (!index.ok()) return index.status();
  absl::StatusOr<std::vector<std::string>> own = CheckpointBlockOrder(*index);
  if (!own.ok()) return own.status();
  for (const std::string& b : block_names.empty() ? *own : block_names) {
    const auto f = index->blocks.find(b);
    if (f == index->blocks.end()) {
      return absl::NotFoundError(absl::StrCat(step_dir, " has no file for block ", b));
    }
    if (absl::Status s = VerifyBlockFile(step_dir, f->second); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LatestCompleteCheckpoint(const std::string& job_dir,
                                                 const std::vector<std::string>& block_names,
                                                 int64_t at_most,
                                                 std::vector<std::string>* skipped) {
  std::vector<int64_t> steps = ListCheckpointSteps(job_dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (at_most >= 0 && *it > at_most) continue;
    absl::Status st = VerifyCheckpoint(CheckpointStepDir(job_dir, *it), block_names);
    if (st.ok()) return *it;
    if (skipped != nullptr) {
      skipped->push_back(absl::StrCat("step ", *it, " skipped: ", st.message()));
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no complete checkpoint", at_most >= 0 ? absl::StrCat(" at or before step ", at_most) : "",
      " under ", job_dir));
}

absl::StatusOr<int64_t> FindCheckpoint(const std::string& job_dir,
                                       const std::vector<std::string>& block_names, int64_t step,
                                       std::vector<std::string>* skipped) {
  absl::StatusOr<int64_t> found = LatestCompleteCheckpoint(job_dir, block_names, step, skipped);
  if (!found.ok() || step < 0 || *found == step) return found;
  return absl::NotFoundError(absl::StrCat("step ", step, " is not a complete checkpoint under ",
                                          job_dir));
}

absl::StatusOr<std::vector<int64_t>> PruneCheckpoints(const std::string& job_dir,
                                                      const std::vector<std::string>& block_names,
                                                      int keep) {
  if (keep < 1) return absl::InvalidArgumentError("keep must be at least 1");
  const std::vector<int64_t> steps = ListCheckpointSteps(job_dir);
  std::vector<int64_t> complete;
  for (int64_t s : steps) {
    // Completeness by manifest only: hashing every kept file at every checkpoint would cost
    // as much as writing it.
    absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(CheckpointStepDir(job_dir, s));
    bool all = index.ok();
    for (const std::string& b : block_names) all = all && index->blocks.contains(b);
    if (all) complete.push_back(s);
  }
  std::vector<int64_t> deleted;
  if (complete.empty()) return deleted;
  const size_t first_kept = complete.size() > static_cast<size_t>(keep)
                                ? complete.size() - static_cast<size_t>(keep)
                                : 0;
  const int64_t oldest_kept = complete[first_kept];
  for (int64_t s : steps) {
    if (s >= oldest_kept) continue;
    std::error_code ec;
    fs::remove_all(CheckpointStepDir(job_dir, s), ec);
    // Another rank pruning the same directory at the same time is not an error.
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return absl::InternalError(absl::StrCat("removing ", CheckpointStepDir(job_dir, s), ": ",
                                              ec.message()));
    }
    deleted.push_back(s);
  }
  return deleted;
}

absl::StatusOr<std::vector<std::string>> CheckpointBlockOrder(const CheckpointIndex& index) {
  std::vector<std::string> names(static_cast<size_t>(index.num_blocks));
  for (const auto& [name, f] : index.blocks) names[static_cast<size_t>(f.index)] = name;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) {
      return absl::NotFoundError(absl::StrCat("the checkpoint of step ", index.step,
                                              " has no file for block ", i, " of ",
                                              index.num_blocks));
    }
  }
  return names;
}

// ExportWeights: block_stream.cc, on WeightsExport.

}  // namespace baton

#include "common/checkpoint/block_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/digest.h"
#include "common/core/status.h"

namespace baton {

// One block file read from its first byte on, every byte read fed to its SHA-256. Owns the
// file descriptor.
class BlockFileReader {
 public:
  // DATA_LOSS naming the block and the file when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<BlockFileReader>> Open(const std::string& path,
                                                               const std::string& block) {
    std::unique_ptr<BlockFileReader> r(new BlockFileReader(path, block));
    r->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (r->fd_ < 0) return r->Errno("cannot open");
    struct stat st;
    if (fstat(r->fd_, &st) != 0) return r->Errno("cannot stat");
    r->size_ = static_cast<uint64_t>(st.st_size);
    return r;
  }
  ~BlockFileReader() {
    if (fd_ >= 0) close(fd_);
  }
  BlockFileReader(const BlockFileReader&) = delete;
  BlockFileReader& operator=(const BlockFileReader&) = delete;

  uint64_t size() const { return size_; }  // when opened

  // Up to n bytes into dst, fewer only at the end of the file (0 there).
  absl::StatusOr<size_t> ReadSome(char* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = read(fd_, dst + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Errno("cannot read");
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    hash_.Update(dst, done);
    read_ += done;
    return done;
  }
  // Exactly n bytes; DATA_LOSS when the file ends first.
  absl::Status Read(char* dst, size_t n) {
    BATON_ASSIGN_OR_RETURN(const size_t got, ReadSome(dst, n));
    if (got == n) return absl::OkStatus();
    return Lost(absl::StrCat(path_, " ended after ", read_, " bytes (it changed while read?)"));
  }
  // Whether the bytes read hash to `sha256` (hex): DATA_LOSS naming both otherwise.
  absl::Status Check(const std::string& sha256) {
    const std::string got = DigestHex(hash_.Finish());
    if (got == sha256) return absl::OkStatus();
    return Lost(absl::StrCat(path_, " has SHA-256 ", got, ", its manifest says ", sha256));
  }
  absl::Status Lost(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("block ", block_, ": ", what));
  }

 private:
  BlockFileReader(std::string path, std::string block)
      : path_(std::move(path)), block_(std::move(block)) {}
  absl::Status Errno(absl::string_view what) const {
    const int err = errno;
    return Lost(absl::StrCat(what, " ", path_, ": ", std::strerror(err)));
  }

  const std::string path_;
  const std::string block_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t read_ = 0;
  Sha256 hash_;
};

namespace {

// The names of optimizer state in block files (checkpoint.h), which exports leave out.
constexpr char kOptimizerPrefix[] = "optimizer.";

std::string BlockPath(const std::string& step_dir, const CheckpointBlockFile& f) {
  return (std::filesystem::path(step_dir) / f.file).string();
}

}  // namespace

absl::Status VerifyBlockFile(const std::string& step_dir, const CheckpointBlockFile& f) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<BlockFileReader> r,
                         BlockFileReader::Open(BlockPath(step_dir, f), f.block));
  std::string buffer(kBlockStreamChunkBytes, '\0');
  for (;;) {
    BATON_ASSIGN_OR_RETURN(const size_t n, r->ReadSome(buffer.data(), buffer.size()));
    if (n == 0) break;
  }
  return r->Check(f.sha256);
}

WeightsExport::WeightsExport(int64_t step, size_t chunk_bytes)
    : step_(step), chunk_bytes_(chunk_bytes) {}

WeightsExport::~WeightsExport() = default;

absl::StatusOr<std::unique_ptr<WeightsExport>> WeightsExport::Open(const std::string& step_dir,
                                                                   size_t chunk_bytes) {
  if (chunk_bytes < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("export pieces must be at least 8 bytes, got ", chunk_bytes));
  }
  BATON_ASSIGN_OR_RETURN(const CheckpointIndex index, ReadCheckpointIndex(step_dir));
  BATON_ASSIGN_OR_RETURN(const std::vector<std::string> order, CheckpointBlockOrder(index));
  std::unique_ptr<WeightsExport> e(new WeightsExport(index.step, chunk_bytes));
  std::vector<TensorLayout> layout;
  std::string job;
  for (const std::string& block : order) {
    File f;
    f.manifest = index.blocks.at(block);
    f.path = BlockPath(step_dir, f.manifest);
    BATON_ASSIGN_OR_RETURN(std::unique_ptr<BlockFileReader> r,
                           BlockFileReader::Open(f.path, block));
    f.bytes = r->size();
    auto not_safetensors = [&f](const absl::Status& s) {
      return absl::DataLossError(absl::StrCat(f.path, ": ", s.message()));
    };
    std::string first8(std::min<uint64_t>(8, f.bytes), '\0');
    BATON_RETURN_IF_ERROR(r->Read(first8.data(), first8.size()));
    absl::StatusOr<uint64_t> header_bytes = SafetensorsHeaderLength(first8, f.bytes);
    if (!header_bytes.ok()) return not_safetensors(header_bytes.status());
    std::string header(*header_bytes, '\0');
    BATON_RETURN_IF_ERROR(r->Read(header.data(), header.size()));
    absl::StatusOr<Safetensors> st = ParseSafetensorsHeader(header, f.bytes - 8 - *header_bytes);
    if (!st.ok()) return not_safetensors(st.status());
    job = st->metadata["job"];  // the same in every block
    f.spans.push_back({8 + *header_bytes, false, ""});
    for (const std::string& name : st->order) {
      const SafetensorsEntry& t = st->tensors.at(name);
      Span span{SafetensorsDataBytes(t), !absl::StartsWith(name, kOptimizerPrefix), ""};
      if (span.weight) {
        // F16 and BF16 are read as float32 (t.dtype), and written so.
        if (t.file_dtype == "F16" || t.file_dtype == "BF16") span.widen = t.file_dtype;
        layout.push_back({name, t.dtype, t.shape});
        e->total_bytes_ += static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
      }
      f.spans.push_back(std::move(span));
    }
    e->files_.push_back(std::move(f));
  }
  BATON_ASSIGN_OR_RETURN(e->header_,
                         EncodeSafetensorsHeader(layout, {{"format", "baton-weights-1"},
                                                          {"job", job},
                                                          {"step", absl::StrCat(index.step)}}));
  e->total_bytes_ += e->header_.size();
  return e;
}

absl::Status WeightsExport::Next(std::string* out) {
  out->clear();
  if (!failed_.ok()) return failed_;
  if (header_at_ < header_.size()) {
    const size_t n = std::min(chunk_bytes_, header_.size() - header_at_);
    out->append(header_, header_at_, n);
    header_at_ += n;
  }
  // Room for at least one float32 value of a widened span.
  while (file_ < files_.size() && chunk_bytes_ - out->size() >= 4) {
    if (absl::Status s = Advance(out); !s.ok()) {
      failed_ = s;
      reader_.reset();
      out->clear();
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status WeightsExport::Advance(std::string* out) {
  const File& f = files_[file_];
  if (reader_ == nullptr) {
    BATON_ASSIGN_OR_RETURN(reader_, BlockFileReader::Open(f.path, f.manifest.block));
    if (reader_->size() != f.bytes) {
      return reader_->Lost(absl::StrCat(f.path, " changed while exported: ", f.bytes,
                                        " bytes, now ", reader_->size()));
    }
  }
  const Span& span = f.spans[span_];
  const uint64_t left = span.bytes - span_at_;
  const size_t room = chunk_bytes_ - out->size();
  if (span.weight && span.widen.empty()) {
    // Straight into the output.
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, room));
    const size_t at = out->size();
    out->resize(at + n);
    BATON_RETURN_IF_ERROR(reader_->Read(out->data() + at, n));
    span_at_ += n;
  } else {
    // Hashed only, or widened: through the scratch buffer. A widened piece is a whole
    // number of 2-byte values that fits the room as float32.
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(left, span.weight ? room / 4 * 2 : chunk_bytes_));
    scratch_.resize(n);
    BATON_RETURN_IF_ERROR(reader_->Read(scratch_.data(), n));
    span_at_ += n;
    if (span.weight) {
      SafetensorsEntry piece;
      piece.file_dtype = span.widen;
      piece.shape = {static_cast<int64_t>(n / 2)};
      piece.data = scratch_;
      BATON_ASSIGN_OR_RETURN(const Tensor wide, EntryToTensor(piece, Device::kCpu));
      out->append(static_cast<const char*>(wide.raw()), wide.nbytes());
    }
  }
  if (span_at_ < span.bytes) return absl::OkStatus();
  span_at_ = 0;
  if (++span_ < f.spans.size()) return absl::OkStatus();
  // The file's last byte: it must be the file the manifest names.
  BATON_RETURN_IF_ERROR(reader_->Check(f.manifest.sha256));
  reader_.reset();
  span_ = 0;
  ++file_;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ExportWeights(const std::string& step_dir) {
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<WeightsExport> e, WeightsExport::Open(step_dir));
  std::string out;
  out.reserve(e->total_bytes());
  std::string piece;
  do {
    BATON_RETURN_IF_ERROR(e->Next(&piece));
    out += piece;
  } while (!piece.empty());
  return out;
}

}  // namespace baton

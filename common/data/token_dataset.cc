// TokenDataset: memory-mapped token shards. See dataset.h for the formats and windows.
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/core/log_text.h"
#include "common/core/paths.h"
#include "common/core/rng.h"
#include "common/core/status.h"
#include "common/data/dataset.h"

namespace baton {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and read in place");

namespace {

namespace fs = std::filesystem;

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

std::string StepStreamName(int64_t step) { return "data/tokens/step/" + std::to_string(step); }

bool IsPattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

absl::Status ErrnoStatus(int err, const std::string& message) {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      code = absl::StatusCode::kNotFound;
      break;
    case EACCES:
    case EPERM:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case ENOMEM:
      code = absl::StatusCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(message, ": ", std::strerror(err)));
}

// The directory part of a pattern before its first component with a metacharacter
// ("/data/shards/train_*.bin" -> "/data/shards"; "*.bin" -> "").
std::string PatternDir(const std::string& pattern) {
  const size_t meta = pattern.find_first_of("*?[");
  const size_t slash = pattern.rfind('/', meta);
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : pattern.substr(0, slash);
}

// Sorted matches of a glob(3) pattern; empty when none.
absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern,
                                              const std::string& field) {
  glob_t g{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot expand the pattern '", EchoInput(pattern), "'"));
  }
  std::sort(out.begin(), out.end());  // byte order, whatever the locale
  return out;
}

// Confines an absolute pattern's directory (a root itself is fine: the files lie under it).
absl::Status ConfinePatternDir(const std::string& pattern, const std::vector<std::string>& roots,
                               const std::string& field) {
  const std::string dir = PatternDir(pattern);
  if (roots.empty() || dir.empty()) return absl::OkStatus();
  Confinement c;
  c.field = field;
  c.roots = roots;
  c.roots_are = "the directories this cluster reads data from";
  c.root_itself = true;
  return ConfinePath(dir, c).status();
}

bool ClimbsOut(const std::string& entry) {
  return absl::StrContains(absl::StrCat("/", entry, "/"), "/../");
}

}  // namespace

// One memory-mapped shard.
struct TokenDataset::Shard {
  ShardInfo info;
  const uint8_t* tokens = nullptr;  // info.tokens tokens of info.bytes_per_token bytes
  void* map = nullptr;
  size_t map_bytes = 0;

  ~Shard() {
    if (map != nullptr) munmap(map, map_bytes);
  }
  uint32_t At(int64_t i) const {
    if (info.bytes_per_token == 2) {
      uint16_t v;
      std::memcpy(&v, tokens + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, tokens + 4 * i, 4);
    return v;
  }
};

namespace {

// Opens and checks one shard; errors name `field` and the file.
absl::StatusOr<std::unique_ptr<TokenDataset::Shard>> OpenShard(const std::string& path,
                                                               baton::v1::TokenFormat format,
                                                               int64_t context,
                                                               const std::string& model_field,
                                                               const std::string& field) {
  const std::string where = absl::StrCat(field, ": '", EchoInput(path), "'");
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat(where, ": cannot open"));
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat(where, ": cannot stat"));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not a regular file"));
  }
  const int64_t size = st.st_size;

  auto shard = std::make_unique<TokenDataset::Shard>();
  shard->info.path = path;
  int64_t data_offset = 0;
  bool llmc = format == baton::v1::TOKEN_FORMAT_LLMC;
  int32_t header[256] = {};
  if (format == baton::v1::TOKEN_FORMAT_AUTO || llmc) {
    const int64_t want = std::min<int64_t>(size, kLlmcHeaderBytes);
    int64_t got = 0;
    while (got < want) {
      const ssize_t n = pread(fd, reinterpret_cast<char*>(header) + got, want - got, got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, absl::StrCat(where, ": cannot read"));
      if (n == 0) break;
      got += n;
    }
    const bool magic = got >= 4 && header[0] == kLlmcMagic;
    if (format == baton::v1::TOKEN_FORMAT_AUTO) llmc = magic;
    if (llmc && !magic) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not an llm.c shard (its first int32 is ",
                       got >= 4 ? absl::StrCat(header[0]) : std::string("missing"),
                       ", want the magic ", kLlmcMagic, ")"));
    }
    if (llmc && got < kLlmcHeaderBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": truncated llm.c header (", size, " bytes, the header alone is ",
          kLlmcHeaderBytes, ")"));
    }
  }
  if (llmc) {
    const int32_t version = header[1];
    if (version != 1 && version != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": llm.c header version ", version, " (want 1 for uint16 or 2 for uint32)"));
    }
    shard->info.bytes_per_token = version == 1 ? 2 : 4;
    shard->info.llmc = true;
    const int64_t count = header[2];
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": llm.c header gives a negative token count ", count));
    }
    const int64_t expected = kLlmcHeaderBytes + count * shard->info.bytes_per_token;
    if (size < expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": truncated: the header says ", count, " tokens (", expected,
          " bytes with the header) but the file has ", size, " bytes"));
    }
    if (size > expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the header says ", count, " tokens (", expected,
          " bytes with the header) but the file has ", size, " bytes"));
    }
    shard->info.tokens = count;
    data_offset = kLlmcHeaderBytes;
  } else {
    const int width = format == baton::v1::TOKEN_FORMAT_UINT32 ? 4 : 2;
    shard->info.bytes_per_token = width;
    if (size % width != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": truncated: ", size, " bytes is not a whole number of uint", 8 * width,
          " tokens"));
    }
    shard->info.tokens = size / width;
  }
  if (shard->info.tokens < context + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": holds ", shard->info.tokens, " tokens, fewer than one window of ",
        model_field, ".context + 1 = ", context + 1));
  }
  shard->map_bytes = static_cast<size_t>(size);
  void* map = mmap(nullptr, shard->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat(where, ": cannot map"));
  shard->map = map;
  shard->tokens = static_cast<const uint8_t*>(map) + data_offset;
  return shard;
}

// Window `g` of the sequential layout: shard i owns [prefix[i-1], prefix[i]).
TokenDataset::Window SequentialWindow(const std::vector<int64_t>& prefix, int64_t g,
                                      int64_t context) {
  const auto it = std::upper_bound(prefix.begin(), prefix.end(), g);
  const int64_t shard = it - prefix.begin();
  const int64_t first = shard == 0 ? 0 : prefix[shard - 1];
  return {shard, (g - first) * context};
}

// (a * b + c) mod m without overflow, for a, b, c >= 0 and m >= 1.
int64_t MulAddMod(int64_t a, int64_t b, int64_t c, int64_t m) {
  const unsigned __int128 v =
      static_cast<unsigned __int128>(a) * static_cast<unsigned __int128>(b) +
      static_cast<unsigned __int128>(c);
  return static_cast<int64_t>(v % static_cast<unsigned __int128>(m));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveTokenFiles(
    const google::protobuf::RepeatedPtrField<std::string>& entries,
    const std::vector<std::string>& roots, const std::string& field) {
  std::vector<std::string> files;
  for (const std::string& entry : entries) {
    if (entry.empty() || entry.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": an empty path"));
    }
    const bool relative = fs::path(entry).is_relative();
    if (relative && !roots.empty() && ClimbsOut(entry)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", EchoInput(entry),
                       "' climbs out of the data roots with '..'"));
    }
    // Where to look: the entry itself, or under each root in turn.
    std::vector<std::string> candidates;
    if (relative && !roots.empty()) {
      for (const std::string& root : roots) candidates.push_back((fs::path(root) / entry).string());
    } else {
      candidates.push_back(entry);
    }
    std::vector<std::string> matches;
    if (IsPattern(entry)) {
      for (const std::string& pattern : candidates) {
        BATON_RETURN_IF_ERROR(ConfinePatternDir(pattern, roots, field));
        BATON_ASSIGN_OR_RETURN(matches, Glob(pattern, field));
        if (!matches.empty()) break;
      }
      if (matches.empty()) {
        return absl::NotFoundError(
            absl::StrCat(field, ": no file matches '", EchoInput(entry), "'",
                         roots.empty() || !relative ? "" : " under the data roots"));
      }
    } else {
      std::string path = candidates.front();
      std::error_code ec;
      for (const std::string& c : candidates) {
        if (fs::exists(c, ec)) {
          path = c;
          break;
        }
      }
      matches.push_back(path);
    }
    for (const std::string& m : matches) {
      BATON_ASSIGN_OR_RETURN(std::string confined, ConfineDataPath(m, roots, field));
      files.push_back(std::move(confined));
    }
  }
  return files;
}

TokenDataset::TokenDataset(const Options& options) : options_(options) {}
TokenDataset::~TokenDataset() = default;

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(
    const baton::v1::TokenData& tokens, const Options& options, const DataAccess& access) {
  BATON_ASSIGN_OR_RETURN(std::vector<std::string> train,
                         ResolveTokenFiles(tokens.train(), access.roots, "data.tokens.train"));
  BATON_ASSIGN_OR_RETURN(std::vector<std::string> val,
                         ResolveTokenFiles(tokens.val(), access.roots, "data.tokens.val"));
  Options o = options;
  o.format = tokens.format();
  o.sampling = tokens.sampling();
  return Create(train, val, o);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Create(
    const std::vector<std::string>& train, const std::vector<std::string>& val,
    const Options& options) {
  if (options.context < 1 || options.vocab_size < 1 || options.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token dataset: sizes must be at least 1 (context=", options.context,
        ", vocab_size=", options.vocab_size, ", batch_size=", options.batch_size, ")"));
  }
  if (!baton::v1::TokenFormat_IsValid(options.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokens.format: unknown format ", options.format));
  }
  if (!baton::v1::TokenSampling_IsValid(options.sampling)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokens.sampling: unknown sampling ", options.sampling));
  }
  if (train.empty()) {
    return absl::InvalidArgumentError("data.tokens.train: no training shards");
  }
  const int64_t T = options.context;
  std::unique_ptr<TokenDataset> d(new TokenDataset(options));
  for (const std::string& path : train) {
    BATON_ASSIGN_OR_RETURN(auto shard,
                           OpenShard(path, options.format, T, options.model_field,
                                     "data.tokens.train"));
    const int64_t n = shard->info.tokens;
    d->train_starts_.push_back((d->train_starts_.empty() ? 0 : d->train_starts_.back()) + n - T);
    d->train_windows_.push_back((d->train_windows_.empty() ? 0 : d->train_windows_.back()) +
                                (n - 1) / T);
    if (options.sampling == baton::v1::TOKEN_SAMPLING_RANDOM) {
      madvise(shard->map, shard->map_bytes, MADV_RANDOM);
    }
    d->train_.push_back(std::move(shard));
  }
  for (const std::string& path : val) {
    BATON_ASSIGN_OR_RETURN(auto shard, OpenShard(path, options.format, T, options.model_field,
                                                 "data.tokens.val"));
    d->val_windows_.push_back((d->val_windows_.empty() ? 0 : d->val_windows_.back()) +
                              (shard->info.tokens - 1) / T);
    d->val_.push_back(std::move(shard));
  }
  return d;
}

TokenDataset::Window TokenDataset::TrainWindow(int64_t step, int64_t index) const {
  const int64_t T = options_.context;
  if (options_.sampling == baton::v1::TOKEN_SAMPLING_SEQUENTIAL) {
    return SequentialWindow(train_windows_,
                            MulAddMod(step, options_.batch_size, index, train_windows()), T);
  }
  const RngStream rng(options_.seed, StepStreamName(step));
  const int64_t u = static_cast<int64_t>(rng.UniformInt(
      static_cast<uint64_t>(index), static_cast<uint64_t>(train_starts_.back())));
  const auto it = std::upper_bound(train_starts_.begin(), train_starts_.end(), u);
  const int64_t shard = it - train_starts_.begin();
  return {shard, u - (shard == 0 ? 0 : train_starts_[shard - 1])};
}

TokenDataset::Window TokenDataset::ValidationWindow(int64_t eval_batch, int64_t index) const {
  return SequentialWindow(val_windows_,
                          MulAddMod(eval_batch, options_.batch_size, index, val_windows()),
                          options_.context);
}

absl::StatusOr<Batch> TokenDataset::Read(const std::vector<std::unique_ptr<Shard>>& shards,
                                         const char* field,
                                         absl::Span<const Window> windows) const {
  const int64_t T = options_.context;
  const int64_t count = static_cast<int64_t>(windows.size());
  Batch batch;
  BATON_ASSIGN_OR_RETURN(batch.inputs, Tensor::TryEmpty({count, T}, DType::kInt32));
  BATON_ASSIGN_OR_RETURN(batch.targets, Tensor::TryEmpty({count, T}, DType::kInt32));
  int32_t* inputs = batch.inputs.i32();
  int32_t* targets = batch.targets.i32();
  const uint64_t vocab = static_cast<uint64_t>(options_.vocab_size);
  for (int64_t k = 0; k < count; ++k) {
    const Shard& shard = *shards[windows[k].shard];
    const int64_t pos = windows[k].position;
    for (int64_t t = 0; t <= T; ++t) {
      const uint32_t id = shard.At(pos + t);
      if (id >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": '", EchoInput(shard.info.path), "' has token id ", id,
            " at token offset ", pos + t, ", not below ", options_.model_field,
            ".vocab_size=", options_.vocab_size));
      }
      if (t < T) inputs[k * T + t] = static_cast<int32_t>(id);
      if (t > 0) targets[k * T + t - 1] = static_cast<int32_t>(id);
    }
  }
  return batch;
}

absl::StatusOr<Batch> TokenDataset::Get(int64_t step, int64_t first, int64_t count) const {
  BATON_RETURN_IF_ERROR(data_internal::CheckRange(step, first, count, options_.batch_size));
  std::vector<Window> windows;
  windows.reserve(count);
  for (int64_t k = 0; k < count; ++k) windows.push_back(TrainWindow(step, first + k));
  return Read(train_, "data.tokens.train", windows);
}

absl::StatusOr<Batch> TokenDataset::GetValidation(int64_t eval_batch, int64_t first,
                                                  int64_t count) const {
  if (val_.empty()) return Dataset::GetValidation(eval_batch, first, count);
  BATON_RETURN_IF_ERROR(data_internal::CheckRange(eval_batch, first, count, options_.batch_size));
  std::vector<Window> windows;
  windows.reserve(count);
  for (int64_t k = 0; k < count; ++k) windows.push_back(ValidationWindow(eval_batch, first + k));
  return Read(val_, "data.tokens.val", windows);
}

std::vector<TokenDataset::ShardInfo> TokenDataset::train_shards() const {
  std::vector<ShardInfo> out;
  for (const auto& s : train_) out.push_back(s->info);
  return out;
}

int64_t TokenDataset::train_tokens() const {
  int64_t n = 0;
  for (const auto& s : train_) n += s->info.tokens;
  return n;
}

std::string TokenDataset::Describe() const {
  int64_t val_tokens = 0;
  for (const auto& s : val_) val_tokens += s->info.tokens;
  return absl::StrCat(
      "tokens: ", train_tokens(), " training tokens in ", train_.size(), " shard",
      train_.size() == 1 ? "" : "s", " (first '", train_.front()->info.path, "'), ",
      val_tokens, " validation tokens in ", val_.size(), " shard", val_.size() == 1 ? "" : "s",
      ", ",
      options_.sampling == baton::v1::TOKEN_SAMPLING_SEQUENTIAL ? "sequential" : "random",
      " windows, vocab ", options_.vocab_size, ", context ", options_.context, ", batch ",
      options_.batch_size, ", seed ", options_.seed);
}

absl::Status CheckTokenDataAtSubmit(const baton::v1::JobSpec& spec,
                                    const std::vector<std::string>& roots) {
  if (!spec.data().has_tokens()) return absl::OkStatus();
  const std::optional<TokenModel> model = TokenModelOf(spec.model());
  if (!model) return absl::OkStatus();  // validation refuses it
  const baton::v1::TokenData& tokens = spec.data().tokens();
  TokenDataset::Options options;
  options.context = model->context;
  options.vocab_size = model->vocab_size;
  options.batch_size = std::max(1, spec.data().batch_size());
  options.seed = spec.seed();
  options.model_field = model->prefix;
  options.format = tokens.format();
  options.sampling = tokens.sampling();
  for (const auto* entries : {&tokens.train(), &tokens.val()}) {
    const std::string field = entries == &tokens.train() ? "data.tokens.train" : "data.tokens.val";
    for (const std::string& entry : *entries) {
      google::protobuf::RepeatedPtrField<std::string> one;
      one.Add()->assign(entry);
      absl::StatusOr<std::vector<std::string>> files = ResolveTokenFiles(one, roots, field);
      if (absl::IsNotFound(files.status())) continue;  // on the workers only
      BATON_RETURN_IF_ERROR(files.status());
      for (const std::string& file : *files) {
        absl::StatusOr<std::unique_ptr<TokenDataset::Shard>> shard =
            OpenShard(file, options.format, options.context, options.model_field, field);
        if (absl::IsNotFound(shard.status())) continue;
        BATON_RETURN_IF_ERROR(shard.status());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace baton

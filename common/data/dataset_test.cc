#include "common/data/dataset.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/core/rng.h"
#include "common/spec/spec.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::baton::v1::JobSpec;

// The specs here are plain protos: validated first, as every caller of MakeDataset does.
absl::StatusOr<std::unique_ptr<Dataset>> ValidateAndMake(const JobSpec& spec,
                                                         const DataAccess& access = DataAccess()) {
  absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
  if (!valid.ok()) return valid.status();
  return MakeDataset(*valid, access);
}

#ifndef BATON_SOURCE_DIR
#error "data_test needs BATON_SOURCE_DIR (the repository root)"
#endif

constexpr char kText[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.";

JobSpec GptSpec(const std::string& text, int context = 8, int vocab = 64) {
  JobSpec spec;
  spec.set_steps(10);
  spec.set_seed(7);
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_vocab_size(vocab);
  gpt->set_context(context);
  gpt->set_d_model(16);
  gpt->set_heads(2);
  gpt->set_layers(1);
  spec.mutable_data()->mutable_text()->set_inline_text(text);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_pipeline()->set_microbatches(2);
  spec.mutable_optimizer()->mutable_adamw()->set_learning_rate(1e-3f);
  return spec;
}

JobSpec MlpSpec(float noise = 0.0f) {
  JobSpec spec;
  spec.set_steps(10);
  spec.set_seed(11);
  auto* mlp = spec.mutable_model()->mutable_mlp();
  mlp->set_input_dim(5);
  mlp->set_width(16);
  mlp->set_depth(2);
  mlp->set_output_dim(3);
  spec.mutable_data()->mutable_synthetic()->set_teacher_width(7);
  spec.mutable_data()->mutable_synthetic()->set_noise(noise);
  spec.mutable_data()->set_batch_size(8);
  spec.mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  return spec;
}

std::unique_ptr<Dataset> Make(const JobSpec& spec) {
  absl::StatusOr<std::unique_ptr<Dataset>> ds = ValidateAndMake(spec);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return ds.ok() ? std::move(*ds) : nullptr;
}

Batch MustGet(const Dataset& ds, int64_t step, int64_t first, int64_t count) {
  absl::StatusOr<Batch> b = ds.Get(step, first, count);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : Batch();
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Concatenates two tensors along dimension 0 (same dtype and trailing shape).
Tensor Concat(const Tensor& a, const Tensor& b) {
  Shape shape = a.shape();
  shape[0] += b.dim(0);
  Tensor out = Tensor::Empty(shape, a.dtype());
  std::memcpy(out.raw(), a.raw(), a.nbytes());
  std::memcpy(static_cast<char*>(out.raw()) + a.nbytes(), b.raw(), b.nbytes());
  return out;
}

// Determinism contract shared by both datasets.
void CheckDeterministic(const Dataset& ds) {
  const Batch whole = MustGet(ds, 3, 0, 8);
  const Batch again = MustGet(ds, 3, 0, 8);
  EXPECT_TRUE(SameBytes(whole.inputs, again.inputs));
  EXPECT_TRUE(SameBytes(whole.targets, again.targets));
  for (int split : {1, 4, 7}) {
    SCOPED_TRACE(split);
    const Batch a = MustGet(ds, 3, 0, split);
    const Batch b = MustGet(ds, 3, split, 8 - split);
    EXPECT_TRUE(SameBytes(whole.inputs, Concat(a.inputs, b.inputs)));
    EXPECT_TRUE(SameBytes(whole.targets, Concat(a.targets, b.targets)));
  }
  const Batch other = MustGet(ds, 4, 0, 8);
  EXPECT_FALSE(SameBytes(whole.inputs, other.inputs));
  EXPECT_FALSE(SameBytes(whole.targets, other.targets));
}

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& part : parts) {
    EXPECT_TRUE(absl::StrContains(status.message(), part)) << status << " lacks " << part;
  }
}

// ---- Text ----

TEST(TextDatasetTest, Deterministic) {
  auto ds = Make(GptSpec(kText));
  ASSERT_NE(ds, nullptr);
  CheckDeterministic(*ds);
}

TEST(TextDatasetTest, ShapesAndTypes) {
  auto ds = Make(GptSpec(kText, /*context=*/12));
  ASSERT_NE(ds, nullptr);
  const Batch b = MustGet(*ds, 0, 2, 3);
  EXPECT_EQ(b.inputs.dtype(), DType::kInt32);
  EXPECT_EQ(b.targets.dtype(), DType::kInt32);
  EXPECT_EQ(b.inputs.shape(), (Shape{3, 12}));
  EXPECT_EQ(b.targets.shape(), (Shape{3, 12}));
  EXPECT_EQ(ds->batch_size(), 8);
}

TEST(TextDatasetTest, SamplesAreShiftedWindowsOfTheText) {
  const std::string text = kText;
  const int T = 10;
  auto made = ValidateAndMake(GptSpec(text, T));
  ASSERT_TRUE(made.ok()) << made.status();
  const auto* ds = dynamic_cast<const TextDataset*>(made->get());
  ASSERT_NE(ds, nullptr);
  for (int64_t step : {0, 1, 99}) {
    const Batch b = MustGet(*ds, step, 0, 8);
    for (int k = 0; k < 8; ++k) {
      const int32_t* in = b.inputs.i32() + k * T;
      const int32_t* tg = b.targets.i32() + k * T;
      const int64_t offset = ds->SampleOffset(step, k);
      ASSERT_LE(offset + T + 1, static_cast<int64_t>(text.size()));
      EXPECT_EQ(ds->Decode(absl::MakeConstSpan(in, T)), text.substr(offset, T));
      EXPECT_EQ(ds->Decode(absl::MakeConstSpan(tg, T)), text.substr(offset + 1, T));
      for (int t = 0; t + 1 < T; ++t) EXPECT_EQ(tg[t], in[t + 1]);
    }
  }
}

TEST(TextDatasetTest, OffsetFollowsTheDocumentedStream) {
  auto made = ValidateAndMake(GptSpec(kText, 8));
  ASSERT_TRUE(made.ok());
  const auto* ds = dynamic_cast<const TextDataset*>(made->get());
  const uint64_t len = std::strlen(kText);
  const RngStream rng(7, "data/text/step/5");
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ds->SampleOffset(5, i), static_cast<int64_t>(rng.UniformInt(i, len - 8)));
  }
}

TEST(TextDatasetTest, TokenIdsAreByteRanks) {
  auto made = ValidateAndMake(GptSpec(kText, 8, /*vocab=*/40));
  ASSERT_TRUE(made.ok()) << made.status();
  const auto* ds = dynamic_cast<const TextDataset*>(made->get());
  const std::set<char> distinct(std::begin(kText), std::end(kText) - 1);  // drop the NUL
  EXPECT_EQ(ds->num_chars(), static_cast<int>(distinct.size()));
  EXPECT_EQ(ds->alphabet(), std::string(distinct.begin(), distinct.end()));
  EXPECT_EQ(ds->alphabet()[0], ' ');  // smallest byte in the text
  for (int64_t step = 0; step < 20; ++step) {
    const Batch b = MustGet(*ds, step, 0, 8);
    for (int64_t n = 0; n < b.inputs.numel(); ++n) {
      ASSERT_GE(b.inputs.i32()[n], 0);
      ASSERT_LT(b.inputs.i32()[n], ds->num_chars());
      ASSERT_LT(b.targets.i32()[n], 40);
    }
  }
  absl::StatusOr<std::vector<int32_t>> ids = ds->Encode("the age");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ds->Decode(*ids), "the age");
  EXPECT_EQ((*ids)[3], 0);                 // ' '
  EXPECT_FALSE(ds->Encode("zebra").ok());  // 'z' is not in the text
  EXPECT_EQ(ds->Decode(std::vector<int32_t>{-1, 1000}), "??");
}

TEST(TextDatasetTest, EveryOffsetIsReachable) {
  // The shortest text allowed: context + 2 bytes, so offsets 0 and 1.
  auto made = ValidateAndMake(GptSpec("abcdefghij", /*context=*/8));
  ASSERT_TRUE(made.ok()) << made.status();
  const auto* ds = dynamic_cast<const TextDataset*>(made->get());
  std::set<int64_t> offsets;
  for (int64_t step = 0; step < 32; ++step) {
    for (int i = 0; i < 8; ++i) offsets.insert(ds->SampleOffset(step, i));
  }
  EXPECT_EQ(offsets, (std::set<int64_t>{0, 1}));
}

TEST(TextDatasetTest, RefusesTextTooShort) {
  auto made = ValidateAndMake(GptSpec("abcdefghi", /*context=*/8));  // 9 bytes = context + 1
  ExpectError(made.status(), absl::StatusCode::kInvalidArgument,
              {"data.text.inline_text: ", "model.gpt.context=8"});
}

TEST(TextDatasetTest, RefusesVocabTooSmall) {
  auto made = ValidateAndMake(GptSpec("abcde abcde abcde", 4, /*vocab=*/5));  // 6 distinct
  ExpectError(made.status(), absl::StatusCode::kInvalidArgument,
              {"model.gpt.vocab_size: 5 is smaller than the 6 distinct characters of the text"});
  EXPECT_TRUE(ValidateAndMake(GptSpec("abcde abcde abcde", 4, /*vocab=*/6)).ok());
}

TEST(TextDatasetTest, RefusesEmptyText) {
  auto made = ValidateAndMake(GptSpec(""));
  ExpectError(made.status(), absl::StatusCode::kInvalidArgument, {"data.text.inline_text: "});
  TextDataset::Options options;
  options.context = 4;
  options.vocab_size = 8;
  options.batch_size = 1;
  ExpectError(TextDataset::Create("", options).status(), absl::StatusCode::kInvalidArgument,
              {"data.text.inline_text: empty text"});
}

TEST(TextDatasetTest, ReadsFileAndRefusesEmptyOrMissingFile) {
  const std::string path = testing::TempDir() + "/baton-data-test.txt";
  JobSpec spec = GptSpec(kText);
  spec.mutable_data()->mutable_text()->set_path(path);

  { std::ofstream(path) << kText; }
  auto from_file = ValidateAndMake(spec);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  auto inline_ds = Make(GptSpec(kText));
  ASSERT_NE(inline_ds, nullptr);
  EXPECT_TRUE(SameBytes(MustGet(**from_file, 2, 0, 8).inputs, MustGet(*inline_ds, 2, 0, 8).inputs));
  EXPECT_TRUE(absl::StrContains((*from_file)->Describe(), path));

  { std::ofstream truncate(path); }
  ExpectError(ValidateAndMake(spec).status(), absl::StatusCode::kInvalidArgument,
              {"data.text.path: ", "empty text", path});

  const std::string missing = testing::TempDir() + "/baton-no-such-file.txt";
  spec.mutable_data()->mutable_text()->set_path(missing);
  ExpectError(ValidateAndMake(spec).status(), absl::StatusCode::kNotFound,
              {"data.text.path", missing});
}

// Workers read text only under their data roots, and only regular files of bounded size:
// a job cannot make one read /etc/shadow, escape through a symlink or "..", or read forever.
TEST(TextDatasetTest, FilesAreConfinedToTheDataRootsAndBounded) {
  namespace fs = std::filesystem;
  const fs::path base = fs::path(testing::TempDir()) / "baton-data-roots";
  fs::remove_all(base);
  fs::create_directories(base / "data" / "sub");
  fs::create_directories(base / "data2");
  { std::ofstream((base / "data" / "sub" / "t.txt").string()) << kText; }
  { std::ofstream((base / "data2" / "t.txt").string()) << kText; }
  fs::create_symlink(base / "data2" / "t.txt", base / "data" / "escape.txt");
  DataAccess access;
  access.roots = {(base / "data").string()};
  JobSpec spec = GptSpec(kText);
  auto with_path = [&](const fs::path& p) {
    spec.mutable_data()->mutable_text()->set_path(p.string());
    return ValidateAndMake(spec, access).status();
  };
  EXPECT_TRUE(with_path(base / "data" / "sub" / "t.txt").ok());
  EXPECT_TRUE(with_path(base / "data" / "sub" / ".." / "sub" / "t.txt").ok());
  ExpectError(with_path("/etc/shadow"), absl::StatusCode::kInvalidArgument,
              {"data.text.path: '/etc/shadow' is outside the directories this cluster reads "
               "data from (", (base / "data").string()});
  ExpectError(with_path(base / "data" / ".." / "data2" / "t.txt"),
              absl::StatusCode::kInvalidArgument, {"is outside", "resolves to"});
  ExpectError(with_path(base / "data2" / "t.txt"), absl::StatusCode::kInvalidArgument,
              {"is outside"});  // data2 is not under data
  ExpectError(with_path(base / "data" / "escape.txt"), absl::StatusCode::kInvalidArgument,
              {"is outside", (base / "data2" / "t.txt").string()});  // symlink out
  ExpectError(with_path(base / "data" / "sub"), absl::StatusCode::kInvalidArgument,
              {"is not a regular file"});  // a directory
  // Not a regular file, or too big: refused before reading (anywhere, roots or not).
  ExpectError(LoadText([] {
                baton::v1::TextData t;
                t.set_path("/dev/zero");
                return t;
              }()).status(),
              absl::StatusCode::kInvalidArgument, {"'/dev/zero' is not a regular file"});
  access.max_file_bytes = 10;
  ExpectError(with_path(base / "data" / "sub" / "t.txt"), absl::StatusCode::kInvalidArgument,
              {"bytes, over the bound of 10"});
  fs::remove_all(base);
  // The defaults: data/ beside the binary and the demo's licenses directory.
  const std::vector<std::string> defaults = DataRootsFromFlag("");
  ASSERT_EQ(defaults.size(), 2u);
  EXPECT_TRUE(absl::EndsWith(defaults[0], "/data")) << defaults[0];
  EXPECT_EQ(defaults[1], "/usr/share/common-licenses");
  EXPECT_EQ(DataRootsFromFlag(" /a, /b ,"), (std::vector<std::string>{"/a", "/b"}));
}

TEST(TextDatasetTest, GptExampleOnGpl3) {
  const std::string gpl = "/usr/share/common-licenses/GPL-3";
  if (!std::ifstream(gpl).good()) GTEST_SKIP() << gpl << " not installed";
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile(std::string(BATON_SOURCE_DIR) + "/client/examples/gpt.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto made = ValidateAndMake(*spec);
  ASSERT_TRUE(made.ok()) << made.status();
  const auto* ds = dynamic_cast<const TextDataset*>(made->get());
  ASSERT_NE(ds, nullptr);
  EXPECT_LE(ds->num_chars(), 96);
  const Batch b = MustGet(*ds, 0, 0, 16);
  EXPECT_EQ(b.inputs.shape(), (Shape{16, 64}));
  EXPECT_FALSE(ds->Describe().empty());
}

// ---- Synthetic ----

// The teacher and a sample recomputed from the documented scheme, independently of the
// dataset's code.
std::vector<float> Teacher(uint64_t seed, const char* name, int64_t n, double stddev) {
  std::vector<float> w(n);
  RngStream(seed, name).FillNormal(w.data(), n, 0.0f, static_cast<float>(stddev));
  return w;
}

std::vector<double> TeacherOutput(uint64_t seed, int64_t in, int64_t hid, int64_t out,
                                  const std::vector<float>& x) {
  const auto w1 = Teacher(seed, "data/teacher/W1", hid * in, 1.0 / std::sqrt(double(in)));
  const auto b1 = Teacher(seed, "data/teacher/b1", hid, 0.1);
  const auto w2 = Teacher(seed, "data/teacher/W2", out * hid, 1.0 / std::sqrt(double(hid)));
  const auto b2 = Teacher(seed, "data/teacher/b2", out, 0.1);
  std::vector<double> h(hid), y(out);
  for (int64_t t = 0; t < hid; ++t) {
    double pre = b1[t];
    for (int64_t j = 0; j < in; ++j) pre += double(w1[t * in + j]) * double(x[j]);
    h[t] = std::tanh(pre);
  }
  for (int64_t k = 0; k < out; ++k) {
    double acc = b2[k];
    for (int64_t t = 0; t < hid; ++t) acc += double(w2[k * hid + t]) * h[t];
    y[k] = acc;
  }
  return y;
}

TEST(SyntheticDatasetTest, Deterministic) {
  auto ds = Make(MlpSpec(0.1f));
  ASSERT_NE(ds, nullptr);
  CheckDeterministic(*ds);
}

TEST(SyntheticDatasetTest, ShapesAndTypes) {
  auto ds = Make(MlpSpec());
  ASSERT_NE(ds, nullptr);
  const Batch b = MustGet(*ds, 1, 0, 8);
  EXPECT_EQ(b.inputs.dtype(), DType::kFloat32);
  EXPECT_EQ(b.inputs.shape(), (Shape{8, 5}));
  EXPECT_EQ(b.targets.shape(), (Shape{8, 3}));
  EXPECT_TRUE(absl::StrContains(ds->Describe(), "width 7"));
}

TEST(SyntheticDatasetTest, NoiseFreeTargetsAreTheTeacherOutput) {
  auto ds = Make(MlpSpec(0.0f));
  ASSERT_NE(ds, nullptr);
  const int64_t step = 12, i = 5;
  const Batch b = MustGet(*ds, step, i, 1);
  const RngStream xs(11, "data/synthetic/step/12");
  std::vector<float> x(5);
  for (int j = 0; j < 5; ++j) {
    x[j] = xs.Normal(i * 5 + j);
    EXPECT_EQ(b.inputs.f32()[j], x[j]);
  }
  const std::vector<double> y = TeacherOutput(11, 5, 7, 3, x);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(b.targets.f32()[k], static_cast<float>(y[k])) << k;
}

TEST(SyntheticDatasetTest, NoisyTargetsAddScaledNormalNoise) {
  const float noise = 0.25f;
  auto ds = Make(MlpSpec(noise));
  ASSERT_NE(ds, nullptr);
  const int64_t step = 3, i = 6;
  const Batch b = MustGet(*ds, step, i, 1);
  std::vector<float> x(b.inputs.f32(), b.inputs.f32() + 5);
  const std::vector<double> y = TeacherOutput(11, 5, 7, 3, x);
  const RngStream n(11, "data/noise/step/3");
  for (int k = 0; k < 3; ++k) {
    const double want = y[k] + double(noise) * double(n.Normal(i * 3 + k));
    EXPECT_EQ(b.targets.f32()[k], static_cast<float>(want)) << k;
    EXPECT_NE(b.targets.f32()[k], static_cast<float>(y[k])) << k;
  }
}

TEST(SyntheticDatasetTest, TeacherWidthDefaultsTo32) {
  JobSpec spec = MlpSpec();
  spec.mutable_data()->mutable_synthetic()->set_teacher_width(0);
  auto made = ValidateAndMake(spec);
  ASSERT_TRUE(made.ok()) << made.status();
  const auto* ds = dynamic_cast<const SyntheticDataset*>(made->get());
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->options().teacher_width, 32);
  EXPECT_EQ(ds->w1().size(), 32u * 5u);
  EXPECT_EQ(ds->w2().size(), 3u * 32u);
}

TEST(SyntheticDatasetTest, MlpTinyExample) {
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile(std::string(BATON_SOURCE_DIR) + "/client/examples/mlp-tiny.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto ds = Make(*spec);
  ASSERT_NE(ds, nullptr);
  const Batch b = MustGet(*ds, 0, 24, 8);
  EXPECT_EQ(b.inputs.shape(), (Shape{8, 8}));
  EXPECT_EQ(b.targets.shape(), (Shape{8, 4}));
}

// ---- Shared ----

TEST(DatasetTest, RefusesBadRanges) {
  for (const JobSpec& spec : {GptSpec(kText), MlpSpec()}) {
    auto ds = Make(spec);
    ASSERT_NE(ds, nullptr);
    EXPECT_EQ(ds->Get(0, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ds->Get(-1, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ds->Get(0, -1, 1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ds->Get(0, 4, 5).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(ds->Get(0, 8, 1).status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_TRUE(ds->Get(0, 7, 1).ok());
  }
}

}  // namespace
}  // namespace baton

// TokenDataset: formats, windows, determinism and resume, validation batches, refusals.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/core/rng.h"
#include "common/data/dataset.h"
#include "common/spec/spec.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

namespace fs = std::filesystem;

// The specs here are plain protos: validated first, as every caller of MakeDataset does.
absl::StatusOr<std::unique_ptr<Dataset>> ValidateAndMake(const baton::v1::JobSpec& spec,
                                                         const DataAccess& access = DataAccess()) {
  absl::StatusOr<ValidatedJobSpec> valid = ValidatedJobSpec::Validate(spec);
  if (!valid.ok()) return valid.status();
  return MakeDataset(*valid, access);
}
using ::baton::v1::JobSpec;

// A fresh directory per test.
class TokenDatasetTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           absl::StrCat("baton_tokens_", getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static void WriteBytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  template <typename T>
  static std::string Raw(const std::vector<uint32_t>& ids) {
    std::string out;
    for (uint32_t id : ids) {
      const T v = static_cast<T>(id);
      out.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    return out;
  }
  // An llm.c shard; `count` overrides the header's count unless it is kOwnCount.
  static constexpr int64_t kOwnCount = INT64_MIN;
  static std::string Llmc(const std::vector<uint32_t>& ids, int version,
                          int64_t count = kOwnCount) {
    int32_t header[256] = {};
    header[0] = 20240520;
    header[1] = version;
    header[2] = static_cast<int32_t>(count != kOwnCount ? count : static_cast<int64_t>(ids.size()));
    std::string out(reinterpret_cast<const char*>(header), sizeof header);
    return out + (version == 2 ? Raw<uint32_t>(ids) : Raw<uint16_t>(ids));
  }
  // ids base, base + 1, ... (mod vocab).
  static std::vector<uint32_t> Ramp(int n, uint32_t base, uint32_t vocab = 1000) {
    std::vector<uint32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = (base + i) % vocab;
    return v;
  }

  static TokenDataset::Options Opts(int64_t context = 4, int64_t batch = 6,
                                    baton::v1::TokenSampling sampling =
                                        baton::v1::TOKEN_SAMPLING_RANDOM) {
    TokenDataset::Options o;
    o.context = context;
    o.vocab_size = 1000;
    o.batch_size = batch;
    o.seed = 42;
    o.sampling = sampling;
    return o;
  }

  fs::path dir_;
};

std::vector<int32_t> Ids(const Tensor& t) { return std::vector<int32_t>(t.i32(), t.i32() + t.numel()); }

void ExpectSameBatch(const Batch& a, const Batch& b) {
  EXPECT_EQ(Ids(a.inputs), Ids(b.inputs));
  EXPECT_EQ(Ids(a.targets), Ids(b.targets));
}

// Every sample is the T + 1 tokens of its window, shifted for the targets.
void ExpectWindowsOf(const Batch& batch, const std::vector<std::vector<uint32_t>>& shards,
                     const std::vector<TokenDataset::Window>& windows, int64_t T) {
  const std::vector<int64_t> shape(batch.inputs.shape().begin(), batch.inputs.shape().end());
  ASSERT_EQ(shape, (std::vector<int64_t>{static_cast<int64_t>(windows.size()), T}));
  ASSERT_EQ(batch.targets.shape(), batch.inputs.shape());
  for (size_t k = 0; k < windows.size(); ++k) {
    const auto& s = shards[windows[k].shard];
    ASSERT_LE(windows[k].position + T + 1, static_cast<int64_t>(s.size()));
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(batch.inputs.i32()[k * T + t], static_cast<int32_t>(s[windows[k].position + t]));
      EXPECT_EQ(batch.targets.i32()[k * T + t],
                static_cast<int32_t>(s[windows[k].position + t + 1]));
    }
  }
}

TEST_F(TokenDatasetTest, ReadsEveryFormat) {
  const std::vector<uint32_t> small = Ramp(50, 3);
  const std::vector<uint32_t> big = {70000, 5, 80000, 6, 99999, 7, 1, 2, 3, 65536, 4, 9};
  struct Case {
    std::string name, bytes;
    baton::v1::TokenFormat format;
    std::vector<uint32_t> ids;
    bool llmc;
    int width;
  };
  const std::vector<Case> cases = {
      {"raw16.bin", Raw<uint16_t>(small), baton::v1::TOKEN_FORMAT_UINT16, small, false, 2},
      {"raw16auto.bin", Raw<uint16_t>(small), baton::v1::TOKEN_FORMAT_AUTO, small, false, 2},
      {"raw32.bin", Raw<uint32_t>(big), baton::v1::TOKEN_FORMAT_UINT32, big, false, 4},
      {"llmc1.bin", Llmc(small, 1), baton::v1::TOKEN_FORMAT_LLMC, small, true, 2},
      {"llmc1auto.bin", Llmc(small, 1), baton::v1::TOKEN_FORMAT_AUTO, small, true, 2},
      {"llmc2.bin", Llmc(big, 2), baton::v1::TOKEN_FORMAT_AUTO, big, true, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    WriteBytes(Path(c.name), c.bytes);
    TokenDataset::Options o = Opts(4, 6);
    o.vocab_size = 100000;
    o.format = c.format;
    auto d = TokenDataset::Create({Path(c.name)}, {}, o);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ((*d)->train_shards().size(), 1u);
    EXPECT_EQ((*d)->train_shards()[0].tokens, static_cast<int64_t>(c.ids.size()));
    EXPECT_EQ((*d)->train_shards()[0].llmc, c.llmc);
    EXPECT_EQ((*d)->train_shards()[0].bytes_per_token, c.width);
    for (int64_t step : {0, 1, 17}) {
      auto b = (*d)->Get(step, 0, 6);
      ASSERT_TRUE(b.ok()) << b.status();
      std::vector<TokenDataset::Window> w;
      for (int k = 0; k < 6; ++k) w.push_back((*d)->TrainWindow(step, k));
      ExpectWindowsOf(*b, {c.ids}, w, 4);
    }
  }
}

TEST_F(TokenDatasetTest, RandomWindowsFollowTheDocumentedStream) {
  const std::vector<std::vector<uint32_t>> shards = {Ramp(30, 0), Ramp(12, 100), Ramp(5, 200)};
  std::vector<std::string> paths;
  for (size_t i = 0; i < shards.size(); ++i) {
    paths.push_back(Path(absl::StrCat("s", i, ".bin")));
    WriteBytes(paths.back(), Llmc(shards[i], 1));
  }
  const int64_t T = 4;
  auto d = TokenDataset::Create(paths, {}, Opts(T, 8));
  ASSERT_TRUE(d.ok()) << d.status();
  // Starts per shard: 30 - 4, 12 - 4, 5 - 4.
  const int64_t starts[] = {26, 8, 1};
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t step = 0; step < 200; ++step) {
    const RngStream rng(42, absl::StrCat("data/tokens/step/", step));
    for (int64_t k = 0; k < 8; ++k) {
      int64_t u = static_cast<int64_t>(rng.UniformInt(k, 26 + 8 + 1));
      int64_t shard = 0;
      while (u >= starts[shard]) u -= starts[shard++];
      const TokenDataset::Window w = (*d)->TrainWindow(step, k);
      EXPECT_EQ(w.shard, shard);
      EXPECT_EQ(w.position, u);
      seen.insert({w.shard, w.position});
    }
    auto b = (*d)->Get(step, 0, 8);
    ASSERT_TRUE(b.ok()) << b.status();
    std::vector<TokenDataset::Window> w;
    for (int k = 0; k < 8; ++k) w.push_back((*d)->TrainWindow(step, k));
    ExpectWindowsOf(*b, shards, w, T);
  }
  EXPECT_EQ(seen.size(), 35u);  // every start of every shard occurs
}

TEST_F(TokenDatasetTest, SequentialWindowsMatchTheWorkedExample) {
  // The example in dataset.h: shards of 9 and 7 tokens, T = 3, batch 3.
  WriteBytes(Path("a.bin"), Raw<uint16_t>(Ramp(9, 0)));
  WriteBytes(Path("b.bin"), Raw<uint16_t>(Ramp(7, 100)));
  auto d = TokenDataset::Create({Path("a.bin"), Path("b.bin")}, {},
                                Opts(3, 3, baton::v1::TOKEN_SAMPLING_SEQUENTIAL));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->train_windows(), 4);
  auto at = [&](int64_t step, int64_t k) {
    const TokenDataset::Window w = (*d)->TrainWindow(step, k);
    return std::make_pair(w.shard, w.position);
  };
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(at(0, 0), P(0, 0));
  EXPECT_EQ(at(0, 1), P(0, 3));
  EXPECT_EQ(at(0, 2), P(1, 0));
  EXPECT_EQ(at(1, 0), P(1, 3));
  EXPECT_EQ(at(1, 1), P(0, 0));  // wrapped
  EXPECT_EQ(at(1, 2), P(0, 3));
  auto b = (*d)->Get(1, 0, 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Ids(b->inputs), (std::vector<int32_t>{103, 104, 105, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(Ids(b->targets), (std::vector<int32_t>{104, 105, 106, 1, 2, 3, 4, 5, 6}));
  // Huge steps do not overflow.
  const int64_t big = int64_t{1} << 62;
  EXPECT_GE((*d)->TrainWindow(big, 2).shard, 0);
}

TEST_F(TokenDatasetTest, BatchesDoNotDependOnTheMicroBatchSplit) {
  WriteBytes(Path("a.bin"), Raw<uint16_t>(Ramp(300, 0)));
  for (auto sampling : {baton::v1::TOKEN_SAMPLING_RANDOM, baton::v1::TOKEN_SAMPLING_SEQUENTIAL}) {
    auto d = TokenDataset::Create({Path("a.bin")}, {}, Opts(8, 6, sampling));
    ASSERT_TRUE(d.ok()) << d.status();
    auto whole = (*d)->Get(3, 0, 6);
    auto lo = (*d)->Get(3, 0, 2);
    auto hi = (*d)->Get(3, 2, 4);
    ASSERT_TRUE(whole.ok() && lo.ok() && hi.ok());
    std::vector<int32_t> joined = Ids(lo->inputs);
    for (int32_t v : Ids(hi->inputs)) joined.push_back(v);
    EXPECT_EQ(Ids(whole->inputs), joined);
  }
}

// The read position is the step: a dataset built afresh (a resumed job, on any partition)
// returns, from step k on, exactly the batches the uninterrupted run read.
TEST_F(TokenDatasetTest, AResumedRunReadsWhatTheUninterruptedOneRead) {
  WriteBytes(Path("train_000.bin"), Llmc(Ramp(97, 0), 1));
  WriteBytes(Path("train_001.bin"), Llmc(Ramp(61, 300), 1));
  WriteBytes(Path("val.bin"), Llmc(Ramp(40, 500), 1));
  for (auto sampling : {baton::v1::TOKEN_SAMPLING_RANDOM, baton::v1::TOKEN_SAMPLING_SEQUENTIAL}) {
    SCOPED_TRACE(sampling);
    JobSpec spec;
    spec.set_steps(20);
    spec.set_seed(5);
    auto* gpt = spec.mutable_model()->mutable_gpt();
    gpt->set_vocab_size(1000);
    gpt->set_context(8);
    gpt->set_d_model(16);
    gpt->set_heads(2);
    gpt->set_layers(1);
    spec.mutable_data()->set_batch_size(4);
    auto* t = spec.mutable_data()->mutable_tokens();
    t->add_train("train_*.bin");
    t->add_val("val.bin");
    t->set_sampling(sampling);
    spec.mutable_optimizer()->mutable_adamw()->set_learning_rate(1e-3f);
    DataAccess access;
    access.roots = {dir_.string()};
    auto run = ValidateAndMake(spec, access);
    ASSERT_TRUE(run.ok()) << run.status();
    std::vector<Batch> uninterrupted;
    for (int64_t step = 0; step < 20; ++step) {
      auto b = (*run)->Get(step, 0, 4);
      ASSERT_TRUE(b.ok()) << b.status();
      uninterrupted.push_back(*b);
    }
    auto resumed = ValidateAndMake(spec, access);  // a fresh process resuming at step 12
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    for (int64_t step = 12; step < 20; ++step) {
      // Another split of the batch (a resume onto two micro-batches per step).
      auto lo = (*resumed)->Get(step, 0, 2);
      auto hi = (*resumed)->Get(step, 2, 2);
      ASSERT_TRUE(lo.ok() && hi.ok());
      std::vector<int32_t> in = Ids(lo->inputs), tg = Ids(lo->targets);
      for (int32_t v : Ids(hi->inputs)) in.push_back(v);
      for (int32_t v : Ids(hi->targets)) tg.push_back(v);
      EXPECT_EQ(in, Ids(uninterrupted[step].inputs)) << "step " << step;
      EXPECT_EQ(tg, Ids(uninterrupted[step].targets)) << "step " << step;
    }
    auto v1 = (*run)->GetValidation(1, 0, 4);
    auto v2 = (*resumed)->GetValidation(1, 0, 4);
    ASSERT_TRUE(v1.ok() && v2.ok());
    ExpectSameBatch(*v1, *v2);
  }
}

TEST_F(TokenDatasetTest, SeedChangesRandomWindowsOnly) {
  WriteBytes(Path("a.bin"), Raw<uint16_t>(Ramp(500, 0)));
  TokenDataset::Options o = Opts(8, 4);
  auto a = TokenDataset::Create({Path("a.bin")}, {}, o);
  o.seed = 43;
  auto b = TokenDataset::Create({Path("a.bin")}, {}, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(Ids((*a)->Get(0, 0, 4)->inputs), Ids((*b)->Get(0, 0, 4)->inputs));
}

TEST_F(TokenDatasetTest, ValidationBatchesAreSequentialWindowsOfTheValShards) {
  WriteBytes(Path("train.bin"), Raw<uint16_t>(Ramp(100, 0)));
  const std::vector<std::vector<uint32_t>> val = {Ramp(13, 700), Ramp(9, 800)};
  WriteBytes(Path("val0.bin"), Llmc(val[0], 1));
  WriteBytes(Path("val1.bin"), Llmc(val[1], 1));
  const int64_t T = 4;
  auto d = TokenDataset::Create({Path("train.bin")}, {Path("val0.bin"), Path("val1.bin")},
                                Opts(T, 3));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE((*d)->has_validation());
  // (13 - 1) / 4 = 3 windows, then (9 - 1) / 4 = 2: (0,0) (0,4) (0,8) (1,0) (1,4).
  EXPECT_EQ((*d)->val_windows(), 5);
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {0, 4}, {0, 8}, {1, 0},
                                                         {1, 4}, {0, 0}, {0, 4}, {0, 8}};
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<TokenDataset::Window> w;
    for (int64_t k = 0; k < 3; ++k) {
      w.push_back((*d)->ValidationWindow(b, k));
      EXPECT_EQ(std::make_pair(w.back().shard, w.back().position), want[b * 3 + k]);
    }
    auto batch = (*d)->GetValidation(b, 0, 3);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ExpectWindowsOf(*batch, val, w, T);
  }
  // Range checks as Get's.
  EXPECT_EQ((*d)->GetValidation(0, 2, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*d)->GetValidation(-1, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);

  auto no_val = TokenDataset::Create({Path("train.bin")}, {}, Opts(T, 3));
  ASSERT_TRUE(no_val.ok());
  EXPECT_FALSE((*no_val)->has_validation());
  const absl::Status st = (*no_val)->GetValidation(0, 0, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "data.tokens.val")) << st;
}

TEST_F(TokenDatasetTest, TokenOutsideTheVocabularyIsRefusedNamingShardAndOffset) {
  std::vector<uint32_t> ids = Ramp(40, 0, 50);
  ids[23] = 999;
  WriteBytes(Path("bad.bin"), Raw<uint16_t>(ids));
  TokenDataset::Options o = Opts(4, 10, baton::v1::TOKEN_SAMPLING_SEQUENTIAL);
  o.vocab_size = 512;
  auto d = TokenDataset::Create({Path("bad.bin")}, {Path("bad.bin")}, o);
  ASSERT_TRUE(d.ok()) << d.status();  // ids are checked as windows are read
  // Windows of step 0: positions 0, 4, ..., 36 (9 of them, wrapping): window 5 holds 20..24.
  EXPECT_TRUE((*d)->Get(0, 0, 5).ok());
  const absl::Status st = (*d)->Get(0, 0, 10).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "data.tokens.train")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), Path("bad.bin"))) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "token id 999 at token offset 23")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "model.gpt.vocab_size=512")) << st;
  const absl::Status v = (*d)->GetValidation(0, 0, 10).status();
  EXPECT_TRUE(absl::StrContains(v.message(), "data.tokens.val")) << v;
  EXPECT_TRUE(absl::StrContains(v.message(), "token offset 23")) << v;
}

TEST_F(TokenDatasetTest, BrokenShardsAreRefusedNamingTheFile) {
  const std::vector<uint32_t> ids = Ramp(20, 0);
  struct Case {
    std::string name, bytes;
    baton::v1::TokenFormat format;
    std::string want;
  };
  std::string odd = Raw<uint16_t>(ids) + "x";
  std::string truncated = Llmc(ids, 1);
  truncated.resize(truncated.size() - 3);
  const std::vector<Case> cases = {
      {"odd.bin", odd, baton::v1::TOKEN_FORMAT_UINT16, "not a whole number of uint16"},
      {"odd32.bin", Raw<uint32_t>(ids) + "xy", baton::v1::TOKEN_FORMAT_UINT32,
       "not a whole number of uint32"},
      {"truncated.bin", truncated, baton::v1::TOKEN_FORMAT_AUTO, "truncated: the header says 20"},
      {"lying.bin", Llmc(ids, 1, 5000), baton::v1::TOKEN_FORMAT_AUTO,
       "truncated: the header says 5000 tokens"},
      {"short_count.bin", Llmc(ids, 1, 10), baton::v1::TOKEN_FORMAT_AUTO,
       "the header says 10 tokens"},
      {"negative.bin", Llmc(ids, 1, -3), baton::v1::TOKEN_FORMAT_AUTO, "negative token count"},
      {"version.bin", Llmc(ids, 7), baton::v1::TOKEN_FORMAT_AUTO, "header version 7"},
      {"nomagic.bin", Raw<uint16_t>(Ramp(600, 0)), baton::v1::TOKEN_FORMAT_LLMC,
       "not an llm.c shard"},
      {"shortheader.bin", std::string(Llmc(ids, 1), 0, 100), baton::v1::TOKEN_FORMAT_AUTO,
       "truncated llm.c header"},
      {"tiny.bin", Raw<uint16_t>(Ramp(4, 0)), baton::v1::TOKEN_FORMAT_AUTO,
       "holds 4 tokens, fewer than one window of model.gpt.context + 1 = 5"},
      {"empty.bin", "", baton::v1::TOKEN_FORMAT_AUTO, "holds 0 tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    WriteBytes(Path(c.name), c.bytes);
    TokenDataset::Options o = Opts(4, 2);
    o.format = c.format;
    // A good training shard of the same format, for the refusal of a bad validation one.
    WriteBytes(Path("ok.bin"), c.format == baton::v1::TOKEN_FORMAT_LLMC      ? Llmc(ids, 1)
                               : c.format == baton::v1::TOKEN_FORMAT_UINT32 ? Raw<uint32_t>(ids)
                                                                            : Raw<uint16_t>(ids));
    for (bool as_val : {false, true}) {
      auto d = as_val ? TokenDataset::Create({Path("ok.bin")}, {Path(c.name)}, o)
                      : TokenDataset::Create({Path(c.name)}, {}, o);
      ASSERT_FALSE(d.ok());
      EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
      EXPECT_TRUE(absl::StrContains(d.status().message(),
                                    as_val ? "data.tokens.val: '" : "data.tokens.train: '"))
          << d.status();
      EXPECT_TRUE(absl::StrContains(d.status().message(), Path(c.name))) << d.status();
      EXPECT_TRUE(absl::StrContains(d.status().message(), c.want)) << d.status();
    }
  }
  // A directory is not a shard; a missing file is NOT_FOUND naming it.
  auto dir = TokenDataset::Create({dir_.string()}, {}, Opts());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument) << dir.status();
  auto missing = TokenDataset::Create({Path("nope.bin")}, {}, Opts());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), Path("nope.bin")));
}

TEST_F(TokenDatasetTest, EntriesExpandUnderTheRootsInSortedOrderAndStayThere) {
  fs::create_directories(dir_ / "root" / "shards");
  fs::create_directories(dir_ / "outside");
  for (const char* name : {"train_002.bin", "train_000.bin", "train_001.bin"}) {
    WriteBytes((dir_ / "root" / "shards" / name).string(), Llmc(Ramp(20, 0), 1));
  }
  WriteBytes(Path("outside/secret.bin"), Llmc(Ramp(20, 0), 1));
  const std::vector<std::string> roots = {(dir_ / "nothing-here").string(),
                                          (dir_ / "root").string()};
  google::protobuf::RepeatedPtrField<std::string> entries;
  entries.Add()->assign("shards/train_*.bin");
  entries.Add()->assign((dir_ / "root" / "shards" / "train_001.bin").string());
  auto files = ResolveTokenFiles(entries, roots, "data.tokens.train");
  ASSERT_TRUE(files.ok()) << files.status();
  const std::string base = fs::canonical(dir_ / "root" / "shards").string();
  EXPECT_EQ(*files, (std::vector<std::string>{base + "/train_000.bin", base + "/train_001.bin",
                                              base + "/train_002.bin", base + "/train_001.bin"}));

  auto refused = [&](const std::string& entry, const std::string& field) {
    google::protobuf::RepeatedPtrField<std::string> one;
    one.Add()->assign(entry);
    return ResolveTokenFiles(one, roots, field).status();
  };
  absl::Status st = refused(Path("outside/secret.bin"), "data.tokens.val");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "data.tokens.val")) << st;
  st = refused(Path("outside/*.bin"), "data.tokens.train");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "data.tokens.train")) << st;
  st = refused("../outside/secret.bin", "data.tokens.train");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "climbs out")) << st;
  // A symlink under the root pointing outside is refused too.
  fs::create_symlink(dir_ / "outside" / "secret.bin", dir_ / "root" / "shards" / "link.bin");
  st = refused("shards/link.bin", "data.tokens.train");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  st = refused("shards/none_*.bin", "data.tokens.train");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "no file matches 'shards/none_*.bin'")) << st;
}

TEST_F(TokenDatasetTest, SubmitChecksWhatTheCoordinatorCanSee) {
  fs::create_directories(dir_ / "root");
  WriteBytes(Path("root/good.bin"), Llmc(Ramp(40, 0), 1));
  WriteBytes(Path("root/tiny.bin"), Llmc(Ramp(3, 0), 1));
  WriteBytes(Path("secret.bin"), Llmc(Ramp(40, 0), 1));
  const std::vector<std::string> roots = {Path("root")};
  JobSpec spec;
  auto* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_vocab_size(1000);
  gpt->set_context(8);
  spec.mutable_data()->set_batch_size(2);
  auto with = [&](std::vector<std::string> train, std::vector<std::string> val) {
    JobSpec s = spec;
    for (auto& t : train) s.mutable_data()->mutable_tokens()->add_train(t);
    for (auto& v : val) s.mutable_data()->mutable_tokens()->add_val(v);
    return CheckTokenDataAtSubmit(s, roots);
  };
  EXPECT_TRUE(with({"good.bin"}, {Path("root/good.bin")}).ok());
  // Only on the workers: left to them.
  EXPECT_TRUE(with({"elsewhere/*.bin", Path("root/absent.bin")}, {"absent.bin"}).ok());
  absl::Status st = with({"good.bin"}, {"tiny.bin"});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "data.tokens.val")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tiny.bin")) << st;
  st = with({Path("secret.bin")}, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "data.tokens.train")) << st;
  st = with({"/etc/*"}, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  st = with({"../secret.bin"}, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST_F(TokenDatasetTest, MakeDatasetNamesTheLlamaFieldsInItsRefusals) {
  WriteBytes(Path("a.bin"), Raw<uint16_t>(Ramp(6, 0)));
  JobSpec spec;
  spec.set_steps(1);
  auto* l = spec.mutable_model()->mutable_llama();
  l->set_vocab_size(64);
  l->set_context(8);
  l->set_d_model(32);
  l->set_heads(4);
  l->set_layers(1);
  l->set_intermediate_size(48);
  spec.mutable_data()->set_batch_size(2);
  spec.mutable_data()->mutable_tokens()->add_train(Path("a.bin"));
  spec.mutable_optimizer()->mutable_adamw()->set_learning_rate(1e-3f);
  auto d = ValidateAndMake(spec);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::StrContains(d.status().message(), "model.llama.context + 1 = 9"))
      << d.status();
}

}  // namespace
}  // namespace baton

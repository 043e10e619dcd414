// Block files read in pieces: the hash check, and the weights export streamed against the
// export built whole (every block file read, parsed and encoded at once), byte for byte.
#include "common/checkpoint/block_stream.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "common/checkpoint/checkpoint_testing.h"
#include "common/checkpoint/safetensors.h"
#include "common/core/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_checkpoint::BlockSpec;
using testing_checkpoint::FlipByte;
using testing_checkpoint::WriteCheckpoint;

// The export as it was built before it was streamed: every block file read whole, its
// weights copied out and the file encoded at once. The yardstick of the stream's bytes.
std::string WholeExport(const std::string& step_dir) {
  absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(step_dir);
  EXPECT_TRUE(index.ok()) << index.status();
  absl::StatusOr<std::vector<std::string>> blocks = CheckpointBlockOrder(*index);
  EXPECT_TRUE(blocks.ok()) << blocks.status();
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
  std::string job;
  for (const std::string& b : *blocks) {
    absl::StatusOr<std::string> bytes =
        ReadFile((fs::path(step_dir) / index->blocks.at(b).file).string());
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<Safetensors> st = ParseSafetensors(*bytes);
    EXPECT_TRUE(st.ok()) << st.status();
    job = st->metadata["job"];
    for (const std::string& name : st->order) {
      if (absl::StartsWith(name, "optimizer.")) continue;
      tensors.push_back(*EntryToTensor(st->tensors.at(name), Device::kCpu));
      names.push_back(name);
    }
  }
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < tensors.size(); ++i) named.push_back({names[i], &tensors[i]});
  absl::StatusOr<std::string> out = EncodeSafetensors(
      named, {{"format", "baton-weights-1"}, {"job", job}, {"step", absl::StrCat(index->step)}});
  EXPECT_TRUE(out.ok()) << out.status();
  return *out;
}

// Every piece of `e`, concatenated; each piece checked against the bound.
absl::StatusOr<std::string> Drain(WeightsExport& e, size_t chunk_bytes) {
  std::string all, piece;
  for (;;) {
    if (absl::Status s = e.Next(&piece); !s.ok()) return s;
    if (piece.empty()) return all;
    EXPECT_LE(piece.size(), chunk_bytes);
    all += piece;
  }
}

class BlockStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("block-stream-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Three blocks on two ranks: float32 weights with AdamW state after them, an int32 and a
  // bfloat16 weight (exported as float32), one tensor larger than a default piece.
  std::string Checkpoint() {
    const std::vector<BlockSpec> blocks = {
        {"embed", {{"embed.weight", {37, 5}}, {"embed.ids", {3}, DType::kInt32}}, 0},
        {"block.0",
         {{"block.0.w", {300, 1000}}, {"block.0.scale", {7, 3}, DType::kBFloat16},
          {"block.0.b", {1000}}},
         0},
        {"head", {{"head.weight", {11}}, {"head.empty", {0}}}, 1},
    };
    absl::StatusOr<std::string> step_dir = WriteCheckpoint(JobDir(), "job-7", 3, blocks);
    EXPECT_TRUE(step_dir.ok()) << step_dir.status();
    return *step_dir;
  }
  std::string JobDir() const { return (dir_ / "job-7").string(); }

  fs::path dir_;
};

TEST_F(BlockStreamTest, TheStreamIsTheWholeExportByteForByteInPiecesOfAnySize) {
  const std::string step_dir = Checkpoint();
  const std::string whole = WholeExport(step_dir);
  for (const size_t chunk : {size_t{8}, size_t{9}, size_t{13}, size_t{4096}, size_t{65537},
                             kBlockStreamChunkBytes}) {
    SCOPED_TRACE(chunk);
    absl::StatusOr<std::unique_ptr<WeightsExport>> e = WeightsExport::Open(step_dir, chunk);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->step(), 3);
    EXPECT_EQ((*e)->total_bytes(), whole.size());
    absl::StatusOr<std::string> streamed = Drain(**e, chunk);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_TRUE(*streamed == whole) << "the streamed export differs from the whole one";
    std::string after;
    EXPECT_TRUE((*e)->Next(&after).ok());
    EXPECT_TRUE(after.empty());
  }
  // What the export holds: the weights only, F32 and I32, with the checkpoint's metadata.
  absl::StatusOr<Safetensors> st = ParseSafetensors(whole);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->order, (std::vector<std::string>{"embed.weight", "embed.ids", "block.0.w",
                                                 "block.0.scale", "block.0.b", "head.weight",
                                                 "head.empty"}));
  EXPECT_EQ(st->tensors.at("block.0.scale").file_dtype, "F32");
  EXPECT_EQ(st->tensors.at("embed.ids").file_dtype, "I32");
  EXPECT_EQ(st->metadata, (std::map<std::string, std::string>{
                              {"format", "baton-weights-1"}, {"job", "job-7"}, {"step", "3"}}));
  // ExportWeights is the stream gathered.
  absl::StatusOr<std::string> gathered = ExportWeights(step_dir);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  EXPECT_TRUE(*gathered == whole);
}

// A file that changes after Open (in optimizer state, which the export does not even
// produce) fails the export with DATA_LOSS at that file's end, and from then on.
TEST_F(BlockStreamTest, AFileChangedSinceOpenEndsTheExportWithDataLoss) {
  const std::string step_dir = Checkpoint();
  absl::StatusOr<std::unique_ptr<WeightsExport>> e = WeightsExport::Open(step_dir, 4096);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string path = step_dir + "/block.0.safetensors";
  FlipByte(path, fs::file_size(path) - 1);  // the last byte: AdamW's exp_avg_sq
  const absl::StatusOr<std::string> streamed = Drain(**e, 4096);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(streamed.status().message(), HasSubstr("block block.0: " + path + " has SHA-256"));
  EXPECT_THAT(streamed.status().message(), HasSubstr("its manifest says"));
  std::string piece;
  EXPECT_EQ((*e)->Next(&piece), streamed.status());
  EXPECT_TRUE(piece.empty());
  // The same file checked on its own, and through the checkpoint.
  const absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(step_dir);
  ASSERT_TRUE(index.ok());
  const absl::Status verified = VerifyBlockFile(step_dir, index->blocks.at("block.0"));
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.message(), HasSubstr(path + " has SHA-256"));
  EXPECT_EQ(VerifyCheckpoint(step_dir, {}).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(VerifyBlockFile(step_dir, index->blocks.at("embed")).ok());
}

TEST_F(BlockStreamTest, AFileReplacedOrRemovedSinceOpenEndsTheExportWithDataLoss) {
  const std::string step_dir = Checkpoint();
  const std::string head = step_dir + "/head.safetensors";
  {
    absl::StatusOr<std::unique_ptr<WeightsExport>> e = WeightsExport::Open(step_dir);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(WriteFileAtomically(head, "shorter").ok());
    const absl::StatusOr<std::string> streamed = Drain(**e, kBlockStreamChunkBytes);
    EXPECT_EQ(streamed.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(streamed.status().message(), HasSubstr(head + " changed while exported"));
  }
  fs::remove(head);
  EXPECT_EQ(WeightsExport::Open(step_dir).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(BlockStreamTest, OpenRefusesSmallPiecesAndIncompleteCheckpoints) {
  const std::string step_dir = Checkpoint();
  EXPECT_EQ(WeightsExport::Open(step_dir, 7).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WeightsExport::Open((dir_ / "none").string()).status().code(),
            absl::StatusCode::kNotFound);
  // Rank 1's manifest gone: the head block is missing.
  fs::remove(step_dir + "/manifest.rank-1.json");
  const absl::Status missing = WeightsExport::Open(step_dir).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("no file for block 2"));
}

TEST_F(BlockStreamTest, ABlockFileThatIsNotSafetensorsIsDataLossNamingIt) {
  const std::string step_dir = Checkpoint();
  const std::string embed = step_dir + "/embed.safetensors";
  ASSERT_TRUE(WriteFileAtomically(embed, std::string(16, '\xff')).ok());
  const absl::Status s = WeightsExport::Open(step_dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(embed + ": safetensors:"));
}

}  // namespace
}  // namespace baton

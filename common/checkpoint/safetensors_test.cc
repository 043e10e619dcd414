#include "common/checkpoint/safetensors.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

Tensor Iota(const Shape& shape, float start) {
  Tensor t = Tensor::Empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = start + static_cast<float>(i);
  return t;
}

// The exact bytes of a small file, as the format lays them out: an 8-byte little-endian
// header length, the JSON header padded with spaces to a multiple of 8, then the data.
TEST(Safetensors, EncodesTheDocumentedLayout) {
  Tensor a = Iota({2}, 1.0f);
  absl::StatusOr<std::string> bytes = EncodeSafetensors({{"a", &a}}, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string padded = header;
  while (padded.size() % 8) padded += ' ';
  ASSERT_EQ(bytes->size(), 8 + padded.size() + 8);
  EXPECT_EQ(static_cast<unsigned char>((*bytes)[0]), padded.size());
  for (int i = 1; i < 8; ++i) EXPECT_EQ((*bytes)[i], 0);
  EXPECT_EQ(bytes->substr(8, padded.size()), padded);
  float back[2];
  std::memcpy(back, bytes->data() + 8 + padded.size(), 8);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 2.0f);
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  Tensor w = Iota({3, 4}, -5.5f);
  Tensor ids = Tensor::Empty({5}, DType::kInt32);
  for (int i = 0; i < 5; ++i) ids.i32()[i] = i * 1000 - 7;
  Tensor empty = Tensor::Empty({0, 3});
  absl::StatusOr<std::string> bytes =
      EncodeSafetensors({{"layer.weight", &w}, {"ids", &ids}, {"none", &empty}},
                        {{"step", "12"}, {"quote\"d", "back\\slash\n"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Safetensors> st = ParseSafetensors(*bytes);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->metadata.at("step"), "12");
  EXPECT_EQ(st->metadata.at("quote\"d"), "back\\slash\n");
  EXPECT_EQ(st->order, (std::vector<std::string>{"layer.weight", "ids", "none"}));
  const SafetensorsEntry& e = st->tensors.at("layer.weight");
  EXPECT_EQ(e.dtype, DType::kFloat32);
  EXPECT_EQ(e.shape, (Shape{3, 4}));
  absl::StatusOr<Tensor> t = EntryToTensor(e, Device::kCpu);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(std::memcmp(t->f32(), w.f32(), w.nbytes()), 0);
  EXPECT_EQ(st->tensors.at("ids").dtype, DType::kInt32);
  Tensor dst = Tensor::Zeros({5}, DType::kInt32);
  ASSERT_TRUE(CopyEntryInto(st->tensors.at("ids"), "ids", &dst).ok());
  EXPECT_EQ(dst.i32()[4], 3993);
  EXPECT_EQ(st->tensors.at("none").data.size(), 0u);
  // The same tensors give the same bytes.
  EXPECT_EQ(*EncodeSafetensors({{"layer.weight", &w}, {"ids", &ids}, {"none", &empty}},
                               {{"step", "12"}, {"quote\"d", "back\\slash\n"}}),
            *bytes);
}

TEST(Safetensors, CopyIntoRefusesAnotherShape) {
  Tensor w = Iota({3, 4}, 0.0f);
  const std::string bytes = *EncodeSafetensors({{"w", &w}}, {});
  absl::StatusOr<Safetensors> st = ParseSafetensors(bytes);
  ASSERT_TRUE(st.ok());
  Tensor dst = Tensor::Zeros({4, 3});
  absl::Status s = CopyEntryInto(st->tensors.at("w"), "w", &dst);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("w is f32[3,4] in the checkpoint but f32[4,3]"));
  EXPECT_EQ(dst.f32()[0], 0.0f) << "nothing copied";
}

TEST(Safetensors, EncodeRefusesBadNames) {
  Tensor w = Iota({1}, 0.0f);
  EXPECT_FALSE(EncodeSafetensors({{"", &w}}, {}).ok());
  EXPECT_FALSE(EncodeSafetensors({{"__metadata__", &w}}, {}).ok());
  EXPECT_THAT(EncodeSafetensors({{"w", &w}, {"w", &w}}, {}).status().message(),
              HasSubstr("tensor w twice"));
  Tensor undefined;
  EXPECT_THAT(EncodeSafetensors({{"u", &undefined}}, {}).status().message(),
              HasSubstr("tensor u is undefined"));
}

// A header around `json` with `data` after it.
std::string File(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(Safetensors, ParseRefusesMalformedFilesNamingWhatIsWrong) {
  struct Case {
    std::string file;
    std::string error;
  };
  const std::string eight(8, 'x');
  const std::vector<Case> cases = {
      {"abc", "shorter than its 8-byte header length"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds the file"},
      {File("not json"), "not a JSON object"},
      {File(R"({"t":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", "1234567812345678"),
       "tensor t has dtype \"F64\""},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234"),
       "needs 8 bytes, data_offsets give 4"},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight),
       "not within the 8 data bytes"},
      {File(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       "not a non-negative integer"},
      {File(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", eight),
       "not a non-negative integer"},
      {File(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
       "a hole"},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            eight),
       "overlap"},
      {File(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
       "cover 4 of the 8 data bytes"},
      {File(R"({"t":{"dtype":"F32","shape":[1]}})", eight), "lacks dtype, shape or data_offsets"},
      {File(R"({"__metadata__":{"k":3}})"), "metadata k is not a string"},
      {File(R"({"t":[1,2]})"), "tensor t is not an object"},
      {File(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
            eight),
       "shape too large"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Safetensors> st = ParseSafetensors(c.file);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << c.error;
    EXPECT_THAT(st.status().message(), HasSubstr(c.error));
  }
}

}  // namespace
}  // namespace baton

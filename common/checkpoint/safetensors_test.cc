#include "common/checkpoint/safetensors.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
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
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "the header is too large"},
      {std::string("\x10\0\0\0\0\0\0\0", 8) + "{}", "exceeds the file"},
      {File("not json"), "not a JSON object"},
      {File(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            eight),
       "tensor t is named twice"},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x)", eight),
       "more after the object"},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
       "data_offsets is not [begin, end]"},
      {File(R"({"t":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", "1234567812345678"),
       "tensor t has dtype \"F64\""},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234"),
       "needs 8 bytes, data_offsets give 4"},
      {File(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight),
       "the file is truncated: it holds 8 data bytes"},
      {File(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       "not a non-negative integer"},
      {File(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", eight),
       "not a non-negative integer"},
      {File(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "a hole"},
      {File(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            eight),
       "overlap"},
      {File(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
       "cover 4 of the 8 data bytes"},
      {File(R"({"t":{"dtype":"F32","shape":[1]}})", eight), "lacks dtype, shape or data_offsets"},
      {File(R"({"__metadata__":{"k":3}})"), "metadata k is not a string"},
      {File(R"({"t":[1,2]})"), "tensor t is not an object"},
      {File(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight),
       "shape too large"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Safetensors> st = ParseSafetensors(c.file);
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << c.error;
    EXPECT_THAT(st.status().message(), HasSubstr(c.error));
  }
}

// A file cut short says so, and names the first tensor past its end in the file's layout,
// whatever order the header lists them in (the same tensor every time).
TEST(Safetensors, ATruncatedFileSaysSoAndNamesTheFirstTensorPastItsEnd) {
  const std::string header = R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},)"
                             R"("c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
  absl::StatusOr<Safetensors> st = ParseSafetensors(File(header, std::string(12, 'x')));
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      st.status().message(),
      HasSubstr("the file is truncated: it holds 12 data bytes but its header places 4 "
                "tensors in 32 bytes; tensor c (data_offsets [8, 16]) is the first past the "
                "end"));
  EXPECT_TRUE(ParseSafetensors(File(header, std::string(32, 'x'))).ok());
}

// The length field alone decides: a header over the format's 100,000,000 bytes is refused
// before anything reads or allocates it, however large the file says it is.
TEST(Safetensors, AHeaderOverTheFormatsLimitIsRefusedFromItsLength) {
  auto first8 = [](uint64_t n) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out;
  };
  const uint64_t huge_file = uint64_t{1} << 62;
  absl::StatusOr<uint64_t> n = SafetensorsHeaderLength(first8(100'000'000), huge_file);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 100'000'000u);
  for (const uint64_t over : {uint64_t{100'000'001}, uint64_t{100} << 20, uint64_t{1} << 60}) {
    n = SafetensorsHeaderLength(first8(over), huge_file);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument) << over;
    EXPECT_THAT(n.status().message(), HasSubstr("the header is too large")) << over;
    EXPECT_THAT(n.status().message(), HasSubstr(absl::StrCat(over))) << over;
  }
  // A whole file in memory that claims a 2^60-byte header.
  absl::StatusOr<Safetensors> st = ParseSafetensors(first8(uint64_t{1} << 60) + "{}");
  EXPECT_THAT(st.status().message(), HasSubstr("the header is too large"));
}

// Runs `fn` in a child process whose address space may grow by at most `budget` bytes past
// its size when it starts. 0: `fn` returned true; 1: it returned false; anything else: the
// child failed another way (an allocation over the budget throws, or aborts).
int ExitOfChildWithin(uint64_t budget, const std::function<bool()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t limit = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + budget;
    const struct rlimit r = {limit, limit};
    if (pages <= 0 || setrlimit(RLIMIT_AS, &r) != 0) _exit(3);
    int code = 4;
    try {
      code = fn() ? 0 : 1;
    } catch (...) {
      code = 5;
    }
    _exit(code);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The sanitizers reserve and keep memory of their own: an address-space budget means
// nothing under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// A header of tens of megabytes parses in a few times its size (a generic JSON tree took 33
// times it: 2.8 GiB for an 85 MiB header). The parse runs in a child whose address space
// may grow by 6 headers at most; over that it fails.
TEST(Safetensors, ALargeHeaderParsesInMemoryProportionalToIt) {
  if (kSanitized) GTEST_SKIP() << "address-space budgets do not hold under sanitizers";
  constexpr size_t kTarget = size_t{64} << 20;
  // Many entries, named like a large model's.
  std::string entries = "{";
  uint64_t data = 0;
  for (int i = 0; entries.size() < kTarget; ++i) {
    absl::StrAppendFormat(&entries,
                          "%s\"model.layers.%07d.mlp.up_proj.weight\":{\"dtype\":\"F32\","
                          "\"shape\":[1],\"data_offsets\":[%d,%d]}",
                          i == 0 ? "" : ",", i, data, data + 4);
    data += 4;
  }
  entries += "}";
  const int entries_exit = ExitOfChildWithin(6 * entries.size(), [&] {
    absl::StatusOr<Safetensors> st = ParseSafetensorsHeader(entries, data);
    return st.ok() && st->tensors.size() == data / 4 && st->order.size() == data / 4;
  });
  EXPECT_EQ(entries_exit, 0) << "parsing " << entries.size() << " bytes of entries";

  // One large metadata value, with escapes to decode.
  std::string metadata = R"({"__metadata__":{"notes":")";
  while (metadata.size() < kTarget) metadata += R"(line\n\u00e9 )";
  metadata += R"("},"t":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  const int metadata_exit = ExitOfChildWithin(6 * metadata.size(), [&] {
    absl::StatusOr<Safetensors> st = ParseSafetensorsHeader(metadata, 4);
    return st.ok() && absl::StartsWith(st->metadata.at("notes"), "line\n\xc3\xa9 line");
  });
  EXPECT_EQ(metadata_exit, 0) << "parsing " << metadata.size() << " bytes of metadata";
}

// What a header holds reaches errors escaped and bounded: a name of invalid UTF-8 and
// control bytes, a megabyte-long name, a header that is not JSON at all.
TEST(Safetensors, ErrorsQuoteTheFileBoundedAndEscaped) {
  auto expect_clean = [](const absl::Status& s) {
    EXPECT_FALSE(s.ok());
    EXPECT_LT(s.message().size(), 1024u) << s.message().substr(0, 2048);
    for (const char c : s.message()) {
      const unsigned char u = static_cast<unsigned char>(c);
      EXPECT_TRUE(u >= 0x20 && u < 0x7f) << "byte " << int{u} << " in " << s.message();
    }
  };
  const std::string long_name(1 << 20, 'w');
  absl::Status s = ParseSafetensors(File(absl::StrCat(R"({")", long_name,
                                                      R"(":{"dtype":"F64","shape":[],)"
                                                      R"("data_offsets":[0,8]}})"),
                                         "12345678"))
                       .status();
  expect_clean(s);
  EXPECT_THAT(s.message(), HasSubstr("has dtype \"F64\""));
  EXPECT_THAT(s.message(), HasSubstr("more bytes)"));

  s = ParseSafetensors(
          File(R"({"bad\u001b[2J\u0000":{"dtype":"X","shape":[],"data_offsets":[0,0]}})"))
          .status();
  expect_clean(s);
  EXPECT_THAT(s.message(), HasSubstr("tensor bad\\x1b[2J\\x00 has dtype \"X\""));

  // Bytes that are not UTF-8 where a name should be, and a header of binary garbage.
  s = ParseSafetensors(File("{\"\xff\xfe\x1b\":{}}")).status();
  expect_clean(s);
  EXPECT_THAT(s.message(), HasSubstr("not UTF-8"));
  EXPECT_THAT(s.message(), HasSubstr("\\xff\\xfe\\x1b"));
  s = ParseSafetensors(File(std::string(4096, '\x9b'))).status();
  expect_clean(s);
  EXPECT_THAT(s.message(), HasSubstr("not a JSON object"));
}

}  // namespace
}  // namespace baton

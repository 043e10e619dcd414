#include "common/core/digest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace baton {
namespace {

Digest Sha256Of(const std::string& s) {
  Sha256 h;
  h.Update(s.data(), s.size());
  return h.Finish();
}

// FIPS 180-2 test vectors.
TEST(DigestTest, Sha256Abc) {
  EXPECT_EQ(DigestHex(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(DigestTest, Sha256Empty) {
  EXPECT_EQ(DigestHex(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;  // no Update at all
  EXPECT_EQ(DigestHex(h.Finish()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(DigestTest, Sha256TwoBlockMessage) {
  EXPECT_EQ(DigestHex(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(DigestTest, Sha256IncrementalMillionA) {
  Sha256 h;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.Update(chunk.data(), chunk.size());
  EXPECT_EQ(DigestHex(h.Finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(DigestTest, IncrementalEqualsOneShot) {
  const std::string msg = "the quick brown fox jumps over the lazy dog, 0123456789";
  Sha256 h;
  for (size_t i = 0; i < msg.size(); i += 7) h.Update(msg.data() + i, std::min<size_t>(7, msg.size() - i));
  EXPECT_EQ(h.Finish(), Sha256Of(msg));
}

TEST(DigestTest, UpdateFloatsHashesLittleEndianFloat32) {
  const std::vector<float> values = {1.0f, -2.5f, 0.0f, 3.14159f};
  // 1.0f = 0x3f800000 -> bytes 00 00 80 3f.
  std::string bytes = {'\x00', '\x00', '\x80', '\x3f'};
  for (size_t i = 1; i < values.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &values[i], 4);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xff));
  }
  Sha256 h;
  h.UpdateFloats(values);
  EXPECT_EQ(h.Finish(), Sha256Of(bytes));

  Sha256 empty;
  empty.UpdateFloats({});
  EXPECT_EQ(empty.Finish(), Sha256Of(""));
}

TEST(DigestTest, CombineBlockDigestsIsSha256OfTheConcatenation) {
  const std::vector<Digest> blocks = {Sha256Of("embedding"), Sha256Of("block.0"),
                                      Sha256Of("block.1"), Sha256Of("head")};
  std::string concat;
  for (const Digest& d : blocks) concat.append(reinterpret_cast<const char*>(d.data()), d.size());
  ASSERT_EQ(concat.size(), 4u * 32u);
  EXPECT_EQ(CombineBlockDigests(blocks), Sha256Of(concat));

  // Order matters.
  std::vector<Digest> swapped = blocks;
  std::swap(swapped[1], swapped[2]);
  EXPECT_NE(CombineBlockDigests(swapped), CombineBlockDigests(blocks));

  // Degenerate cases.
  EXPECT_EQ(CombineBlockDigests({}), Sha256Of(""));
  EXPECT_EQ(CombineBlockDigests({blocks[0]}),
            Sha256Of(std::string(reinterpret_cast<const char*>(blocks[0].data()), 32)));
}

TEST(DigestTest, DigestHex) {
  Digest d{};
  EXPECT_EQ(DigestHex(d), std::string(64, '0'));
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i * 8 + 1);
  EXPECT_EQ(DigestHex(d),
            "0109111921293139414951596169717981899199a1a9b1b9c1c9d1d9e1e9f1f9");
  d.fill(0xff);
  EXPECT_EQ(DigestHex(d), std::string(64, 'f'));
  d[0] = 0xab;
  d[31] = 0x0c;
  const std::string hex = DigestHex(d);
  EXPECT_EQ(hex.substr(0, 2), "ab");
  EXPECT_EQ(hex.substr(62, 2), "0c");
}

}  // namespace
}  // namespace baton

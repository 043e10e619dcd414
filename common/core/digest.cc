#include "common/core/digest.h"

#include <openssl/evp.h>

#include <bit>
#include <cstring>

#include "common/core/check.h"

namespace baton {

static_assert(std::endian::native == std::endian::little,
              "the digest scheme hashes little-endian float32 bytes; add a byte swap here");

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  BATON_CHECK(ctx_ != nullptr);
  BATON_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(const void* data, size_t bytes) {
  BATON_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, bytes) == 1);
}

void Sha256::UpdateFloats(absl::Span<const float> values) {
  Update(values.data(), values.size() * sizeof(float));
}

Digest Sha256::Finish() {
  Digest d;
  unsigned int len = 0;
  BATON_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.data(), &len) == 1);
  BATON_CHECK(len == d.size());
  return d;
}

Digest CombineBlockDigests(absl::Span<const Digest> blocks) {
  Sha256 h;
  for (const Digest& b : blocks) h.Update(b.data(), b.size());
  return h.Finish();
}

std::string DigestHex(const Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

}  // namespace baton

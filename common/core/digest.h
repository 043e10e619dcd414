// SHA-256 digests of weights: the yardstick every pipeline run is held to.
//
// The scheme (docs/architecture.md, "Weights digest"):
//   block digest = SHA-256 over the block's parameters in their declared order, each as its
//                  float32 values in little-endian byte order (no names, no shapes);
//   model digest = SHA-256 over the concatenated 32-byte block digests, in the model's
//                  canonical block order (embedding or first layer first, loss head last).
// A pipeline stage that owns a contiguous range of blocks reports their block digests; the
// coordinator concatenates them in block order and hashes once more to get the job digest,
// which must equal the reference trainer's.
#ifndef BATON_COMMON_CORE_DIGEST_H_
#define BATON_COMMON_CORE_DIGEST_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace baton {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256 (OpenSSL). Not thread-safe; one per thread.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t bytes);
  // Appends floats as little-endian float32 bytes.
  void UpdateFloats(absl::Span<const float> values);
  Digest Finish();  // the object may not be updated afterwards

 private:
  void* ctx_;  // EVP_MD_CTX
};

// SHA-256 over concatenated block digests: the model (job) digest.
Digest CombineBlockDigests(absl::Span<const Digest> blocks);

std::string DigestHex(const Digest& d);

}  // namespace baton

#endif  // BATON_COMMON_CORE_DIGEST_H_

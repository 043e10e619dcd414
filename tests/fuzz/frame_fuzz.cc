// libFuzzer target: arbitrary bytes as one message of a TensorService.Push stream, parsed by
// the same code the workers run (ParseFrame), and a parsed payload copied out as the
// receiving stream does. Besides what the sanitizers catch, it checks that a parsed
// payload lies inside the message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/transport/frames.h"
#include "google/protobuf/stubs/logging.h"

// Protobuf logs every string field with invalid UTF-8 it meets; quiet, as the services
// would be under the same input if they logged it, which they do not.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Split the input into one or two slices, as gRPC may hand a message over.
  std::vector<grpc::Slice> slices;
  const size_t cut = size > 1 ? data[0] % size : size;
  if (cut > 0) slices.emplace_back(data, cut);
  if (size > cut) slices.emplace_back(data + cut, size - cut);
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  absl::StatusOr<baton::transport_internal::ReceivedFrame> frame =
      baton::transport_internal::ParseFrame(buffer);
  if (!frame.ok()) return 0;
  size_t total = 0;
  for (const grpc::Slice& s : frame->slices) total += s.size();
  if (frame->payload_offset + frame->payload_len > total) {
    std::fprintf(stderr, "frame_fuzz: payload [%zu, +%zu) outside the %zu-byte message\n",
                 frame->payload_offset, frame->payload_len, total);
    std::abort();
  }
  std::string payload(frame->payload_len, '\0');
  baton::transport_internal::CopyPayload(*frame, payload.data());
  return 0;
}

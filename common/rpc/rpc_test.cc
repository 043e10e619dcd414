#include "common/rpc/rpc.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(RpcTest, StatusRoundTripKeepsCodeAndMessage) {
  for (absl::StatusCode c : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
                             absl::StatusCode::kUnavailable, absl::StatusCode::kAborted}) {
    const absl::Status s(c, "field x: bad");
    const absl::Status back = FromGrpcStatus(ToGrpcStatus(s));
    EXPECT_EQ(back, s);
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(RpcTest, TimeConversionsRoundTrip) {
  const absl::Duration d = absl::Seconds(3) + absl::Nanoseconds(42);
  EXPECT_EQ(FromProtoDuration(ToProtoDuration(d)), d);
  const absl::Time t = absl::FromUnixNanos(1700000000123456789);
  EXPECT_EQ(FromProtoTime(ToProtoTime(t)), t);
}

TEST(RpcTest, ServerOnAFreePortAnswersHealthChecks) {
  std::string address;
  auto server = StartServer({}, &address);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE(address.find("127.0.0.1:"), std::string::npos);
  EXPECT_NE(address, "127.0.0.1:0");
  (*server)->Shutdown();
}

}  // namespace
}  // namespace baton

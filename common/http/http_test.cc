#include "common/http/http.h"

#include <zlib.h>

#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::http {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Echoes what it was asked, so tests can see the parsed request.
Response Echo(const Request& r) {
  Response resp;
  resp.body = r.method + " " + r.path + " 1." + std::to_string(r.minor_version) +
              (r.accepts_gzip ? " gzip" : "") + (r.keep_alive ? " keep" : " close");
  return resp;
}

Step Answer(std::string_view input, const Limits& limits = {}) {
  return NextStep(input, limits, Echo);
}

TEST(NextStep, AnswersAGetAndKeepsTheConnection) {
  const std::string in = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  const Step s = Answer(in);
  ASSERT_EQ(s.kind, Step::kRespond);
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.consumed, in.size());
  EXPECT_FALSE(s.close);
  EXPECT_THAT(s.output, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(
      s.output,
      HasSubstr("Content-Length: " + std::to_string(sizeof("GET /metrics 1.1 keep") - 1) + "\r\n"));
  EXPECT_THAT(s.output, EndsWith("\r\n\r\nGET /metrics 1.1 keep"));
  EXPECT_THAT(s.output, Not(HasSubstr("Connection:")));
}

TEST(NextStep, NeedsMoreUntilTheHeadIsComplete) {
  const std::string in = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  for (size_t n = 0; n < in.size(); ++n) {
    EXPECT_EQ(Answer(in.substr(0, n)).kind, Step::kNeedMore) << n;
  }
}

TEST(NextStep, HeadAnswersGetsHeadersWithoutTheBody) {
  const Step s = Answer("HEAD /metrics HTTP/1.1\r\n\r\n");
  ASSERT_EQ(s.kind, Step::kRespond);
  EXPECT_THAT(s.output, HasSubstr("Content-Length: " +
                                  std::to_string(sizeof("HEAD /metrics 1.1 keep") - 1) + "\r\n"));
  EXPECT_THAT(s.output, EndsWith("\r\n\r\n"));
}

TEST(NextStep, Http10ClosesUnlessAskedToKeepAlive) {
  Step s = Answer("GET / HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(s.close);
  EXPECT_THAT(s.output, HasSubstr("Connection: close\r\n"));
  s = Answer("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
  EXPECT_FALSE(s.close);
  EXPECT_THAT(s.output, HasSubstr("Connection: keep-alive\r\n"));
  s = Answer("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n");
  EXPECT_TRUE(s.close);
}

TEST(NextStep, PipelinedRequestsAreAnsweredOneAtATime) {
  const std::string a = "GET /a HTTP/1.1\r\n\r\n";
  const std::string b = "GET /b?x=1 HTTP/1.1\n\n";  // bare LF line endings are accepted
  Step s = Answer(a + b);
  ASSERT_EQ(s.kind, Step::kRespond);
  EXPECT_EQ(s.consumed, a.size());
  EXPECT_THAT(s.output, EndsWith("GET /a 1.1 keep"));
  s = Answer(b);
  ASSERT_EQ(s.kind, Step::kRespond);
  EXPECT_EQ(s.consumed, b.size());
  EXPECT_THAT(s.output, EndsWith("GET /b 1.1 keep"));
}

TEST(NextStep, LeadingEmptyLinesAreSkipped) {
  const Step s = Answer("\r\n\r\nGET /x HTTP/1.1\r\n\r\n");
  ASSERT_EQ(s.kind, Step::kRespond);
  EXPECT_THAT(s.output, EndsWith("GET /x 1.1 keep"));
}

TEST(NextStep, AbsoluteFormTargetsGiveTheirPath) {
  EXPECT_THAT(Answer("GET http://h:1/metrics?a HTTP/1.1\r\n\r\n").output,
              EndsWith("GET /metrics 1.1 keep"));
  EXPECT_THAT(Answer("GET HTTP://h HTTP/1.1\r\n\r\n").output, EndsWith("GET / 1.1 keep"));
  EXPECT_THAT(Answer("OPTIONS * HTTP/1.1\r\n\r\n").output, EndsWith("OPTIONS * 1.1 keep"));
}

TEST(NextStep, MalformedHeadsAre400AndClose) {
  for (const char* in : {
           "garbage\r\n\r\n",
           "GET /\r\n\r\n",                              // HTTP/0.9: no version
           "GET  / HTTP/1.1\r\n\r\n",                    // two spaces
           "GET / HTTP/1.1 extra\r\n\r\n",               // four parts
           "G(T / HTTP/1.1\r\n\r\n",                     // not a token
           "GET / HTTP/x.1\r\n\r\n",                     // not a version
           "GET / HTTP/1.1\r\nno colon\r\n\r\n",         // field without a colon
           "GET / HTTP/1.1\r\nName : v\r\n\r\n",         // space before the colon
           "GET / HTTP/1.1\r\n: v\r\n\r\n",              // empty name
           "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",  // obs-fold
           "GET / HTTP/1.1\r\nA: b\x01\r\n\r\n",         // control character in a value
           "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
           "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
           "GET /a\rb HTTP/1.1\r\n\r\n",  // bare CR
       }) {
    const Step s = Answer(in);
    ASSERT_EQ(s.kind, Step::kRespond) << in;
    EXPECT_EQ(s.status, 400) << in;
    EXPECT_TRUE(s.close) << in;
    EXPECT_THAT(s.output, StartsWith("HTTP/1.1 400 Bad Request\r\n")) << in;
    EXPECT_THAT(s.output, HasSubstr("Connection: close\r\n")) << in;
  }
}

TEST(NextStep, OtherHttpVersionsAre505) {
  for (const char* in : {"GET / HTTP/2.0\r\n\r\n", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}) {
    const Step s = Answer(in);
    EXPECT_EQ(s.status, 505) << in;
    EXPECT_TRUE(s.close);
  }
  EXPECT_THAT(Answer("GET / HTTP/1.7\r\n\r\n").output, EndsWith("GET / 1.1 keep"));
}

TEST(NextStep, OversizedHeadsAre431EvenBeforeTheyEnd) {
  Limits limits;
  limits.max_head_bytes = 64;
  const std::string long_field = "GET / HTTP/1.1\r\nX: " + std::string(100, 'a');
  Step s = Answer(long_field, limits);  // no end in sight, already too long
  EXPECT_EQ(s.status, 431);
  EXPECT_TRUE(s.close);
  s = Answer(long_field + "\r\n\r\n", limits);
  EXPECT_EQ(s.status, 431);
  s = Answer(std::string(100, '\n'), limits);  // empty lines count too
  EXPECT_EQ(s.status, 431);

  limits = Limits();
  limits.max_headers = 3;
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 4; ++i) many += "A: b\r\n";
  EXPECT_EQ(Answer(many + "\r\n", limits).status, 431);
}

TEST(NextStep, RequestsWithBodiesAreAnsweredThenClosed) {
  Step s = Answer("POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(s.status, 200);  // Echo answers anything; the router would say 405
  EXPECT_TRUE(s.close);
  s = Answer("POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_TRUE(s.close);
  s = Answer("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_FALSE(s.close);
}

TEST(NextStep, AcceptEncodingWeights) {
  auto gzip = [](const std::string& value) {
    return Answer("GET / HTTP/1.1\r\nAccept-Encoding: " + value + "\r\n\r\n").output;
  };
  EXPECT_THAT(gzip("gzip"), EndsWith(" gzip keep"));
  EXPECT_THAT(gzip("deflate, GZIP;q=0.5"), EndsWith(" gzip keep"));
  EXPECT_THAT(gzip("*"), EndsWith(" gzip keep"));
  EXPECT_THAT(gzip("gzip;q=0"), Not(EndsWith(" gzip keep")));
  EXPECT_THAT(gzip("gzip; q=0.000"), Not(EndsWith(" gzip keep")));
  EXPECT_THAT(gzip("identity"), Not(EndsWith(" gzip keep")));
  EXPECT_THAT(gzip("gzip;q=0.001"), EndsWith(" gzip keep"));
}

TEST(NextStep, AHandlerThatThrowsGives500) {
  const Step s = NextStep("GET / HTTP/1.1\r\n\r\n", Limits(),
                          [](const Request&) -> Response { throw std::runtime_error("boom"); });
  EXPECT_EQ(s.status, 500);
  EXPECT_TRUE(s.close);
  EXPECT_THAT(s.output, HasSubstr("boom"));
}

TEST(NextStep, ExtraHeadersAndEncodingAreWritten) {
  const Step s = NextStep("GET / HTTP/1.1\r\n\r\n", Limits(), [](const Request&) {
    Response r;
    r.status = 405;
    r.content_encoding = "gzip";
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  });
  EXPECT_THAT(s.output, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(s.output, HasSubstr("\r\nAllow: GET, HEAD\r\n"));
  EXPECT_THAT(s.output, HasSubstr("\r\nContent-Encoding: gzip\r\n"));
}

TEST(ErrorResponse, IsCompleteAndCloses) {
  const std::string r = ErrorResponse(408, "too slow");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 408 Request Timeout\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Length: 9\r\n"));
  EXPECT_THAT(r, HasSubstr("Connection: close\r\n"));
  EXPECT_THAT(r, EndsWith("\r\n\r\ntoo slow\n"));
}

TEST(Gzip, RoundTripsThroughZlib) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "baton_metric{i=\"" + std::to_string(i) + "\"} 1\n";
  const std::string gz = Gzip(text);
  ASSERT_FALSE(gz.empty());
  EXPECT_LT(gz.size(), text.size() / 4);
  ASSERT_GE(gz.size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(gz[0]), 0x1f);  // gzip magic
  EXPECT_EQ(static_cast<unsigned char>(gz[1]), 0x8b);

  z_stream zs{};
  ASSERT_EQ(inflateInit2(&zs, 15 + 16), Z_OK);
  std::string back(text.size() + 16, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  zs.avail_in = static_cast<uInt>(gz.size());
  zs.next_out = reinterpret_cast<Bytef*>(back.data());
  zs.avail_out = static_cast<uInt>(back.size());
  EXPECT_EQ(inflate(&zs, Z_FINISH), Z_STREAM_END);
  back.resize(zs.total_out);
  inflateEnd(&zs);
  EXPECT_EQ(back, text);
}

}  // namespace
}  // namespace baton::http

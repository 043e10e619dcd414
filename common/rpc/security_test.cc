#include "common/rpc/security.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/rpc/rpc.h"
#include "grpcpp/generic/generic_stub.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

// Certificates from scripts/make-certs.sh: one cluster CA (dir a) and a stranger's (dir b).
class Certs {
 public:
  static const Certs& Get() {
    static const Certs* certs = new Certs();
    return *certs;
  }
  std::string a(const std::string& f) const { return dir_ + "/a/" + f; }
  std::string b(const std::string& f) const { return dir_ + "/b/" + f; }
  const std::string& dir() const { return dir_; }

 private:
  Certs() {
    dir_ = (std::filesystem::temp_directory_path() /
            absl::StrCat("baton-security-test-", getpid()))
               .string();
    for (const char* sub : {"a", "b"}) {
      const std::string cmd = absl::StrCat("bash " BATON_SOURCE_DIR "/scripts/make-certs.sh ",
                                           dir_, "/", sub, " 1 >/dev/null");
      if (std::system(cmd.c_str()) != 0) std::abort();
    }
  }
  std::string dir_;
};

TlsConfig Config(const std::string& cert, const std::string& key, const std::string& ca) {
  TlsConfig c;
  c.cert_file = cert;
  c.key_file = key;
  c.ca_file = ca;
  c.reload_interval = absl::Seconds(1);
  return c;
}

// Answers GetStatus with the caller's verified identity in worker_id and its
// certificate's URI SANs, comma-separated, in job_id.
class WhoAmI final : public baton::v1::WorkerService::Service {
 public:
  grpc::Status GetStatus(grpc::ServerContext* ctx, const baton::v1::GetWorkerStatusRequest*,
                         baton::v1::WorkerStatus* out) override {
    out->set_worker_id(PeerIdentity(*ctx));
    out->set_job_id(absl::StrJoin(PeerUris(*ctx), ","));
    return grpc::Status::OK;
  }
};

struct Server {
  WhoAmI service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

std::unique_ptr<Server> Serve(const TlsConfig& tls, ClientCerts certs) {
  auto s = std::make_unique<Server>();
  ServerOptions o;
  o.tls = tls;
  o.client_certs = certs;
  o.services = {&s->service};
  auto started = StartServer(o, &s->address);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return nullptr;
  s->server = *std::move(started);
  return s;
}

// Calls GetStatus over a channel with `tls`; returns the identity the server saw (and, with
// `uris`, the URI SANs it saw).
absl::StatusOr<std::string> Call(const std::string& address, const TlsConfig& tls,
                                 std::string* uris = nullptr) {
  grpc::ChannelArguments args;
  auto channel = grpc::CreateCustomChannel(address, MakeChannelCredentials(tls, &args), args);
  auto stub = baton::v1::WorkerService::NewStub(channel);
  auto ctx = ContextWithTimeout(absl::Seconds(60));  // only bounds a hang
  baton::v1::GetWorkerStatusRequest req;
  baton::v1::WorkerStatus out;
  grpc::Status s = stub->GetStatus(ctx.get(), req, &out);
  if (!s.ok()) return FromGrpcStatus(s);
  if (uris != nullptr) *uris = out.job_id();
  return out.worker_id();
}

TEST(SecurityTest, PlaintextOnlyOnLoopbackOrWhenAskedFor) {
  TlsConfig none;
  EXPECT_TRUE(CheckServerSecurity(none, "127.0.0.1:7070").ok());
  EXPECT_TRUE(CheckServerSecurity(none, "localhost:0").ok());
  EXPECT_TRUE(CheckServerSecurity(none, "[::1]:7070").ok());
  absl::Status s = CheckServerSecurity(none, "0.0.0.0:7070");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--insecure"));
  EXPECT_THAT(s.message(), HasSubstr("0.0.0.0:7070"));
  EXPECT_FALSE(CheckServerSecurity(none, "10.1.2.3:7070").ok());
  EXPECT_FALSE(CheckServerSecurity(none, "[::]:7070").ok());
  TlsConfig insecure;
  insecure.insecure = true;
  EXPECT_TRUE(CheckServerSecurity(insecure, "0.0.0.0:7070").ok());
}

TEST(SecurityTest, ContradictoryOrMissingFilesAreNamed) {
  const Certs& c = Certs::Get();
  TlsConfig half = Config(c.a("coordinator.pem"), "", "");
  EXPECT_THAT(CheckTlsConfig(half).message(), HasSubstr("--tls_cert needs --tls_key"));
  TlsConfig missing = Config(c.a("coordinator.pem"), c.dir() + "/nope.key", "");
  absl::Status s = CheckTlsConfig(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tls_key: cannot read"));
  EXPECT_THAT(s.message(), HasSubstr("nope.key"));
  TlsConfig both = Config(c.a("coordinator.pem"), c.a("coordinator.key"), c.a("ca.pem"));
  both.insecure = true;
  EXPECT_THAT(CheckTlsConfig(both).message(), HasSubstr("--insecure contradicts"));
  TlsConfig ca_only = Config("", "", c.a("ca.pem"));
  EXPECT_TRUE(CheckTlsConfig(ca_only).ok());  // a client verifying servers
  EXPECT_THAT(CheckServerSecurity(ca_only, "127.0.0.1:0").message(),
              HasSubstr("needs --tls_cert and --tls_key"));
}

TEST(SecurityTest, RequiredClientCertificateMustBeSignedByTheClusterCa) {
  const Certs& c = Certs::Get();
  auto server = Serve(Config(c.a("coordinator.pem"), c.a("coordinator.key"), c.a("ca.pem")),
                      ClientCerts::kRequire);
  ASSERT_NE(server, nullptr);
  // A cluster member: its identity reaches the service.
  absl::StatusOr<std::string> who =
      Call(server->address, Config(c.a("worker-0.pem"), c.a("worker-0.key"), c.a("ca.pem")));
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, "baton-worker-0");
  // No certificate, a stranger's certificate, plaintext: refused at the handshake.
  EXPECT_FALSE(Call(server->address, Config("", "", c.a("ca.pem"))).ok());
  EXPECT_FALSE(
      Call(server->address, Config(c.b("worker-0.pem"), c.b("worker-0.key"), c.a("ca.pem"))).ok());
  EXPECT_FALSE(Call(server->address, TlsConfig()).ok());
  // A client trusting another CA does not accept the server.
  EXPECT_FALSE(
      Call(server->address, Config(c.b("worker-0.pem"), c.b("worker-0.key"), c.b("ca.pem"))).ok());
}

TEST(SecurityTest, OptionalClientCertificateIsVerifiedWhenPresented) {
  const Certs& c = Certs::Get();
  auto server = Serve(Config(c.a("coordinator.pem"), c.a("coordinator.key"), c.a("ca.pem")),
                      ClientCerts::kVerifyIfPresent);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::string> anonymous = Call(server->address, Config("", "", c.a("ca.pem")));
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ(*anonymous, "");
  absl::StatusOr<std::string> member =
      Call(server->address, Config(c.a("client.pem"), c.a("client.key"), c.a("ca.pem")));
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_EQ(*member, "baton-client");
  // A certificate from another CA is refused, not treated as anonymous.
  EXPECT_FALSE(
      Call(server->address, Config(c.b("client.pem"), c.b("client.key"), c.a("ca.pem"))).ok());
}

// A worker's certificate names the worker role in a URI SAN; a user's certificate of the
// same CA does not (what the coordinator checks before a certificate may register).
TEST(SecurityTest, WorkerCertificatesCarryTheWorkerUriAndUsersDoNot) {
  const Certs& c = Certs::Get();
  auto server = Serve(Config(c.a("coordinator.pem"), c.a("coordinator.key"), c.a("ca.pem")),
                      ClientCerts::kVerifyIfPresent);
  ASSERT_NE(server, nullptr);
  std::string uris;
  ASSERT_TRUE(
      Call(server->address, Config(c.a("worker-0.pem"), c.a("worker-0.key"), c.a("ca.pem")), &uris)
          .ok());
  EXPECT_EQ(uris, absl::StrCat(kWorkerUriPrefix, "worker-0"));
  ASSERT_TRUE(
      Call(server->address, Config(c.a("client.pem"), c.a("client.key"), c.a("ca.pem")), &uris)
          .ok());
  EXPECT_EQ(uris, "spiffe://baton/user/baton-client");
  ASSERT_TRUE(Call(server->address, Config("", "", c.a("ca.pem")), &uris).ok());
  EXPECT_EQ(uris, "");  // no certificate, no URIs
}

TEST(SecurityTest, ServerNameOverrideChecksTheClusterName) {
  const Certs& c = Certs::Get();
  auto server = Serve(Config(c.a("coordinator.pem"), c.a("coordinator.key"), c.a("ca.pem")),
                      ClientCerts::kVerifyIfPresent);
  ASSERT_NE(server, nullptr);
  TlsConfig ok = Config("", "", c.a("ca.pem"));
  ok.server_name = "baton";
  EXPECT_TRUE(Call(server->address, ok).ok());
  TlsConfig wrong = ok;
  wrong.server_name = "not-in-the-certificate";
  EXPECT_FALSE(Call(server->address, wrong).ok());
}

TEST(SecurityTest, ReplacedCertificatesAreServedWithoutRestart) {
  const Certs& c = Certs::Get();
  const std::string dir = c.dir() + "/live";
  std::filesystem::create_directories(dir);
  auto copy = [&](const std::string& from, const std::string& to) {
    // Write then rename, as an operator rotating files should.
    std::filesystem::copy_file(from, dir + "/" + to + ".tmp",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(dir + "/" + to + ".tmp", dir + "/" + to);
  };
  copy(c.a("coordinator.pem"), "cert.pem");
  copy(c.a("coordinator.key"), "key.pem");
  copy(c.a("ca.pem"), "ca.pem");
  auto server = Serve(Config(dir + "/cert.pem", dir + "/key.pem", dir + "/ca.pem"),
                      ClientCerts::kRequire);
  ASSERT_NE(server, nullptr);
  const TlsConfig old_member = Config(c.a("worker-0.pem"), c.a("worker-0.key"), c.a("ca.pem"));
  const TlsConfig new_member = Config(c.b("worker-0.pem"), c.b("worker-0.key"), c.b("ca.pem"));
  ASSERT_TRUE(Call(server->address, old_member).ok());
  EXPECT_FALSE(Call(server->address, new_member).ok());
  // Rotate to CA b: within a few reload intervals the server presents and trusts only b.
  copy(c.b("ca.pem"), "ca.pem");
  copy(c.b("coordinator.key"), "key.pem");
  copy(c.b("coordinator.pem"), "cert.pem");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);  // only bounds a hang
  bool rotated = false;
  while (!rotated && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(250));
    rotated = Call(server->address, new_member).ok();
  }
  EXPECT_TRUE(rotated) << "the server did not pick up the replaced files";
  EXPECT_FALSE(Call(server->address, old_member).ok());
}

TEST(SecurityTest, HealthServerIsPlaintextAndAnswersHealthOnly) {
  std::string address;
  auto server = StartHealthServer("127.0.0.1:0", &address);
  ASSERT_TRUE(server.ok()) << server.status();
  // Health answers over plaintext: an empty HealthCheckRequest gets status SERVING (field 1,
  // varint 1: bytes 08 01).
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext hctx;
  hctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::ByteBuffer request(nullptr, 0), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&hctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&done](grpc::Status s) { done.set_value(s); });
  ASSERT_TRUE(done.get_future().get().ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  // ...and baton's services are not there.
  auto stub = baton::v1::WorkerService::NewStub(channel);
  auto ctx = ContextWithTimeout(absl::Seconds(60));
  baton::v1::WorkerStatus out;
  EXPECT_EQ(stub->GetStatus(ctx.get(), {}, &out).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace baton

// A hostile client for tests/hostile_test.py: a program of its own (not batonctl) that tries
// what a stranger or a misbehaving user on the cluster's network would try against a cluster
// running with mutual TLS, tokens and a join token, and checks that each attempt is refused
// with the right status. Prints one line per attempt ("refused: ..." or "FAIL: ...") and
// exits 1 if any attempt was not refused as expected.
//
//   hostile_client --coordinator H:P --workers H:P,H:P --tls_dir DIR --intruder_dir DIR
//                  --viewer_token T --alice_token T --bob_token T --job JOB
//                  --join_token T --garbage_ports H:P,H:P,...
//
// DIR holds scripts/make-certs.sh output: the cluster's (client.pem is a certificate the
// cluster CA signed that belongs to no worker) and an intruder's with its own CA.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/v1/cluster.grpc.pb.h"
#include "baton/v1/jobs.grpc.pb.h"
#include "baton/v1/tensor.grpc.pb.h"
#include "baton/v1/worker.grpc.pb.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"

ABSL_FLAG(std::string, coordinator, "", "coordinator host:port");
ABSL_FLAG(std::string, workers, "", "comma-separated worker host:port");
ABSL_FLAG(std::string, tls_dir, "", "the cluster's certificates (make-certs.sh)");
ABSL_FLAG(std::string, intruder_dir, "", "certificates of another CA");
ABSL_FLAG(std::string, viewer_token, "", "a viewer's token");
ABSL_FLAG(std::string, alice_token, "", "the token of the submitter who owns --job");
ABSL_FLAG(std::string, bob_token, "", "another submitter's token");
ABSL_FLAG(std::string, job, "", "alice's running job");
ABSL_FLAG(std::string, join_token, "", "the cluster's join token (which a user may know)");
ABSL_FLAG(std::string, garbage_ports, "", "comma-separated host:port to send junk bytes to");

namespace baton {
namespace {

int failures = 0;

// Job keys are random 64-bit numbers (about 19 decimal digits): no refusal may carry one,
// neither the job's nor the one this client guessed.
bool CarriesAKey(const std::string& message) {
  static const std::regex kLongNumber("[0-9]{12,}");
  return std::regex_search(message, kLongNumber);
}

void Expect(const std::string& what, const grpc::Status& got,
            std::vector<grpc::StatusCode> want) {
  if (CarriesAKey(got.error_message())) {
    ++failures;
    std::printf("FAIL: %s: the refusal carries a number like a job key: %s\n", what.c_str(),
                got.error_message().c_str());
    return;
  }
  for (grpc::StatusCode w : want) {
    if (got.error_code() == w) {
      std::printf("refused: %s -> %s: %s\n", what.c_str(),
                  absl::StatusCodeToString(static_cast<absl::StatusCode>(w)).c_str(),
                  got.error_message().substr(0, 160).c_str());
      return;
    }
  }
  ++failures;
  std::printf("FAIL: %s -> %s: %s\n", what.c_str(),
              absl::StatusCodeToString(static_cast<absl::StatusCode>(got.error_code())).c_str(),
              got.error_message().c_str());
}

TlsConfig Tls(const std::string& dir, const std::string& name, const std::string& ca_dir) {
  TlsConfig t;
  t.ca_file = ca_dir + "/ca.pem";
  if (!name.empty()) {
    t.cert_file = dir + "/" + name + ".pem";
    t.key_file = dir + "/" + name + ".key";
  }
  return t;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address, const TlsConfig& tls) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(256 << 20);
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(tls, &args), args);
}

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
  auto ctx = ContextWithTimeout(absl::Seconds(10));
  if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return ctx;
}

void People(const std::string& coordinator, const std::string& cluster_dir) {
  auto jobs = baton::v1::JobService::NewStub(Channel(coordinator, Tls("", "", cluster_dir)));
  baton::v1::ListJobsResponse list;
  Expect("ListJobs without a token", jobs->ListJobs(Ctx().get(), {}, &list),
         {grpc::StatusCode::UNAUTHENTICATED});
  Expect("ListJobs with a made-up token",
         jobs->ListJobs(Ctx("made-up-token-0123456789abcdef").get(), {}, &list),
         {grpc::StatusCode::UNAUTHENTICATED});
  baton::v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_steps(1);
  baton::v1::Job job;
  Expect("SubmitJob with a viewer's token",
         jobs->SubmitJob(Ctx(absl::GetFlag(FLAGS_viewer_token)).get(), submit, &job),
         {grpc::StatusCode::PERMISSION_DENIED});
  baton::v1::CancelJobRequest cancel;
  cancel.set_job_id(absl::GetFlag(FLAGS_job));
  Expect("CancelJob of alice's job with bob's token",
         jobs->CancelJob(Ctx(absl::GetFlag(FLAGS_bob_token)).get(), cancel, &job),
         {grpc::StatusCode::PERMISSION_DENIED});
  // A spec reading a file outside the data roots.
  baton::v1::SubmitJobRequest shadow;
  baton::v1::JobSpec* spec = shadow.mutable_spec();
  spec->set_name("shadow");
  baton::v1::GptSpec* gpt = spec->mutable_model()->mutable_gpt();
  gpt->set_vocab_size(96);
  gpt->set_context(8);
  gpt->set_d_model(16);
  gpt->set_heads(2);
  gpt->set_layers(2);
  spec->mutable_data()->mutable_text()->set_path("/etc/shadow");
  spec->mutable_data()->set_batch_size(2);
  spec->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  spec->set_steps(1);
  grpc::Status s = jobs->SubmitJob(Ctx(absl::GetFlag(FLAGS_alice_token)).get(), shadow, &job);
  Expect("SubmitJob reading /etc/shadow", s, {grpc::StatusCode::INVALID_ARGUMENT});
  if (s.error_message().find("data.text.path") == std::string::npos) {
    ++failures;
    std::printf("FAIL: the /etc/shadow refusal does not name data.text.path\n");
  }
  // Checkpoints outside the cluster's checkpoint root.
  for (const std::string& dir : {std::string("/etc/baton-ckpt"), std::string("ckpt/../../..")}) {
    baton::v1::SubmitJobRequest ckpt = shadow;
    ckpt.mutable_spec()->mutable_data()->mutable_text()->set_path(
        "/usr/share/common-licenses/GPL-3");
    ckpt.mutable_spec()->mutable_checkpoint()->set_dir(dir);
    ckpt.mutable_spec()->mutable_checkpoint()->set_every_steps(1);
    grpc::Status c = jobs->SubmitJob(Ctx(absl::GetFlag(FLAGS_alice_token)).get(), ckpt, &job);
    Expect("SubmitJob writing checkpoints to " + dir, c, {grpc::StatusCode::INVALID_ARGUMENT});
    if (c.error_message().find("checkpoint.dir") == std::string::npos) {
      ++failures;
      std::printf("FAIL: the %s refusal does not name checkpoint.dir\n", dir.c_str());
    }
  }
  // Alice's weights: bob may neither resume from her job nor export it, nor may a viewer.
  baton::v1::SubmitJobRequest resume = shadow;
  resume.mutable_spec()->mutable_data()->mutable_text()->set_path(
      "/usr/share/common-licenses/GPL-3");
  resume.mutable_spec()->mutable_resume_from()->set_job_id(absl::GetFlag(FLAGS_job));
  Expect("SubmitJob resuming from alice's job with bob's token",
         jobs->SubmitJob(Ctx(absl::GetFlag(FLAGS_bob_token)).get(), resume, &job),
         {grpc::StatusCode::PERMISSION_DENIED});
  for (const auto& [who, token] :
       {std::pair<std::string, std::string>{"bob's", absl::GetFlag(FLAGS_bob_token)},
        {"a viewer's", absl::GetFlag(FLAGS_viewer_token)}}) {
    baton::v1::ExportJobRequest e;
    e.set_job_id(absl::GetFlag(FLAGS_job));
    auto ctx = Ctx(token);
    auto reader = jobs->ExportJob(ctx.get(), e);
    baton::v1::ExportChunk chunk;
    bool got_bytes = false;
    while (reader->Read(&chunk)) got_bytes = true;
    grpc::Status st = reader->Finish();
    if (got_bytes) st = grpc::Status::OK;  // any byte is a leak
    Expect("ExportJob of alice's job with " + who + " token", st,
           {grpc::StatusCode::PERMISSION_DENIED});
  }
  // A viewer holding every watch stream it may open does not lock alice out.
  {
    baton::v1::WatchJobRequest w;
    w.set_job_id(absl::GetFlag(FLAGS_job));
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<std::unique_ptr<grpc::ClientReader<baton::v1::JobEvent>>> streams;
    int opened = 0;
    grpc::Status refused;
    for (int i = 0; i < 80; ++i) {
      ctxs.push_back(Ctx(absl::GetFlag(FLAGS_viewer_token)));
      streams.push_back(jobs->WatchJob(ctxs.back().get(), w));
      baton::v1::JobEvent first;
      if (!streams.back()->Read(&first)) {
        refused = streams.back()->Finish();
        streams.pop_back();
        break;
      }
      ++opened;
    }
    Expect(absl::StrCat("WatchJob number ", opened + 1, " with a viewer's token"), refused,
           {grpc::StatusCode::RESOURCE_EXHAUSTED});
    auto alice_ctx = Ctx(absl::GetFlag(FLAGS_alice_token));
    auto alice = jobs->WatchJob(alice_ctx.get(), w);
    baton::v1::JobEvent first;
    if (alice->Read(&first)) {
      std::printf("refused: nothing: alice watches her job beside the viewer's %d streams\n",
                  opened);
    } else {
      ++failures;
      std::printf("FAIL: alice could not watch her job beside the viewer's %d streams: %s\n",
                  opened, alice->Finish().error_message().c_str());
    }
    alice_ctx->TryCancel();
    for (auto& c : ctxs) c->TryCancel();
  }
  // A 100 MB message.
  baton::v1::SubmitJobRequest huge = shadow;
  huge.mutable_spec()->mutable_data()->mutable_text()->set_inline_text(
      std::string(100 << 20, 'a'));
  Expect("SubmitJob of 100 MB", jobs->SubmitJob(Ctx(absl::GetFlag(FLAGS_alice_token)).get(), huge, &job),
         {grpc::StatusCode::RESOURCE_EXHAUSTED});
}

void FakeWorkers(const std::string& coordinator, const std::string& cluster_dir,
                 const std::string& intruder_dir) {
  baton::v1::RegisterWorkerRequest reg;
  reg.set_address("127.0.0.1:1");
  reg.set_worker_id("w-1");  // a live worker's id
  reg.set_session_token("intruder-session-0123456789");
  baton::v1::RegisterWorkerResponse resp;
  {
    auto cluster =
        baton::v1::ClusterService::NewStub(Channel(coordinator, Tls("", "", cluster_dir)));
    Expect("RegisterWorker without a certificate", cluster->RegisterWorker(Ctx().get(), reg, &resp),
           {grpc::StatusCode::UNAUTHENTICATED});
    baton::v1::ReportProgressRequest p;
    p.set_worker_id("w-1");
    p.set_job_id(absl::GetFlag(FLAGS_job));
    p.set_step(999999);
    baton::v1::ReportProgressResponse pr;
    Expect("ReportProgress for w-1 without its session",
           cluster->ReportProgress(Ctx().get(), p, &pr), {grpc::StatusCode::UNAUTHENTICATED});
    baton::v1::ReportResultRequest r;
    r.set_worker_id("w-1");
    r.set_job_id(absl::GetFlag(FLAGS_job));
    baton::v1::ReportResultResponse rr;
    auto ctx = Ctx();
    ctx->AddMetadata(kSessionMetadata, "guessed-session-0123456789");
    Expect("ReportResult for w-1 with a guessed session", cluster->ReportResult(ctx.get(), r, &rr),
           {grpc::StatusCode::PERMISSION_DENIED});
  }
  {
    // A certificate from another CA: no handshake.
    auto cluster = baton::v1::ClusterService::NewStub(
        Channel(coordinator, Tls(intruder_dir, "worker-0", cluster_dir)));
    Expect("RegisterWorker with another CA's certificate",
           cluster->RegisterWorker(Ctx().get(), reg, &resp), {grpc::StatusCode::UNAVAILABLE});
  }
  {
    // A certificate of the cluster's CA (a member's), taking a live worker's id: the id is
    // bound to w-1's certificate; and without the join token it may not join at all.
    auto cluster = baton::v1::ClusterService::NewStub(
        Channel(coordinator, Tls(cluster_dir, "client", cluster_dir)));
    Expect("RegisterWorker as w-1 with a member certificate but no join token",
           cluster->RegisterWorker(Ctx().get(), reg, &resp), {grpc::StatusCode::UNAUTHENTICATED});
    // A user's certificate with the join token: still not a worker's certificate.
    baton::v1::RegisterWorkerRequest fresh = reg;
    fresh.set_worker_id("w-intruder");
    fresh.set_address("127.0.0.1:2");
    auto ctx = Ctx();
    ctx->AddMetadata(kJoinTokenMetadata, absl::GetFlag(FLAGS_join_token));
    Expect("RegisterWorker with a user's certificate and the join token",
           cluster->RegisterWorker(ctx.get(), fresh, &resp), {grpc::StatusCode::PERMISSION_DENIED});
  }
}

// One stream: a tensor header for `floats` float32 elements (from `source_rank`, of `job_key`,
// step `step`, stage 0 activation) carrying `payload`, then `then` if given; its status.
grpc::Status Push(const std::shared_ptr<grpc::Channel>& channel, uint64_t job_key,
                  int source_rank, int64_t step, int64_t floats, const std::string& payload,
                  const baton::v1::TensorFrame* then = nullptr) {
  auto stub = baton::v1::TensorService::NewStub(channel);
  baton::v1::PushSummary summary;
  auto ctx = Ctx();
  auto writer = stub->Push(ctx.get(), &summary);
  baton::v1::TensorFrame frame;
  baton::v1::TensorHeader* h = frame.mutable_header();
  h->set_job_key(job_key);
  h->set_step(step);
  h->set_stage(0);
  h->set_kind(baton::v1::TENSOR_KIND_ACTIVATION);
  h->set_dtype(baton::v1::DTYPE_FLOAT32);
  h->add_shape(floats);
  h->set_byte_length(floats * 4);
  h->set_source_rank(source_rank);
  h->set_payload(payload);
  writer->Write(frame);
  if (then != nullptr) writer->Write(*then);
  writer->WritesDone();
  return writer->Finish();
}

void CallWorkers(const std::vector<std::string>& workers, const std::string& cluster_dir,
                 const std::string& intruder_dir) {
  for (const std::string& w : workers) {
    baton::v1::AbortJobRequest abort;
    abort.set_job_id(absl::GetFlag(FLAGS_job));
    abort.set_reason("hostile");
    baton::v1::AbortJobResponse ar;
    {
      auto stub = baton::v1::WorkerService::NewStub(Channel(w, Tls("", "", cluster_dir)));
      Expect("AbortJob on " + w + " without a certificate", stub->AbortJob(Ctx().get(), abort, &ar),
             {grpc::StatusCode::UNAVAILABLE});
    }
    {
      auto stub = baton::v1::WorkerService::NewStub(
          Channel(w, Tls(intruder_dir, "worker-0", cluster_dir)));
      Expect("AbortJob on " + w + " with another CA's certificate",
             stub->AbortJob(Ctx().get(), abort, &ar), {grpc::StatusCode::UNAVAILABLE});
    }
    auto member = Channel(w, Tls(cluster_dir, "client", cluster_dir));
    {
      auto stub = baton::v1::WorkerService::NewStub(member);
      Expect("AbortJob on " + w + " with a member certificate, no session",
             stub->AbortJob(Ctx().get(), abort, &ar), {grpc::StatusCode::UNAUTHENTICATED});
      auto ctx = Ctx();
      ctx->AddMetadata(kSessionMetadata, "guessed-session-0123456789");
      baton::v1::StartJobRequest start;
      baton::v1::StartJobResponse sr;
      Expect("StartJob on " + w + " with a guessed session", stub->StartJob(ctx.get(), start, &sr),
             {grpc::StatusCode::PERMISSION_DENIED});
    }
    // Tensors and an abort notice from a member that is not the job's peer, with guessed
    // job keys and plausible tags: refused, and the job must not notice.
    std::mt19937_64 rng(42);
    for (int i = 0; i < 4; ++i) {
      baton::v1::TensorFrame notice;
      notice.mutable_abort()->set_job_key(rng());
      notice.mutable_abort()->set_reason("forged abort");
      Expect("a tensor stream to " + w + " from a non-peer",
             Push(member, rng(), i % 2, 1000 + i, 2, std::string(8, '\0'), &notice),
             {grpc::StatusCode::FAILED_PRECONDITION, grpc::StatusCode::PERMISSION_DENIED});
    }
    // Made-up source ranks, and big tensors from them: refused before any memory is taken.
    for (int rank : {7, -1, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16}) {
      Expect(absl::StrCat("a 16 MiB tensor to ", w, " from made-up rank ", rank),
             Push(member, rng(), rank, 1, 4 << 20, std::string(1 << 20, 'x')),
             {grpc::StatusCode::FAILED_PRECONDITION, grpc::StatusCode::PERMISSION_DENIED});
    }
    // Junk rendezvous values under made-up job keys: nothing is filed, so later jobs find
    // the store as empty as before.
    {
      auto stub = baton::v1::TensorService::NewStub(member);
      int refused = 0;
      grpc::Status last;
      for (int i = 0; i < 1024; ++i) {
        baton::v1::RendezvousMessage m;
        m.set_key(absl::StrCat("baton/gloo/job/", rng() % 1000000, "/attempt/0/group/0/junk", i));
        m.set_value(std::string(64, 'j'));
        baton::v1::RendezvousAck ack;
        last = stub->Rendezvous(Ctx().get(), m, &ack);
        if (!last.ok()) ++refused;
      }
      if (refused == 1024) {
        Expect("1024 junk rendezvous values to " + w, last,
               {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::PERMISSION_DENIED});
      } else {
        ++failures;
        std::printf("FAIL: %d of 1024 junk rendezvous values to %s were filed\n", 1024 - refused,
                    w.c_str());
      }
    }
  }
}

void Garbage(const std::vector<std::string>& ports) {
  std::mt19937 rng(7);
  for (const std::string& hp : ports) {
    const size_t colon = hp.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(hp.substr(colon + 1), &port)) continue;
    for (int round = 0; round < 5; ++round) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, hp.substr(0, colon).c_str(), &addr.sin_addr);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        std::string junk(4096, '\0');
        for (char& c : junk) c = static_cast<char>(rng());
        if (round == 0) junk = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + junk;  // a real preface
        (void)!write(fd, junk.data(), junk.size());
      }
      close(fd);
    }
    std::printf("sent junk to %s\n", hp.c_str());
  }
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_tls_dir);
  const std::string intruder = absl::GetFlag(FLAGS_intruder_dir);
  std::vector<std::string> workers =
      absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty());
  baton::People(absl::GetFlag(FLAGS_coordinator), dir);
  baton::FakeWorkers(absl::GetFlag(FLAGS_coordinator), dir, intruder);
  baton::CallWorkers(workers, dir, intruder);
  baton::Garbage(absl::StrSplit(absl::GetFlag(FLAGS_garbage_ports), ',', absl::SkipEmpty()));
  std::printf("%d attempt(s) not refused as expected\n", baton::failures);
  return baton::failures == 0 ? 0 : 1;
}

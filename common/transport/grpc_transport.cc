#include "common/transport/grpc_transport.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "baton/v1/tensor.grpc.pb.h"  // also the protobuf serialization traits
#include "common/rpc/rpc.h"
#include "common/transport/frames.h"
#include "common/core/mutex.h"
#include "grpcpp/support/sync_stream.h"

namespace baton {

using transport_internal::ChunkFrame;
using transport_internal::HeaderFrame;
using transport_internal::kPushMethod;
using transport_internal::MakeHeader;
using transport_internal::SerializeFrame;

namespace {

// condition_variable::wait_for adds the duration to now(): keep it finite.
std::chrono::nanoseconds WaitFor(absl::Duration d) {
  return absl::ToChronoNanoseconds(std::clamp(d, absl::ZeroDuration(), absl::Hours(1)));
}

// Names the calling thread (at most 15 characters), for top, perf and debuggers.
void NameThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

// How long an aborting or closing stream may take to deliver its last frames.
constexpr absl::Duration kGoodbyeGrace = absl::Seconds(1);
// How often a sender waiting for a connection checks for abort and shutdown.
constexpr absl::Duration kConnectPoll = absl::Milliseconds(100);

const char* StateName(grpc_connectivity_state s) {
  switch (s) {
    case GRPC_CHANNEL_IDLE:
      return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
      return "CONNECTING";
    case GRPC_CHANNEL_READY:
      return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "TRANSIENT_FAILURE";
    case GRPC_CHANNEL_SHUTDOWN:
      return "SHUTDOWN";
  }
  return "UNKNOWN";
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// The completion state of one send, shared by its SendWork, the queue and the payload.
struct SendState {
  SendState(std::string w, absl::Time d) : what(std::move(w)), deadline(d) {}
  const std::string what;  // "rank R: sending <tag> to rank P at ADDRESS"
  const absl::Time deadline;
  Mutex mu;
  std::condition_variable cv;
  bool written = false;   // every frame was handed to gRPC
  bool released = false;  // gRPC let go of the tensor's memory
  bool finished = false;
  absl::Status status;

  void Finish(const absl::Status& s) {
    MutexLock lock(mu);
    if (finished) return;
    status = s;
    finished = true;
    cv.notify_all();
  }
  void MarkWritten() {
    MutexLock lock(mu);
    written = true;
    if (released) finished = true;
    cv.notify_all();
  }
  void MarkReleased() {
    MutexLock lock(mu);
    released = true;
    if (written) finished = true;
    cv.notify_all();
  }
  bool IsFinished() {
    MutexLock lock(mu);
    return finished;
  }
};

// Keeps the tensor alive while gRPC references its memory; the last reference gone (the
// sender thread's and every chunk slice's) means the bytes have left.
struct Payload {
  Payload(Tensor t, std::shared_ptr<SendState> s) : tensor(std::move(t)), state(std::move(s)) {}
  ~Payload() { state->MarkReleased(); }
  Tensor tensor;
  std::shared_ptr<SendState> state;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeTensorChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);  // as MakeChannel (common/rpc)
  args.SetMaxSendMessageSize(64 << 20);
  // No retries: the retry layer would keep a reference to every message of a stream until
  // the call commits, delaying the release of the tensors' memory, and nothing about a
  // half-sent tensor stream is safe to replay anyway.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  std::shared_ptr<grpc::ChannelCredentials> creds = MakeChannelCredentials(ProcessTls(), &args);
  return grpc::CreateCustomChannel(address, creds, args);
}

class GrpcTransport::Work final : public SendWork {
 public:
  explicit Work(std::shared_ptr<SendState> state) : state_(std::move(state)) {}
  absl::Status Wait(absl::Time deadline) override {
    MutexLock lock(state_->mu);
    while (!state_->finished) {
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(state_->what, ": not sent by the wait's deadline"));
      }
      state_->cv.wait_for(lock.native(), WaitFor(deadline - now));
    }
    return state_->status;
  }
  bool IsCompleted() override { return state_->IsFinished(); }

 private:
  const std::shared_ptr<SendState> state_;
};

struct GrpcTransport::Item {
  TensorTag tag;
  Tensor tensor;
  std::shared_ptr<SendState> state;
  absl::Time deadline;  // state->deadline, or earlier at shutdown
};

// One Push stream to a peer. The sender thread writes; once the first frame is out, a
// finisher thread blocks in Finish() so that the stream's end is noticed at once, also
// while the sender is idle (a receiver that refused a tensor, or a peer that vanished).
struct GrpcTransport::Stream {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer;
  baton::v1::PushSummary summary;
  std::thread finisher;
  // Guarded by the transport's mu_.
  bool done = false;     // Finish returned
  bool closing = false;  // we sent WritesDone (or an abort notice): an end is expected
  grpc::Status status;
};

struct GrpcTransport::Peer {
  int rank = 0;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::internal::RpcMethod> method;
  std::thread thread;
  std::condition_variable wake;  // queue, abort, stop, stream end

  std::unique_ptr<Stream> stream;  // created and destroyed by the sender thread

  // Guarded by the transport's mu_.
  std::deque<Item> queue;
  // Sends accepted and not known to be finished: queued, being written, or written and
  // waiting for gRPC to release the payload. Abort and stream failures fail them all.
  std::vector<std::shared_ptr<SendState>> inflight;
  absl::Status failed;                      // sticky once a stream failed
  grpc::ClientContext* live_ctx = nullptr;  // the watchdog cancels through it
  absl::Time write_deadline = absl::InfiniteFuture();
  std::string cancel_reason;  // set when the watchdog cancelled the stream
  std::string last_sent;      // the tag last written, for messages
  PeerCounters counters;
};

GrpcTransport::GrpcTransport(Options options, TensorInbox* inbox)
    : options_(std::move(options)), inbox_(inbox) {
  const int n = static_cast<int>(options_.peer_addresses.size());
  peers_.resize(n);
  for (int r = 0; r < n; ++r) {
    if (r == options_.rank || options_.peer_addresses[r].empty()) continue;
    auto p = std::make_unique<Peer>();
    p->rank = r;
    p->address = options_.peer_addresses[r];
    p->channel =
        options_.make_channel ? options_.make_channel(p->address) : MakeTensorChannel(p->address);
    p->method = std::make_unique<grpc::internal::RpcMethod>(
        kPushMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, p->channel);
    peers_[r] = std::move(p);
  }
  for (auto& p : peers_) {
    if (p) {
      p->thread = std::thread([this, peer = p.get()] {
        NameThread(absl::StrCat("tx", options_.rank, "-", peer->rank));
        SenderLoop(peer);
      });
    }
  }
  watchdog_ = std::thread([this] {
    NameThread(absl::StrCat("txwatch", options_.rank));
    WatchdogLoop();
  });
}

GrpcTransport::~GrpcTransport() { Shutdown(); }

std::string GrpcTransport::Where(const Peer& peer, const TensorTag& tag) const {
  return absl::StrCat("rank ", options_.rank, ": sending ", tag.ToString(), " to rank ", peer.rank,
                      " at ", peer.address);
}

std::unique_ptr<SendWork> GrpcTransport::Send(int peer, const TensorTag& tag, const Tensor& t) {
  const int n = static_cast<int>(peers_.size());
  if (peer < 0 || peer >= n || peer == options_.rank) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat("grpc: rank ", options_.rank, " cannot send ", tag.ToString(), " to rank ",
                     peer, " (", n, " ranks)")));
  }
  Peer* p = peers_[peer].get();
  if (p == nullptr) {
    return CompletedSend(absl::FailedPreconditionError(
        absl::StrCat("grpc: rank ", options_.rank, " cannot send ", tag.ToString(), " to rank ",
                     peer, ": no address for it")));
  }
  if (tag.job != options_.job_key) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat(Where(*p, tag), ": the tag's job key is not this transport's")));
  }
  if (!t.defined()) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat(Where(*p, tag), ": cannot send an undefined tensor")));
  }
  // A device tensor is staged through (page-locked) host memory: the bytes go out from there.
  absl::StatusOr<Tensor> host = t.StagedOnHost();
  if (!host.ok()) {
    return CompletedSend(absl::Status(
        host.status().code(),
        absl::StrCat(Where(*p, tag), ": staging to the host: ", host.status().message())));
  }
  const absl::Time deadline = absl::Now() + options_.send_timeout;
  auto state = std::make_shared<SendState>(Where(*p, tag), deadline);
  MutexLock lock(mu_);
  if (!aborted_.ok()) return CompletedSend(aborted_);
  if (stopping_) {
    return CompletedSend(
        absl::FailedPreconditionError(absl::StrCat(state->what, ": the transport is shut down")));
  }
  if (!p->failed.ok()) return CompletedSend(p->failed);
  if (p->inflight.size() >= 64) {
    std::erase_if(p->inflight, [](const auto& s) { return s->IsFinished(); });
  }
  p->inflight.push_back(state);
  p->queue.push_back(Item{tag, *std::move(host), state, deadline});
  p->wake.notify_all();
  return std::make_unique<Work>(std::move(state));
}

absl::StatusOr<Tensor> GrpcTransport::Recv(int peer, const TensorTag& tag, absl::Time deadline) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc: rank ", options_.rank, " cannot receive from rank ", peer));
  }
  {
    MutexLock lock(mu_);
    if (!aborted_.ok()) return aborted_;
  }
  absl::StatusOr<Tensor> t = inbox_->Take(peer, tag, deadline);
  if (!t.ok()) {
    const absl::Status& s = t.status();
    if (s.code() == absl::StatusCode::kAborted) return s;
    if (s.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrCat("grpc: rank ", options_.rank, " ", s.message()));
    }
    return absl::Status(s.code(), absl::StrCat("grpc: rank ", options_.rank, ": ", s.message()));
  }
  if (Peer* p = peers_[peer].get()) {
    MutexLock lock(mu_);
    ++p->counters.tensors_received;
    p->counters.bytes_received += static_cast<int64_t>(t->nbytes());
  }
  return t;
}

void GrpcTransport::Abort(const absl::Status& reason) {
  std::vector<std::shared_ptr<SendState>> pending;
  absl::Status aborted;
  {
    MutexLock lock(mu_);
    if (!aborted_.ok()) return;  // the first reason wins
    aborted_ =
        absl::AbortedError(absl::StrCat("rank ", options_.rank, " aborted: ", reason.message()));
    aborted = aborted_;
    const absl::Time grace = absl::Now() + kGoodbyeGrace;
    for (auto& p : peers_) {
      if (!p) continue;
      for (auto& st : p->inflight) pending.push_back(std::move(st));
      p->inflight.clear();
      p->write_deadline = std::min(p->write_deadline, grace);
      p->wake.notify_all();
    }
    watchdog_cv_.notify_all();
  }
  for (auto& s : pending) s->Finish(aborted);
  inbox_->AbortJob(options_.job_key, aborted);
}

PeerCounters GrpcTransport::Counters(int peer) const {
  MutexLock lock(mu_);
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || !peers_[peer]) return {};
  return peers_[peer]->counters;
}

void GrpcTransport::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      shutdown_deadline_ = absl::Now() + options_.shutdown_timeout;
      for (auto& p : peers_) {
        if (!p) continue;
        p->write_deadline = std::min(p->write_deadline, shutdown_deadline_);
        p->wake.notify_all();
      }
      watchdog_cv_.notify_all();
    }
    for (auto& p : peers_) {
      if (p && p->thread.joinable()) p->thread.join();
    }
    {
      MutexLock lock(mu_);
      watchdog_stop_ = true;
      watchdog_cv_.notify_all();
    }
    watchdog_.join();
  });
}

void GrpcTransport::SetWriteDeadline(Peer* p, absl::Time deadline) {
  MutexLock lock(mu_);
  if (stopping_) deadline = std::min(deadline, shutdown_deadline_);
  if (!aborted_.ok()) deadline = std::min(deadline, absl::Now() + kGoodbyeGrace);
  p->write_deadline = deadline;
  // Wake the watchdog only if it sleeps past the new deadline: a stream's write deadlines
  // change twice per tensor, and most are a send timeout away.
  if (deadline < watchdog_wakes_at_) watchdog_cv_.notify_all();
}

void GrpcTransport::FailPeerLocked(Peer* p, absl::StatusCode code, const std::string& reason) {
  absl::Status first;
  for (auto& st : p->inflight) {
    if (st->IsFinished()) continue;
    absl::Status s(code, absl::StrCat(st->what, ": ", reason));
    if (first.ok()) first = s;
    st->Finish(s);
  }
  p->inflight.clear();
  if (first.ok()) {
    first = absl::Status(
        code,
        absl::StrCat(
            "rank ", options_.rank, ": the stream to rank ", p->rank, " at ", p->address,
            p->last_sent.empty() ? std::string() : absl::StrCat(" (last sent: ", p->last_sent, ")"),
            " failed: ", reason));
  }
  if (p->failed.ok() && aborted_.ok()) p->failed = first;
}

void GrpcTransport::WatchdogLoop() {
  MutexLock lock(mu_);
  while (!watchdog_stop_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (auto& p : peers_) {
      if (!p || p->live_ctx == nullptr || !p->cancel_reason.empty()) continue;
      // The stream is overdue when a write blocks past its deadline, or when a tensor
      // written earlier is still held by gRPC (not yet on the wire) past its deadline.
      absl::Time due = p->write_deadline;
      std::erase_if(p->inflight, [](const auto& s) { return s->IsFinished(); });
      for (auto& st : p->inflight) due = std::min(due, st->deadline);
      if (due > now) {
        next = std::min(next, due);
        continue;
      }
      absl::StatusCode code = absl::StatusCode::kDeadlineExceeded;
      if (!aborted_.ok()) {
        p->cancel_reason = std::string(aborted_.message());
        code = absl::StatusCode::kAborted;
      } else if (stopping_ && shutdown_deadline_ <= now) {
        p->cancel_reason =
            absl::StrCat("the transport shut down (after ",
                         absl::FormatDuration(options_.shutdown_timeout), ") before it was sent");
      } else {
        p->cancel_reason = absl::StrCat(
            "not sent within the send timeout of ", absl::FormatDuration(options_.send_timeout),
            " (connection ", StateName(p->channel->GetState(false)), "; is the peer reading?)");
      }
      FailPeerLocked(p.get(), code, p->cancel_reason);
      p->live_ctx->TryCancel();  // a blocked Write or Finish returns
    }
    // Send deadlines are checked here too, so wake up for the earliest of them as well;
    // a Send never wakes the watchdog (the deadline of a new send is later than theirs).
    watchdog_wakes_at_ = next;
    watchdog_cv_.wait_for(lock.native(), WaitFor(next - now));
    watchdog_wakes_at_ = absl::InfinitePast();  // awake: no notification needed
  }
}

void GrpcTransport::NewStream(Peer* p) {
  p->stream = std::make_unique<Stream>();
  p->stream->ctx = std::make_unique<grpc::ClientContext>();
  // The initial metadata goes out with the first frame instead of a round of its own.
  p->stream->ctx->set_initial_metadata_corked(true);
  {
    MutexLock lock(mu_);
    p->live_ctx = p->stream->ctx.get();
    p->cancel_reason.clear();
  }
  p->stream->writer.reset(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      p->channel.get(), *p->method, p->stream->ctx.get(), &p->stream->summary));
}

void GrpcTransport::StartFinisher(Peer* p) {
  Stream* stream = p->stream.get();
  stream->finisher = std::thread([this, p, stream] {
    NameThread(absl::StrCat("txend", options_.rank, "-", p->rank));
    const grpc::Status st = stream->writer->Finish();
    absl::Status abort_with;
    {
      MutexLock lock(mu_);
      stream->done = true;
      stream->status = st;
      p->wake.notify_all();
      if (!st.ok() && aborted_.ok() && p->cancel_reason.empty()) {
        // Not our doing: the receiver refused something or the peer went away. Tensors
        // that were "sent" may be lost, so the job cannot go on.
        const grpc::StatusCode code = st.error_code();
        FailPeerLocked(p, static_cast<absl::StatusCode>(code),
                       absl::StrCat(CodeName(code), ": ", st.error_message(), " (connection ",
                                    StateName(p->channel->GetState(false)), ")"));
        if (!stopping_) abort_with = p->failed;
      }
    }
    if (!abort_with.ok()) Abort(abort_with);
  });
}

grpc::Status GrpcTransport::EndStream(Peer* p) {
  Stream* stream = p->stream.get();
  grpc::Status st;
  if (stream->finisher.joinable()) {
    stream->finisher.join();  // returns once the call ended; the watchdog bounds it
    st = stream->status;
  } else {
    st = stream->writer->Finish();  // nothing was written: the call ends at once
  }
  {
    MutexLock lock(mu_);
    p->live_ctx = nullptr;
    p->write_deadline = absl::InfiniteFuture();
  }
  p->stream.reset();
  return st;
}

absl::Status GrpcTransport::OpenStream(Peer* p, absl::Time deadline) {
  // Wait for the connection first, so that a peer that starts late (or restarts) is
  // waited for up to the send deadline instead of failing the first send at once.
  grpc_connectivity_state state = p->channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    {
      MutexLock lock(mu_);
      if (!aborted_.ok()) return aborted_;
      if (stopping_ && absl::Now() >= shutdown_deadline_) break;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;  // one last try below, for gRPC's own error message
    p->channel->WaitForStateChange(state,
                                   absl::ToChronoTime(std::min(deadline, now + kConnectPoll)));
    state = p->channel->GetState(/*try_to_connect=*/true);
  }
  NewStream(p);
  return absl::OkStatus();
}

absl::Status GrpcTransport::StreamError(Peer* p, const std::string& what) {
  const grpc::Status st = EndStream(p);
  const grpc_connectivity_state state = p->channel->GetState(false);
  MutexLock lock(mu_);
  if (!aborted_.ok()) return aborted_;
  if (!p->cancel_reason.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": ", p->cancel_reason));
  }
  const grpc::StatusCode code = st.ok() ? grpc::StatusCode::UNKNOWN : st.error_code();
  const std::string reason = absl::StrCat(
      CodeName(code), ": ", st.ok() ? "the receiver ended the stream early" : st.error_message(),
      " (connection ", StateName(state), ")");
  // Every tensor on this stream that gRPC had not put on the wire yet is lost with it.
  FailPeerLocked(p, static_cast<absl::StatusCode>(code), reason);
  return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat(what, ": ", reason));
}

void GrpcTransport::CloseStream(Peer* p, absl::Time deadline, const baton::v1::TensorFrame* last) {
  if (!p->stream) return;
  SetWriteDeadline(p, deadline);
  bool ok;
  {
    MutexLock lock(mu_);
    p->stream->closing = true;
    ok = !p->stream->done;
  }
  if (ok && last != nullptr) ok = p->stream->writer->Write(SerializeFrame(*last));
  if (ok) p->stream->writer->WritesDone();
  EndStream(p);
}

absl::Status GrpcTransport::SendItem(Peer* p, Item& item) {
  const std::string& what = item.state->what;
  if (p->stream) {
    bool done;
    {
      MutexLock lock(mu_);
      done = p->stream->done;
    }
    if (done) EndStream(p);  // ended cleanly by the receiver; start another
  }
  const bool fresh = !p->stream;
  if (fresh) {
    absl::Status s = OpenStream(p, item.deadline);
    if (!s.ok()) return s;
    // If the connection is not up by the deadline, the first write is one last try: give
    // it a moment to come back with gRPC's reason.
    SetWriteDeadline(p, std::max(item.deadline, absl::Now() + kGoodbyeGrace));
  } else {
    SetWriteDeadline(p, item.deadline);
  }
  grpc::ClientWriter<grpc::ByteBuffer>* writer = p->stream->writer.get();
  const size_t total = item.tensor.nbytes();
  const size_t chunk = static_cast<size_t>(
      std::clamp<int64_t>(options_.chunk_bytes, int64_t{4} << 10, int64_t{32} << 20));
  const char* data = static_cast<const char*>(item.tensor.raw());
  const baton::v1::TensorHeader header = MakeHeader(options_.rank, item.tag, item.tensor);
  auto payload = std::make_shared<Payload>(std::move(item.tensor), item.state);
  // The header carries the first chunk: a tensor up to the chunk size is one message.
  size_t off = std::min(chunk, total);
  if (!writer->Write(HeaderFrame(header, data, off, payload))) return StreamError(p, what);
  if (fresh) StartFinisher(p);
  for (; off < total; off += chunk) {
    {
      MutexLock lock(mu_);
      if (!aborted_.ok()) return aborted_;  // the stream is closed with an abort frame next
    }
    const size_t n = std::min(chunk, total - off);
    if (!writer->Write(ChunkFrame(data + off, n, payload))) return StreamError(p, what);
  }
  MutexLock lock(mu_);
  p->write_deadline = absl::InfiniteFuture();
  p->last_sent = item.tag.ToString();
  ++p->counters.tensors_sent;
  p->counters.bytes_sent += static_cast<int64_t>(total);
  return absl::OkStatus();
}

void GrpcTransport::SendAbortNotice(Peer* p, const absl::Status& aborted) {
  // Tell the peer, so that its receives fail now instead of at their deadline.
  baton::v1::TensorFrame notice;
  notice.mutable_abort()->set_job_key(options_.job_key);
  notice.mutable_abort()->set_source_rank(options_.rank);
  notice.mutable_abort()->set_reason(std::string(aborted.message()));
  const absl::Time deadline = absl::Now() + kGoodbyeGrace;
  if (p->stream) {
    bool done;
    {
      MutexLock lock(mu_);
      done = p->stream->done;
    }
    if (done) EndStream(p);
  }
  if (!p->stream) {
    // Connect only if that can be done at once: the peer may be the one that is gone.
    if (!p->channel->WaitForConnected(absl::ToChronoTime(deadline))) return;
    NewStream(p);
  }
  CloseStream(p, deadline, &notice);
}

void GrpcTransport::SenderLoop(Peer* p) {
  while (true) {
    std::optional<Item> item;
    std::vector<Item> dropped;
    absl::Status drop_status;
    bool abort_now = false;
    {
      MutexLock lock(mu_);
      p->wake.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !p->queue.empty() || stopping_ || !aborted_.ok();
      });
      if (!aborted_.ok()) {
        abort_now = true;
        drop_status = aborted_;
        for (Item& i : p->queue) dropped.push_back(std::move(i));
        p->queue.clear();
      } else if (!p->queue.empty()) {
        item = std::move(p->queue.front());
        p->queue.pop_front();
        if (!p->failed.ok()) {
          drop_status = p->failed;
          dropped.push_back(*std::move(item));
          item.reset();
        } else if (stopping_) {
          item->deadline = std::min(item->deadline, shutdown_deadline_);
        }
      }
    }
    for (Item& i : dropped) i.state->Finish(drop_status);
    if (abort_now) {
      SendAbortNotice(p, drop_status);
      return;
    }
    if (!item) {
      if (!dropped.empty()) continue;
      // Stopping with nothing left to send: close the stream politely.
      absl::Time deadline;
      {
        MutexLock lock(mu_);
        deadline = shutdown_deadline_;
      }
      CloseStream(p, deadline, nullptr);
      return;
    }
    std::shared_ptr<SendState> state = item->state;
    if (state->IsFinished()) continue;  // failed while queued
    absl::Status s = SendItem(p, *item);
    if (s.ok()) {
      state->MarkWritten();
      continue;
    }
    {
      MutexLock lock(mu_);
      if (aborted_.ok() && p->failed.ok()) p->failed = s;
    }
    state->Finish(s);  // if nothing failed it already
  }
}

}  // namespace baton

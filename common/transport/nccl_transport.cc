#include "common/transport/nccl_transport.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/cuda_context.h"
#include "common/core/status.h"
#include "common/core/mutex.h"

namespace baton {

using nccl_internal::DecodeHeader;
using nccl_internal::EncodeHeader;
using nccl_internal::Header;
using nccl_internal::kHeaderBytes;
using nccl_internal::kMaxDims;

namespace {

// --- The wire header -------------------------------------------------------------------

constexpr uint32_t kMagic = 0x4e544142;  // "BATN" in memory order on little-endian hosts
constexpr uint32_t kWireVersion = 1;
constexpr uint8_t kHelloKind = 0xff;

// Both ends run the same build on the same architecture, so the header is this struct's
// bytes; it has no padding, and the checksum covers everything before it.
struct Wire {
  uint32_t magic;
  uint32_t version;
  uint64_t job;
  int64_t step;
  int32_t microbatch;
  int32_t stage;
  uint8_t kind;  // TensorKind, or kHelloKind
  uint8_t dtype;
  uint8_t defined;
  uint8_t ndims;
  int32_t source_rank;
  int64_t dims[kMaxDims];
  uint64_t nbytes;
  uint64_t checksum;
};
static_assert(std::is_trivially_copyable_v<Wire>);
static_assert(sizeof(Wire) == 120 && sizeof(Wire) <= kHeaderBytes, "no padding, fits");

uint64_t Fnv1a(const void* p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// --- Helpers ---------------------------------------------------------------------------

// Polls fast at first (yielding), then backs off to `max` between polls.
class Backoff {
 public:
  explicit Backoff(absl::Duration max) : max_(std::max(max, absl::Microseconds(1))) {}
  absl::Duration Next() {
    if (spins_ < 16) {
      ++spins_;
      return absl::ZeroDuration();
    }
    next_ = next_ == absl::ZeroDuration() ? absl::Microseconds(2) : std::min(next_ * 2, max_);
    return next_;
  }

 private:
  const absl::Duration max_;
  int spins_ = 0;
  absl::Duration next_ = absl::ZeroDuration();
};

// condition_variable::wait_for adds the duration to now(): keep it finite.
std::chrono::nanoseconds WaitFor(absl::Duration d) {
  return absl::ToChronoNanoseconds(std::clamp(d, absl::ZeroDuration(), absl::Hours(1)));
}

// Deadlines far in the future (InfiniteFuture) become a year from now, so that they convert
// to clock time points without overflow.
absl::Time Clamp(absl::Time deadline) {
  return std::min(deadline, absl::Now() + absl::Hours(24 * 365));
}

void NameThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

// NCCL results as status codes: a system or remote error is the network's or the peer's
// (retryable elsewhere: UNAVAILABLE); the rest are bugs or broken devices (INTERNAL).
absl::StatusCode CodeOf(NcclResult r) {
  switch (r) {
    case NcclResult::kSystemError:
    case NcclResult::kRemoteError:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

// --- nccl_internal -----------------------------------------------------------------------

namespace nccl_internal {

Header TensorHeader(int source_rank, const TensorTag& tag, const Tensor& t) {
  Header h;
  h.tag = tag;
  h.source_rank = source_rank;
  h.defined = t.defined();
  h.dtype = t.dtype();
  h.shape = t.shape();
  h.nbytes = t.defined() ? t.nbytes() : 0;
  return h;
}

void EncodeHeader(const Header& h, void* out) {
  Wire w;
  std::memset(&w, 0, sizeof(w));
  w.magic = kMagic;
  w.version = kWireVersion;
  w.job = h.tag.job;
  w.step = h.tag.step;
  w.microbatch = h.tag.microbatch;
  w.stage = h.tag.stage;
  w.kind = h.hello ? kHelloKind : static_cast<uint8_t>(h.tag.kind);
  w.dtype = static_cast<uint8_t>(h.dtype);
  w.defined = h.defined ? 1 : 0;
  w.ndims = static_cast<uint8_t>(std::min<size_t>(h.shape.size(), kMaxDims));
  w.source_rank = h.source_rank;
  for (int i = 0; i < w.ndims; ++i) w.dims[i] = h.shape[i];
  w.nbytes = h.nbytes;
  w.checksum = Fnv1a(&w, offsetof(Wire, checksum));
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, &w, sizeof(w));
}

absl::StatusOr<Header> DecodeHeader(const void* in) {
  Wire w;
  std::memcpy(&w, in, sizeof(w));
  if (w.magic != kMagic) {
    return absl::DataLossError(
        absl::StrCat("not a baton tensor header (magic 0x", absl::Hex(w.magic), ")"));
  }
  if (w.version != kWireVersion) {
    return absl::DataLossError(
        absl::StrCat("tensor header version ", w.version, "; this build speaks ", kWireVersion));
  }
  if (w.checksum != Fnv1a(&w, offsetof(Wire, checksum))) {
    return absl::DataLossError("tensor header checksum mismatch");
  }
  Header h;
  h.hello = w.kind == kHelloKind;
  if (!h.hello && w.kind != static_cast<uint8_t>(TensorKind::kActivation) &&
      w.kind != static_cast<uint8_t>(TensorKind::kGradient) &&
      w.kind != static_cast<uint8_t>(TensorKind::kTiedGradient) &&
      w.kind != static_cast<uint8_t>(TensorKind::kGradNorm)) {
    return absl::DataLossError(absl::StrCat("tensor header with kind ", w.kind));
  }
  h.tag.job = w.job;
  h.tag.step = w.step;
  h.tag.microbatch = w.microbatch;
  h.tag.stage = w.stage;
  h.tag.kind = h.hello ? TensorKind::kActivation : static_cast<TensorKind>(w.kind);
  h.source_rank = w.source_rank;
  h.defined = w.defined != 0;
  if (w.dtype != static_cast<uint8_t>(DType::kFloat32) &&
      w.dtype != static_cast<uint8_t>(DType::kInt32) &&
      w.dtype != static_cast<uint8_t>(DType::kBFloat16)) {
    return absl::DataLossError(absl::StrCat("tensor header with dtype ", w.dtype));
  }
  h.dtype = static_cast<DType>(w.dtype);
  if (w.ndims > kMaxDims) {
    return absl::DataLossError(absl::StrCat("tensor header with ", w.ndims, " dims"));
  }
  // Bounded so that no product overflows: 2^50 elements is far beyond any device.
  constexpr int64_t kMaxElements = int64_t{1} << 50;
  int64_t elements = 1;
  for (int i = 0; i < w.ndims; ++i) {
    if (w.dims[i] < 0 || w.dims[i] > kMaxElements ||
        (w.dims[i] > 0 && elements > kMaxElements / w.dims[i])) {
      return absl::DataLossError(absl::StrCat("tensor header with dim ", w.dims[i]));
    }
    elements *= w.dims[i];
    h.shape.push_back(w.dims[i]);
  }
  h.nbytes = w.nbytes;
  const uint64_t expected = h.defined && !h.hello
                                ? static_cast<uint64_t>(NumElements(h.shape)) * DTypeSize(h.dtype)
                                : 0;  // no payload follows a hello or an undefined tensor
  if (h.nbytes != expected) {
    return absl::DataLossError(absl::StrCat(
        "tensor header announces ", h.nbytes, " bytes for ", DTypeName(h.dtype),
        ShapeString(h.shape), h.defined ? "" : " (undefined)", ", which has ", expected));
  }
  return h;
}

std::string EdgeKey(uint64_t job_key, int64_t attempt, int src, int dst) {
  return absl::StrCat("baton/nccl/job/", job_key, "/attempt/", attempt, "/", src, "->", dst);
}

}  // namespace nccl_internal

// --- InMemoryNcclIdExchange -------------------------------------------------------------

absl::Status InMemoryNcclIdExchange::Publish(const std::string& key, const NcclUniqueId& id) {
  MutexLock lock(mu_);
  auto [it, inserted] = ids_.emplace(key, id);
  if (!inserted && !(it->second == id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("another NCCL id was already published under ", key));
  }
  published_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<NcclUniqueId> InMemoryNcclIdExchange::Fetch(const std::string& key,
                                                           absl::Time deadline) {
  MutexLock lock(mu_);
  while (true) {
    auto it = ids_.find(key);
    if (it != ids_.end()) return it->second;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no NCCL id was published under ", key, " by the deadline"));
    }
    published_.wait_for(lock.native(), WaitFor(deadline - now));
  }
}

// --- The transport's pieces -------------------------------------------------------------

// One direction between this rank and a peer, with its communicator and comm stream.
struct NcclTransport::Edge {
  int peer = 0;
  bool send = false;       // this rank -> peer, else peer -> this rank
  std::string name;        // "rank 0 -> rank 1"
  std::string key;         // nccl_internal::EdgeKey
  int peer_comm_rank = 0;  // the peer's rank in the two-rank communicator
  int comm_rank = 0;
  // Fixed after bring-up.
  CudaStream stream = nullptr;
  char* dev_headers = nullptr;   // slots * kHeaderBytes of device memory (NCCL's side)
  char* host_headers = nullptr;  // the same in pinned host memory (the host's side)
  int slots = 0;
  CudaEvent header_event = nullptr;   // receiving side (and the bring-up hello)
  CudaEvent alloc_event = nullptr;    // receiving side
  CudaEvent payload_event = nullptr;  // receiving side

  // NCCL calls on the communicator never overlap (NCCL's rule) and never race its abort.
  Mutex comm_mu;
  NcclComm comm ABSL_GUARDED_BY(comm_mu) = nullptr;

  // Guarded by the transport's mu_.
  absl::Status failed;           // sticky; its message names the edge
  std::condition_variable wake;  // the sender thread's
  std::deque<SendItem> queue;    // accepted sends the sender thread has not taken
  std::vector<std::shared_ptr<SendState>> inflight;  // accepted, not known to be finished
  std::vector<Tensor> quarantine;                    // memory an aborted operation may still touch

  // The sender thread's own.
  std::thread thread;
  uint64_t next_slot = 0;
  std::vector<std::shared_ptr<SendState>> slot_owner;  // the last send that used each slot

  // Receives run one at a time (held across a whole Recv, taken with a deadline). A plain
  // std::timed_mutex, not baton::Mutex: it guards no member, only the turn, and the
  // analysis cannot follow a lock taken with try_lock_until.
  std::timed_mutex recv_mu;
};

// One Send's life, shared by its SendWork, the sender thread and the edge.
struct NcclTransport::SendState {
  SendState(Edge* e, std::string w, std::string t, Tensor x)
      : edge(e), what(std::move(w)), tag(std::move(t)), tensor(std::move(x)) {}
  Edge* const edge;
  const std::string what;  // "rank R: sending <tag> to rank P"
  const std::string tag;
  std::array<char, kHeaderBytes> header{};  // encoded by Send

  Mutex mu;
  Tensor tensor ABSL_GUARDED_BY(mu);             // kept alive until finished
  CudaEvent done ABSL_GUARDED_BY(mu) = nullptr;  // recorded after the payload, once enqueued
  bool finished ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
};

struct NcclTransport::SendItem {
  std::shared_ptr<SendState> state;
  Tensor tensor;              // the sender thread's handle while it enqueues
  CudaEvent ready = nullptr;  // recorded on the compute stream by Send
};

class NcclTransport::Work final : public SendWork {
 public:
  Work(NcclTransport* t, std::shared_ptr<SendState> st) : t_(t), st_(std::move(st)) {}
  absl::Status Wait(absl::Time deadline) override {
    {
      MutexLock lock(st_->mu);
      if (st_->finished) return st_->status;  // also once the transport is gone
    }
    return t_->WaitSend(*st_->edge, *st_, deadline);
  }
  bool IsCompleted() override {
    {
      MutexLock lock(st_->mu);
      if (st_->finished) return true;
    }
    if (t_->PollSend(*st_->edge, *st_)) return true;
    (void)t_->CheckEdge(*st_->edge, st_->what);  // an asynchronous error finishes it
    MutexLock lock(st_->mu);
    return st_->finished;
  }

 private:
  NcclTransport* const t_;
  const std::shared_ptr<SendState> st_;
};

// --- Creation and bring-up ---------------------------------------------------------------

NcclTransport::NcclTransport(Options options)
    : options_(std::move(options)),
      api_(options_.api),
      compute_(reinterpret_cast<CudaStream>(options_.compute_stream)) {
  AddLiveNcclCommunicators(1);  // until the destructor has closed them all
  for (int peer : options_.peers) {
    for (bool send : {true, false}) {
      auto e = std::make_unique<Edge>();
      e->peer = peer;
      e->send = send;
      const int src = send ? options_.rank : peer;
      const int dst = send ? peer : options_.rank;
      e->name = absl::StrCat("rank ", src, " -> rank ", dst);
      e->key = nccl_internal::EdgeKey(options_.job_key, options_.attempt, src, dst);
      // The lower pipeline rank is rank 0 of the two-rank communicator.
      e->comm_rank = options_.rank < peer ? 0 : 1;
      e->peer_comm_rank = 1 - e->comm_rank;
      e->slots = send ? options_.max_sends_in_flight : 1;
      e->slot_owner.resize(e->slots);
      edges_.push_back(std::move(e));
    }
  }
  // One global order for bringing communicators up, the same on every rank: by the pair's
  // lower rank, then its higher rank, then the lower rank's send first. A blocking
  // ncclCommInitRank (NCCL_COMM_BLOCKING=1 in the environment overrides the config) waits
  // for the peer's matching call: ranks that went in different orders would wait for each
  // other forever.
  std::sort(edges_.begin(), edges_.end(), [this](const auto& a, const auto& b) {
    auto key = [this](const Edge& e) {
      const int src = e.send ? options_.rank : e.peer;
      const int dst = e.send ? e.peer : options_.rank;
      return std::make_tuple(std::min(src, dst), std::max(src, dst), src > dst);
    };
    return key(*a) < key(*b);
  });
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    Options options, std::vector<int>* failed_peers) {
  if (failed_peers != nullptr) failed_peers->clear();
  const auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", options.rank, " cannot start: ", why));
  };
  if (options.api == nullptr) return invalid("no NcclApi");
  if (options.ids == nullptr) return invalid("no NcclIdExchange");
  if (options.compute_stream == nullptr) {
    return invalid("no compute stream (the default stream will not do)");
  }
  if (options.num_ranks < 1 || options.rank < 0 || options.rank >= options.num_ranks) {
    return invalid(absl::StrCat("rank ", options.rank, " of ", options.num_ranks));
  }
  if (options.max_sends_in_flight < 1) return invalid("max_sends_in_flight must be positive");
  std::vector<int> seen;
  for (int p : options.peers) {
    if (p < 0 || p >= options.num_ranks || p == options.rank ||
        std::find(seen.begin(), seen.end(), p) != seen.end()) {
      return invalid(absl::StrCat("bad peer list [", absl::StrJoin(options.peers, ","), "]"));
    }
    seen.push_back(p);
  }
  std::unique_ptr<NcclTransport> t(new NcclTransport(std::move(options)));
  BATON_RETURN_IF_ERROR(t->BringUp(failed_peers));  // on failure t cleans up as it goes
  for (auto& e : t->edges_) {
    if (e->send) {
      Edge* edge = e.get();
      NcclTransport* self = t.get();
      e->thread = std::thread([self, edge] {
        NameThread(absl::StrCat("nccl", self->options_.rank, "-", edge->peer));
        self->SenderLoop(edge);
      });
    }
  }
  return t;
}

absl::Status NcclTransport::BringUp(std::vector<int>* failed_peers) {
  const int me = options_.rank;
  const int device = options_.cuda_device;
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  const auto setup_error = [&](const Edge& e, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("nccl: rank ", me, ": setting up the edge ", e.name,
                                               ": ", s.message()));
  };
  if (absl::Status s = api_->SetDevice(device); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("nccl: rank ", me, ": ", s.message()));
  }
  for (auto& e : edges_) {
    absl::StatusOr<CudaStream> stream = api_->StreamCreate(device);
    if (!stream.ok()) return setup_error(*e, stream.status());
    e->stream = *stream;
    const size_t bytes = static_cast<size_t>(e->slots) * kHeaderBytes;
    absl::StatusOr<void*> dev = api_->DeviceAlloc(bytes, device);
    if (!dev.ok()) return setup_error(*e, dev.status());
    e->dev_headers = static_cast<char*>(*dev);
    absl::StatusOr<void*> host = api_->HostAlloc(bytes);
    if (!host.ok()) return setup_error(*e, host.status());
    e->host_headers = static_cast<char*>(*host);
    for (CudaEvent* ev : {&e->header_event, &e->alloc_event, &e->payload_event}) {
      absl::StatusOr<CudaEvent> made = api_->EventCreate(device);
      if (!made.ok()) return setup_error(*e, made.status());
      *ev = *made;
    }
  }

  // Each edge goes through these stages; all edges advance together.
  enum class Stage { kFetch, kInit, kPost, kPosting, kPosted, kFlying, kReady, kFailed };
  struct Progress {
    Stage stage = Stage::kFetch;
    absl::Status error;
    NcclUniqueId id;
  };
  std::vector<Progress> progress(edges_.size());
  const auto fail = [&](size_t i, absl::StatusCode code, const std::string& why) {
    progress[i].stage = Stage::kFailed;
    progress[i].error =
        absl::Status(code, absl::StrCat("the NCCL communicator ", edges_[i]->name, " ", why));
  };
  const auto nccl_failed = [&](size_t i, const char* call, NcclResult r, NcclComm comm) {
    fail(i, CodeOf(r), absl::StrCat("failed: ", call, ": ", NcclReason(*edges_[i], r, comm)));
  };

  // The lower rank of each pair creates and publishes the ids of both directions.
  for (size_t i = 0; i < edges_.size(); ++i) {
    Edge& e = *edges_[i];
    if (me > e.peer) continue;
    const NcclResult r = api_->GetUniqueId(&progress[i].id);
    if (r != NcclResult::kSuccess) {
      nccl_failed(i, "ncclGetUniqueId", r, nullptr);
      continue;
    }
    if (absl::Status s = options_.ids->Publish(e.key, progress[i].id); !s.ok()) {
      fail(i, s.code(), absl::StrCat("could not publish its id: ", s.message()));
    }
  }
  // The higher rank fetches them (all publishing came first on every rank: no deadlock).
  for (size_t i = 0; i < edges_.size(); ++i) {
    Edge& e = *edges_[i];
    if (progress[i].stage == Stage::kFailed) continue;
    if (me > e.peer) {
      absl::StatusOr<NcclUniqueId> id = options_.ids->Fetch(e.key, deadline);
      if (!id.ok()) {
        fail(i, id.status().code(),
             absl::StrCat(id.status().code() == absl::StatusCode::kDeadlineExceeded
                              ? absl::StrCat("did not come up within ",
                                             absl::FormatDuration(options_.init_timeout), " (rank ",
                                             e.peer, " published no id for it): ")
                              : "could not get its id: ",
                          id.status().message()));
        continue;
      }
      progress[i].id = *id;
    }
    NcclComm comm = nullptr;
    const NcclResult r = api_->CommInitRank(&comm, 2, progress[i].id, e.comm_rank, device);
    {
      MutexLock lock(e.comm_mu);
      e.comm = comm;
    }
    if (r != NcclResult::kSuccess && r != NcclResult::kInProgress) {
      nccl_failed(i, "ncclCommInitRankConfig", r, comm);
    } else {
      progress[i].stage = Stage::kInit;
    }
  }

  // Poll every edge forward: ready, handshake posted and enqueued, hello through.
  const auto advance = [&](size_t i) {
    Edge& e = *edges_[i];
    Progress& p = progress[i];
    MutexLock lock(e.comm_mu);
    char* host = e.host_headers;
    char* dev = e.dev_headers;
    // True when the comm is no longer in progress.
    const auto poll = [&](const char* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e.comm_mu) {
      NcclResult state = NcclResult::kSuccess;
      const NcclResult r = api_->CommGetAsyncError(e.comm, &state);
      if (r != NcclResult::kSuccess) state = r;
      if (state == NcclResult::kInProgress) return false;
      if (state != NcclResult::kSuccess) nccl_failed(i, call, state, e.comm);
      return true;
    };
    while (true) {
      switch (p.stage) {
        case Stage::kInit:
          if (!poll("ncclCommInitRankConfig")) return;
          if (p.stage == Stage::kFailed) return;
          p.stage = Stage::kPost;
          break;
        case Stage::kPost: {
          NcclResult r;
          if (e.send) {
            Header hello;
            hello.hello = true;
            hello.tag.job = options_.job_key;
            hello.tag.step = options_.attempt;
            hello.source_rank = me;
            EncodeHeader(hello, host);
            if (absl::Status s = api_->MemcpyAsync(dev, host, kHeaderBytes, e.stream); !s.ok()) {
              fail(i, s.code(), absl::StrCat("failed: ", s.message()));
              return;
            }
            r = api_->Send(dev, kHeaderBytes, e.peer_comm_rank, e.comm, e.stream);
          } else {
            r = api_->Recv(dev, kHeaderBytes, e.peer_comm_rank, e.comm, e.stream);
          }
          if (r == NcclResult::kInProgress) {
            p.stage = Stage::kPosting;
          } else if (r == NcclResult::kSuccess) {
            p.stage = Stage::kPosted;
          } else {
            nccl_failed(i, e.send ? "ncclSend" : "ncclRecv", r, e.comm);
            return;
          }
          break;
        }
        case Stage::kPosting:
          if (!poll(e.send ? "ncclSend" : "ncclRecv")) return;
          if (p.stage == Stage::kFailed) return;
          p.stage = Stage::kPosted;
          break;
        case Stage::kPosted: {
          absl::Status s;
          if (!e.send) s = api_->MemcpyAsync(host, dev, kHeaderBytes, e.stream);
          if (s.ok()) s = api_->EventRecord(e.header_event, e.stream);
          if (!s.ok()) {
            fail(i, s.code(), absl::StrCat("failed: ", s.message()));
            return;
          }
          p.stage = Stage::kFlying;
          break;
        }
        case Stage::kFlying: {
          if (!poll("the handshake") || p.stage == Stage::kFailed) return;
          absl::StatusOr<bool> done = api_->EventQuery(e.header_event);
          if (!done.ok()) {
            fail(i, done.status().code(), absl::StrCat("failed: ", done.status().message()));
            return;
          }
          if (!*done) return;
          if (!e.send) {
            absl::StatusOr<Header> h = DecodeHeader(host);
            if (!h.ok()) {
              fail(i, h.status().code(),
                   absl::StrCat("got a corrupt handshake from rank ", e.peer, ": ",
                                h.status().message()));
              return;
            }
            if (!h->hello || h->tag.job != options_.job_key || h->tag.step != options_.attempt ||
                h->source_rank != e.peer) {
              // The job keys are not named: they are the jobs' secrets.
              fail(i, absl::StatusCode::kFailedPrecondition,
                   absl::StrCat("got a handshake from rank ", h->source_rank, " attempt ",
                                h->tag.step,
                                h->tag.job != options_.job_key ? " of another job" : "",
                                "; expected rank ", e.peer, " attempt ", options_.attempt,
                                " of this job"));
              return;
            }
          }
          p.stage = Stage::kReady;
          return;
        }
        default:
          return;
      }
    }
  };
  Backoff backoff(std::max(options_.max_poll_interval, absl::Milliseconds(1)));
  while (true) {
    bool busy = false;
    for (size_t i = 0; i < edges_.size(); ++i) {
      if (progress[i].stage == Stage::kReady || progress[i].stage == Stage::kFailed) continue;
      advance(i);
      busy |= progress[i].stage != Stage::kReady && progress[i].stage != Stage::kFailed;
    }
    if (!busy) break;
    if (absl::Now() >= deadline) {
      for (size_t i = 0; i < edges_.size(); ++i) {
        const Stage st = progress[i].stage;
        if (st == Stage::kReady || st == Stage::kFailed) continue;
        fail(i, absl::StatusCode::kDeadlineExceeded,
             absl::StrCat("did not come up within ", absl::FormatDuration(options_.init_timeout),
                          st == Stage::kInit
                              ? absl::StrCat(" (rank ", edges_[i]->peer, " has not joined it)")
                              : absl::StrCat(" (no handshake with rank ", edges_[i]->peer, ")")));
      }
      break;
    }
    const absl::Duration nap = backoff.Next();
    if (nap > absl::ZeroDuration()) {
      std::this_thread::sleep_for(WaitFor(nap));
    } else {
      std::this_thread::yield();
    }
  }

  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::vector<int> peers;
  for (size_t i = 0; i < edges_.size(); ++i) {
    if (progress[i].stage != Stage::kFailed) continue;
    Edge& e = *edges_[i];
    {
      MutexLock lock(mu_);
      e.failed = progress[i].error;
    }
    AbortComm(e);
    if (code == absl::StatusCode::kOk) code = progress[i].error.code();
    errors.emplace_back(progress[i].error.message());
    if (std::find(peers.begin(), peers.end(), e.peer) == peers.end()) peers.push_back(e.peer);
  }
  if (errors.empty()) return absl::OkStatus();
  std::sort(peers.begin(), peers.end());
  if (failed_peers != nullptr) *failed_peers = peers;
  return absl::Status(code, absl::StrCat("nccl: rank ", me, ": ", absl::StrJoin(errors, "; ")));
}

// --- Teardown ---------------------------------------------------------------------------

NcclTransport::~NcclTransport() {
  std::vector<std::shared_ptr<SendState>> states;
  bool pending = false;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& e : edges_) {
      states.insert(states.end(), e->inflight.begin(), e->inflight.end());
      pending |= !e->queue.empty();
      e->wake.notify_all();
    }
    changed_.notify_all();
  }
  for (auto& st : states) pending |= !PollSend(*st->edge, *st);
  if (pending) {
    Abort(absl::FailedPreconditionError("the NCCL transport was destroyed with sends pending"));
  }
  for (auto& e : edges_) {
    if (e->thread.joinable()) e->thread.join();
  }
  const absl::Time close_by = absl::Now() + options_.shutdown_timeout;
  for (auto& e : edges_) CloseComm(*e, close_by);

  // Nothing may free memory that the streams might still touch: wait for them to drain
  // (with every communicator gone, whatever NCCL had on them ends at once).
  const absl::Time drain_by = absl::Now() + options_.shutdown_timeout;
  bool drained = true;
  for (auto& e : edges_) {
    if (e->stream == nullptr) continue;
    absl::StatusOr<CudaEvent> ev = AcquireEvent();
    if (!ev.ok() || !api_->EventRecord(*ev, e->stream).ok()) {
      drained = false;
      continue;
    }
    Backoff backoff(absl::Milliseconds(1));
    while (true) {
      absl::StatusOr<bool> done = api_->EventQuery(*ev);
      if (!done.ok() || *done) {
        drained &= done.ok();
        break;
      }
      if (absl::Now() >= drain_by) {
        drained = false;
        break;
      }
      std::this_thread::sleep_for(WaitFor(backoff.Next()));
    }
  }
  for (auto& e : edges_) {
    std::vector<Tensor> quarantine;
    {
      MutexLock lock(mu_);
      quarantine.swap(e->quarantine);
    }
    if (drained) {
      // In the stream's order: cudaFree would wait for the whole device, so for another
      // communicator's kernels (the replicas' engine) that may wait for a peer.
      if (e->dev_headers != nullptr) {
        if (e->stream != nullptr) {
          (void)api_->DeviceFreeAsync(e->dev_headers, e->stream);
        } else {
          (void)api_->DeviceFree(e->dev_headers);
        }
      }
      if (e->host_headers != nullptr) (void)api_->HostFree(e->host_headers);
    } else if (!quarantine.empty()) {
      // A stream did not drain: an aborted operation may still write into these tensors.
      // Leak them (and the staging buffers) rather than let the allocator reuse them.
      new std::vector<Tensor>(std::move(quarantine));
    }
    if (e->stream != nullptr) (void)api_->StreamDestroy(e->stream);
    for (CudaEvent ev : {e->header_event, e->alloc_event, e->payload_event}) {
      if (ev != nullptr) (void)api_->EventDestroy(ev);
    }
  }
  std::vector<CudaEvent> events;
  {
    MutexLock lock(mu_);
    events.swap(all_events_);
    free_events_.clear();
  }
  for (CudaEvent ev : events) (void)api_->EventDestroy(ev);
  AddLiveNcclCommunicators(-1);
}

void NcclTransport::AbortComm(Edge& e) {
  MutexLock lock(e.comm_mu);
  if (e.comm == nullptr) return;
  (void)api_->CommAbort(e.comm);
  e.comm = nullptr;
}

void NcclTransport::CloseComm(Edge& e, absl::Time deadline) {
  bool healthy;
  {
    MutexLock lock(mu_);
    healthy = aborted_.ok() && e.failed.ok();
  }
  MutexLock lock(e.comm_mu);
  if (e.comm == nullptr) return;
  if (healthy) {
    // Let NCCL flush what it has (nothing, normally), bounded; then release it with
    // CommAbort, which unlike CommDestroy never waits for the peer.
    NcclResult r = api_->CommFinalize(e.comm);
    Backoff backoff(absl::Milliseconds(1));
    while (r == NcclResult::kInProgress && absl::Now() < deadline) {
      std::this_thread::sleep_for(WaitFor(backoff.Next()));
      NcclResult state = NcclResult::kSuccess;
      r = api_->CommGetAsyncError(e.comm, &state);
      if (r == NcclResult::kSuccess) r = state;
    }
  }
  (void)api_->CommAbort(e.comm);
  e.comm = nullptr;
}

// --- Shared machinery ---------------------------------------------------------------------

NcclTransport::Edge* NcclTransport::SendEdge(int peer) const {
  for (auto& e : edges_) {
    if (e->send && e->peer == peer) return e.get();
  }
  return nullptr;
}

NcclTransport::Edge* NcclTransport::RecvEdge(int peer) const {
  for (auto& e : edges_) {
    if (!e->send && e->peer == peer) return e.get();
  }
  return nullptr;
}

absl::StatusOr<CudaEvent> NcclTransport::AcquireEvent() {
  {
    MutexLock lock(mu_);
    if (!free_events_.empty()) {
      CudaEvent ev = free_events_.back();
      free_events_.pop_back();
      return ev;
    }
  }
  absl::StatusOr<CudaEvent> ev = api_->EventCreate(options_.cuda_device);
  if (!ev.ok()) return ev.status();
  MutexLock lock(mu_);
  all_events_.push_back(*ev);
  return *ev;
}

void NcclTransport::ReleaseEvent(CudaEvent ev) {
  MutexLock lock(mu_);
  free_events_.push_back(ev);
}

std::string NcclTransport::NcclReason(Edge& e, NcclResult r, NcclComm comm) {
  const std::string last = comm != nullptr ? api_->LastError(comm) : std::string();
  return absl::StrCat(api_->ErrorString(r), last.empty() ? "" : ": ", last);
}

void NcclTransport::Nap(absl::Duration d) {
  if (d <= absl::ZeroDuration()) {
    std::this_thread::yield();
    return;
  }
  MutexLock lock(mu_);
  if (!aborted_.ok()) return;
  changed_.wait_for(lock.native(), WaitFor(d));
}

absl::Status NcclTransport::Flags(const Edge& e, const std::string& what) {
  MutexLock lock(mu_);
  if (!aborted_.ok()) return aborted_;
  if (!e.failed.ok()) {
    return absl::Status(e.failed.code(),
                        absl::StrCat(what, ": failed earlier: ", e.failed.message()));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::CheckEdge(Edge& e, const std::string& what) {
  BATON_RETURN_IF_ERROR(Flags(e, what));
  NcclResult state = NcclResult::kSuccess;
  std::string reason;
  {
    MutexLock lock(e.comm_mu);
    if (e.comm != nullptr) {
      const NcclResult r = api_->CommGetAsyncError(e.comm, &state);
      if (r != NcclResult::kSuccess) state = r;
      if (state != NcclResult::kSuccess && state != NcclResult::kInProgress) {
        reason = absl::StrCat("NCCL error on the communicator ", e.name, ": ",
                              NcclReason(e, state, e.comm));
      }
    }
  }
  if (reason.empty()) return Flags(e, what);  // also when the communicator was just aborted
  Fatal(e, CodeOf(state), reason);
  return absl::Status(CodeOf(state), absl::StrCat(what, ": ", reason));
}

void NcclTransport::FailEdge(Edge& e, absl::StatusCode code, const std::string& reason) {
  std::vector<std::shared_ptr<SendState>> states;
  {
    MutexLock lock(mu_);
    if (e.failed.ok()) e.failed = absl::Status(code, reason);
    states.swap(e.inflight);
    e.wake.notify_all();
    changed_.notify_all();
  }
  // The sends first, then the communicator: once it is aborted its operations "complete"
  // without their data, and a send must not be taken for delivered then.
  for (auto& st : states) FinishSend(*st, absl::Status(code, absl::StrCat(st->what, ": ", reason)));
  AbortComm(e);
}

void NcclTransport::Fatal(Edge& e, absl::StatusCode code, const std::string& reason) {
  FailEdge(e, code, reason);
  Abort(absl::Status(code, reason));
}

void NcclTransport::Abort(const absl::Status& reason) {
  std::vector<std::shared_ptr<SendState>> states;
  absl::Status aborted;
  {
    MutexLock lock(mu_);
    if (!aborted_.ok()) return;  // the first reason wins
    aborted_ =
        absl::AbortedError(absl::StrCat("rank ", options_.rank, " aborted: ", reason.message()));
    aborted = aborted_;
    for (auto& e : edges_) {
      states.insert(states.end(), e->inflight.begin(), e->inflight.end());
      e->inflight.clear();
      e->wake.notify_all();
    }
    changed_.notify_all();
  }
  for (auto& st : states) FinishSend(*st, aborted);  // before the communicators: see FailEdge
  for (auto& e : edges_) AbortComm(*e);
}

absl::StatusOr<bool> NcclTransport::Issue(Edge& e, const std::string& what, const char* call,
                                          const std::function<NcclResult(NcclComm)>& op,
                                          absl::Time deadline) {
  NcclResult r;
  std::string reason;
  {
    MutexLock lock(e.comm_mu);
    r = e.comm == nullptr ? NcclResult::kInvalidUsage : op(e.comm);
    if (e.comm == nullptr) reason = absl::StrCat("the communicator ", e.name, " is gone");
    if (r == NcclResult::kSuccess) return true;
    if (r != NcclResult::kInProgress && reason.empty()) {
      reason = absl::StrCat(call, " on the communicator ", e.name,
                            " failed: ", NcclReason(e, r, e.comm));
    }
  }
  if (!reason.empty()) BATON_RETURN_IF_ERROR(Flags(e, what));  // an abort explains it best
  // Non-blocking communicator: the call is under way; poll until NCCL has enqueued it.
  Backoff backoff(options_.max_poll_interval);
  while (reason.empty()) {
    BATON_RETURN_IF_ERROR(Flags(e, what));
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    Nap(std::min(backoff.Next(), deadline - now));
    MutexLock lock(e.comm_mu);
    if (e.comm == nullptr) continue;  // aborted: Flags says so next
    NcclResult state = NcclResult::kSuccess;
    r = api_->CommGetAsyncError(e.comm, &state);
    if (r == NcclResult::kSuccess) r = state;
    if (r == NcclResult::kSuccess) return true;
    if (r != NcclResult::kInProgress) {
      reason = absl::StrCat(call, " on the communicator ", e.name,
                            " failed: ", NcclReason(e, r, e.comm));
    }
  }
  Fatal(e, CodeOf(r), reason);
  return absl::Status(CodeOf(r), absl::StrCat(what, ": ", reason));
}

absl::StatusOr<bool> NcclTransport::Await(Edge& e, const std::string& what, absl::Time deadline,
                                          const std::function<absl::StatusOr<bool>()>& done) {
  Backoff backoff(options_.max_poll_interval);
  while (true) {
    const absl::StatusOr<bool> d = done();
    if (!d.ok()) {
      const std::string reason =
          absl::StrCat(d.status().message(), " (on the communicator ", e.name, ")");
      Fatal(e, absl::StatusCode::kInternal, reason);
      return absl::InternalError(absl::StrCat(what, ": ", reason));
    }
    // Checked after done(): an operation that completed because its communicator was
    // aborted (which sets the flags first) is not taken for a success.
    BATON_RETURN_IF_ERROR(CheckEdge(e, what));
    if (*d) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    Nap(std::min(backoff.Next(), deadline - now));
  }
}

// --- Sending ------------------------------------------------------------------------------

std::unique_ptr<SendWork> NcclTransport::Send(int peer, const TensorTag& tag, const Tensor& t) {
  Edge* e = SendEdge(peer);
  if (e == nullptr) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", options_.rank, " cannot send ", tag.ToString(), " to rank ",
                     peer, ": not one of its peers")));
  }
  const std::string what =
      absl::StrCat("rank ", options_.rank, ": sending ", tag.ToString(), " to rank ", peer);
  if (tag.job != options_.job_key) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat(what, ": the tag's job key is not this transport's")));
  }
  if (t.defined() && t.device() != api_->device()) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat(what, ": the tensor is on ", DeviceName(t.device()), "; this transport (",
                     api_->Describe(), ") sends ", DeviceName(api_->device()), " tensors")));
  }
  if (t.rank() > kMaxDims) {
    return CompletedSend(absl::InvalidArgumentError(
        absl::StrCat(what, ": ", t.rank(), " dims (at most ", kMaxDims, ")")));
  }
  auto st = std::make_shared<SendState>(e, what, tag.ToString(), t);
  EncodeHeader(nccl_internal::TensorHeader(options_.rank, tag, t), st->header.data());
  // Now, not later on the sender thread: the tensor is what the kernels issued before this
  // call made it.
  absl::StatusOr<CudaEvent> ready = AcquireEvent();
  if (!ready.ok()) {
    return CompletedSend(
        absl::Status(ready.status().code(), absl::StrCat(what, ": ", ready.status().message())));
  }
  if (absl::Status s = api_->EventRecord(*ready, compute_); !s.ok()) {
    ReleaseEvent(*ready);
    return CompletedSend(absl::Status(s.code(), absl::StrCat(what, ": ", s.message())));
  }
  {
    MutexLock lock(mu_);
    absl::Status refused;
    if (!aborted_.ok()) {
      refused = aborted_;
    } else if (!e->failed.ok()) {
      refused = absl::Status(e->failed.code(),
                             absl::StrCat(what, ": failed earlier: ", e->failed.message()));
    } else if (stopping_) {
      refused = absl::FailedPreconditionError(absl::StrCat(what, ": the transport is closing"));
    }
    if (!refused.ok()) {
      free_events_.push_back(*ready);
      return CompletedSend(refused);
    }
    if (e->inflight.size() >= 2 * static_cast<size_t>(options_.max_sends_in_flight)) {
      std::erase_if(e->inflight, [](const std::shared_ptr<SendState>& s) {
        MutexLock l(s->mu);
        return s->finished;
      });
    }
    e->inflight.push_back(st);
    e->queue.push_back(SendItem{st, t, *ready});
    e->wake.notify_all();
  }
  return std::make_unique<Work>(this, std::move(st));
}

void NcclTransport::SenderLoop(Edge* e) {
  (void)api_->SetDevice(options_.cuda_device);
  while (true) {
    SendItem item;
    {
      MutexLock lock(mu_);
      e->wake.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !e->queue.empty() || stopping_ || !aborted_.ok() || !e->failed.ok();
      });
      if (e->queue.empty()) return;  // closing, aborted or failed, with nothing left
      item = std::move(e->queue.front());
      e->queue.pop_front();
    }
    absl::Status s = Flags(*e, item.state->what);
    if (s.ok()) s = SendOne(*e, item);
    if (item.ready != nullptr) ReleaseEvent(item.ready);
    if (!s.ok()) FinishSend(*item.state, s);
  }
}

absl::Status NcclTransport::SendOne(Edge& e, SendItem& item) {
  SendState& st = *item.state;
  // A staging slot for the header: the send that used it last must be complete (sends on
  // an edge complete in order, so this bounds the sends in flight).
  const size_t slot = e.next_slot % static_cast<size_t>(e.slots);
  if (std::shared_ptr<SendState> prev = e.slot_owner[slot]) {
    Backoff backoff(options_.max_poll_interval);
    while (!PollSend(e, *prev)) {
      BATON_RETURN_IF_ERROR(CheckEdge(e, st.what));
      Nap(backoff.Next());
    }
  }
  e.slot_owner[slot] = item.state;
  ++e.next_slot;
  BATON_RETURN_IF_ERROR(Flags(e, st.what));

  const auto cuda_failed = [&](const absl::Status& s) {
    const std::string reason = absl::StrCat(s.message(), " (on the communicator ", e.name, ")");
    Fatal(e, absl::StatusCode::kInternal, reason);
    return absl::InternalError(absl::StrCat(st.what, ": ", reason));
  };
  char* host = e.host_headers + slot * kHeaderBytes;
  char* dev = e.dev_headers + slot * kHeaderBytes;
  std::memcpy(host, st.header.data(), kHeaderBytes);
  // The comm stream reads the tensor only after the compute stream wrote it.
  if (absl::Status s = api_->StreamWaitEvent(e.stream, item.ready); !s.ok()) return cuda_failed(s);
  ReleaseEvent(item.ready);  // the wait took its record; the event may be recorded again
  item.ready = nullptr;
  if (absl::Status s = api_->MemcpyAsync(dev, host, kHeaderBytes, e.stream); !s.ok()) {
    return cuda_failed(s);
  }
  // Enqueued now, sent when the stream gets there (no deadline: a stuck send ends with
  // its Wait's deadline or an abort, either of which stops this).
  const auto send = [&](const void* buf, size_t bytes) {
    const auto op = [&](NcclComm c) {
      return api_->Send(buf, bytes, e.peer_comm_rank, c, e.stream);
    };
    return Issue(e, st.what, "ncclSend", op, absl::InfiniteFuture()).status();
  };
  BATON_RETURN_IF_ERROR(send(dev, kHeaderBytes));
  const size_t nbytes = item.tensor.defined() ? item.tensor.nbytes() : 0;
  if (nbytes > 0) BATON_RETURN_IF_ERROR(send(item.tensor.raw(), nbytes));
  absl::StatusOr<CudaEvent> done = AcquireEvent();
  if (!done.ok()) return cuda_failed(done.status());
  if (absl::Status s = api_->EventRecord(*done, e.stream); !s.ok()) {
    ReleaseEvent(*done);
    return cuda_failed(s);
  }
  bool finished;
  {
    MutexLock lock(st.mu);
    finished = st.finished;
    if (!finished) st.done = *done;
  }
  if (finished) ReleaseEvent(*done);
  return absl::OkStatus();
}

bool NcclTransport::PollSend(Edge& e, SendState& st) {
  CudaEvent release = nullptr;
  Tensor sent;  // released outside the lock
  absl::Status error;
  {
    MutexLock lock(st.mu);
    if (st.finished) return true;
    if (st.done == nullptr) return false;  // not enqueued yet
    // Under st.mu: an abort finishes the send before it aborts the communicator, so a
    // completion seen here is a real one.
    const absl::StatusOr<bool> q = api_->EventQuery(st.done);
    if (q.ok() && !*q) return false;
    if (q.ok()) {
      st.finished = true;
      st.status = absl::OkStatus();
      sent = std::move(st.tensor);
      release = std::exchange(st.done, nullptr);
    } else {
      error = q.status();
    }
  }
  if (release != nullptr) ReleaseEvent(release);
  if (!error.ok()) {
    Fatal(e, absl::StatusCode::kInternal,
          absl::StrCat(error.message(), " (on the communicator ", e.name, ")"));
  }
  return true;
}

void NcclTransport::FinishSend(SendState& st, const absl::Status& status) {
  Tensor keep;
  CudaEvent ev = nullptr;
  {
    MutexLock lock(st.mu);
    if (st.finished) return;
    st.finished = true;
    st.status = status;
    keep = std::move(st.tensor);
    ev = std::exchange(st.done, nullptr);
  }
  MutexLock lock(mu_);
  // Failed: NCCL may still read the tensor until the stream drains (see ~NcclTransport).
  if (keep.defined()) st.edge->quarantine.push_back(std::move(keep));
  if (ev != nullptr) free_events_.push_back(ev);
}

absl::Status NcclTransport::WaitSend(Edge& e, SendState& st, absl::Time deadline) {
  deadline = Clamp(deadline);
  Backoff backoff(options_.max_poll_interval);
  while (!PollSend(e, st)) {
    if (absl::Status s = CheckEdge(e, st.what); !s.ok()) {
      FinishSend(st, s);  // unless the failure already finished it
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      FailEdge(e, absl::StatusCode::kDeadlineExceeded,
               absl::StrCat("not received by rank ", e.peer, " by the deadline of the wait for ",
                            st.tag, " (is rank ", e.peer, " receiving?); the communicator ", e.name,
                            " was aborted"));
      break;
    }
    Nap(std::min(backoff.Next(), deadline - now));
  }
  MutexLock lock(st.mu);
  return st.status;
}

// --- Receiving ----------------------------------------------------------------------------

absl::StatusOr<Tensor> NcclTransport::Recv(int peer, const TensorTag& tag, absl::Time deadline) {
  Edge* e = RecvEdge(peer);
  const int me = options_.rank;
  if (e == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", me, " cannot receive ",
                                                   tag.ToString(), " from rank ", peer,
                                                   ": not one of its peers"));
  }
  const std::string what =
      absl::StrCat("rank ", me, ": receiving ", tag.ToString(), " from rank ", peer);
  deadline = Clamp(deadline);
  const auto timed_out = [&](const char* detail) {
    const std::string message =
        absl::StrCat("nccl: rank ", me, " timed out waiting for ", tag.ToString(), " from rank ",
                     peer, " (", detail, ")");
    FailEdge(*e, absl::StatusCode::kDeadlineExceeded,
             absl::StrCat(message, "; the communicator ", e->name, " was aborted"));
    return absl::DeadlineExceededError(message);
  };
  std::unique_lock<std::timed_mutex> turn(e->recv_mu, std::defer_lock);
  if (!turn.try_lock_until(absl::ToChronoTime(deadline))) {
    // Nothing of ours is under way: the edge stays usable.
    return absl::DeadlineExceededError(
        absl::StrCat("nccl: rank ", me, " timed out waiting for ", tag.ToString(), " from rank ",
                     peer, " (another receive from rank ", peer, " was still running)"));
  }
  BATON_RETURN_IF_ERROR(Flags(*e, what));
  const auto cuda_failed = [&](const absl::Status& s) {
    const std::string reason = absl::StrCat(s.message(), " (on the communicator ", e->name, ")");
    Fatal(*e, absl::StatusCode::kInternal, reason);
    return absl::InternalError(absl::StrCat(what, ": ", reason));
  };
  if (absl::Status s = api_->SetDevice(options_.cuda_device); !s.ok()) return cuda_failed(s);

  // The header.
  char* dev = e->dev_headers;
  char* host = e->host_headers;
  BATON_ASSIGN_OR_RETURN(const bool posted, Issue(
                                                *e, what, "ncclRecv",
                                                [&](NcclComm c) {
                                                  return api_->Recv(dev, kHeaderBytes,
                                                                    e->peer_comm_rank, c,
                                                                    e->stream);
                                                },
                                                deadline));
  if (!posted) return timed_out("NCCL did not take the receive");
  if (absl::Status s = api_->MemcpyAsync(host, dev, kHeaderBytes, e->stream); !s.ok()) {
    return cuda_failed(s);
  }
  if (absl::Status s = api_->EventRecord(e->header_event, e->stream); !s.ok()) {
    return cuda_failed(s);
  }
  BATON_ASSIGN_OR_RETURN(const bool arrived, Await(*e, what, deadline, [&] {
                           return api_->EventQuery(e->header_event);
                         }));
  if (!arrived) return timed_out("nothing arrived");

  absl::StatusOr<Header> h = DecodeHeader(host);
  if (!h.ok()) {
    const std::string reason = absl::StrCat("a corrupt header arrived (", h.status().message(),
                                            "); the communicator ", e->name, " was aborted");
    FailEdge(*e, absl::StatusCode::kDataLoss, reason);
    return absl::DataLossError(absl::StrCat(what, ": ", reason));
  }
  if (h->hello || !(h->tag == tag) || h->source_rank != peer) {
    const std::string reason = absl::StrCat(
        h->hello ? std::string("a handshake") : h->tag.ToString(), " from rank ", h->source_rank,
        " arrived instead: sends and receives between two ranks must be issued "
        "in the same order; the communicator ",
        e->name, " was aborted");
    FailEdge(*e, absl::StatusCode::kFailedPrecondition, reason);
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", reason));
  }
  if (!h->defined) return Tensor();

  // The payload, into a tensor allocated in compute-stream order: the comm stream writes
  // it only after the compute stream got there.
  absl::StatusOr<Tensor> t = Tensor::TryEmpty(h->shape, h->dtype, api_->device());
  if (!t.ok()) {
    const std::string reason = absl::StrCat(t.status().message(), "; the communicator ", e->name,
                                            " was aborted (its payload cannot be received)");
    FailEdge(*e, t.status().code(), reason);
    return absl::Status(t.status().code(), absl::StrCat(what, ": ", reason));
  }
  if (h->nbytes == 0) return t;
  if (absl::Status s = api_->EventRecord(e->alloc_event, compute_); !s.ok()) {
    return cuda_failed(s);
  }
  if (absl::Status s = api_->StreamWaitEvent(e->stream, e->alloc_event); !s.ok()) {
    return cuda_failed(s);
  }
  const auto quarantine = [&] {  // NCCL may still write into it until the stream drains
    MutexLock lock(mu_);
    e->quarantine.push_back(*t);
  };
  void* data = t->raw();
  const size_t nbytes = h->nbytes;
  absl::StatusOr<bool> ok = Issue(
      *e, what, "ncclRecv",
      [&](NcclComm c) { return api_->Recv(data, nbytes, e->peer_comm_rank, c, e->stream); },
      deadline);
  if (!ok.ok() || !*ok) {
    quarantine();
    if (!ok.ok()) return ok.status();
    return timed_out("NCCL did not take the receive of the payload");
  }
  if (absl::Status s = api_->EventRecord(e->payload_event, e->stream); !s.ok()) {
    quarantine();
    return cuda_failed(s);
  }
  ok = Await(*e, what, deadline, [&] { return api_->EventQuery(e->payload_event); });
  if (!ok.ok() || !*ok) {
    quarantine();
    if (!ok.ok()) return ok.status();
    return timed_out("its header came but its payload did not");
  }
  // Kernels issued after this returns see the bytes.
  if (absl::Status s = api_->StreamWaitEvent(compute_, e->payload_event); !s.ok()) {
    return cuda_failed(s);
  }
  return t;
}

}  // namespace baton

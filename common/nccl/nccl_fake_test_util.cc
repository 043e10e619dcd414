#include "common/nccl/nccl_fake_test_util.h"
#include "common/core/mutex.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace baton {

namespace {

struct Clique;

// Every fake object of the process is guarded by one mutex, and every change is announced
// on one condition variable (stream threads also re-check every few milliseconds).
struct World {
  Mutex mu;
  std::condition_variable cv;
  // Communicators being set up or alive, by unique id; expired once their last member is.
  std::map<std::string, std::weak_ptr<Clique>> cliques;
  uint64_t next_id = 0;
};

World& TheWorld() {
  static World* const world = new World();
  return *world;
}

constexpr auto kRecheck = std::chrono::milliseconds(20);

}  // namespace

namespace {

// A send posted by its stream, waiting for the matching receive.
struct PendingSend {
  const char* data = nullptr;
  size_t bytes = 0;
  size_t claimed = 0;  // the byte count the send announced (bytes unless injected)
  std::shared_ptr<FakeNccl::Comm> from;
  bool taken = false;
};

// One collective of a communicator: every member's contribution, as it arrives.
struct Round {
  std::vector<std::vector<char>> parts;  // by rank
  std::vector<bool> given;
  int deposited = 0;
  int left = 0;  // members still to read the result
};

struct Clique {
  int nranks = 0;
  // Collectives by their sequence number on the communicator (members issue them in the
  // same order, so the n-th of each member meets the others' n-th).
  std::map<int64_t, Round> rounds;
  std::vector<std::weak_ptr<FakeNccl::Comm>> members;  // by rank, once joined
  int joined = 0;
  // Posted sends by (source rank, destination rank), in issue order.
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<PendingSend>>> channels;
};
}  // namespace

struct FakeNccl::Comm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int nranks = 0;
  NcclResult init = NcclResult::kInProgress;
  NcclResult error = NcclResult::kSuccess;  // broken once not kSuccess
  std::string last_error;
  bool gone = false;  // aborted or destroyed
  bool finalizing = false;
  int ops = 0;      // Send, Recv and collective calls so far
  int64_t collectives = 0;  // collective calls so far
  int pending = 0;  // queued Send and Recv operations not yet finished
  int in_progress_left = 0;
};

struct FakeNccl::Event {
  uint64_t recorded = 0;  // records issued
  uint64_t reached = 0;   // the latest record its stream reached
};

namespace {

enum class Kind { kCopy, kRecord, kWait, kSend, kRecv, kHostFn, kGather, kReduce, kSum, kGroup };

struct Item {
  Kind kind = Kind::kCopy;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  std::shared_ptr<FakeNccl::Event> event;
  uint64_t seq = 0;
  std::shared_ptr<FakeNccl::Comm> comm;
  int peer = 0;
  size_t claimed = 0;
  bool drop = false;
  std::shared_ptr<PendingSend> posted;
  std::function<void()> fn;
  int64_t round = 0;        // kGather, kReduce: the collective's sequence number
  bool deposited = false;   // kGather, kReduce: this member's part is in the round
  int members = 0;          // kSum
  std::vector<Item> parts;  // kGroup: its operations, in issue order
  std::vector<bool> done;   // kGroup: which of them finished
};

void Break(FakeNccl::Comm* c, NcclResult error, std::string why) {
  if (c->error != NcclResult::kSuccess) return;
  c->error = error;
  c->last_error = std::move(why);
}

// The fake's "ring": chunk k of n (of a buffer split in `members` chunks) is summed starting
// at member k + 1, so the order differs per chunk, as a real ring all-reduce's does.
void RingSum(const std::vector<std::vector<char>>& parts, float* out, size_t count) {
  const int n = static_cast<int>(parts.size());
  const size_t chunk = (count + n - 1) / n;
  for (size_t i = 0; i < count; ++i) {
    const int first = (static_cast<int>(i / std::max<size_t>(chunk, 1)) + 1) % n;
    float sum = 0.0f;
    for (int k = 0; k < n; ++k) {
      const float* p = reinterpret_cast<const float*>(parts[(first + k) % n].data());
      sum = k == 0 ? p[i] : sum + p[i];
    }
    out[i] = sum;
  }
}

// A collective (kGather, kReduce) as far as it can go: deposit this member's part, then,
// once every member's is in, write the result. World mutex held.
bool RunCollective(Item& it) {
  FakeNccl::Comm* c = it.comm.get();
  if (c->gone) return true;
  if (c->error != NcclResult::kSuccess) return false;  // broken: hangs until aborted
  Round& r = c->clique->rounds[it.round];
  if (r.parts.empty()) {
    r.parts.resize(c->nranks);
    r.given.assign(c->nranks, false);
    r.left = c->nranks;
  }
  if (!it.deposited) {  // copied before anything is written: in place works
    const char* src = static_cast<const char*>(it.src);
    r.parts[c->rank].assign(src, src + it.bytes);
    r.given[c->rank] = true;
    ++r.deposited;
    it.deposited = true;
  }
  if (r.deposited < c->nranks) return false;
  for (int m = 0; m < c->nranks; ++m) {
    if (r.parts[m].size() != it.bytes) {
      const std::string why = absl::StrCat("fake NCCL: a collective of ", r.parts[m].size(),
                                           " bytes on rank ", m, " met one of ", it.bytes,
                                           " bytes on rank ", c->rank);
      Break(c, NcclResult::kInvalidUsage, why);
      return false;
    }
  }
  char* dst = static_cast<char*>(it.dst);
  if (it.kind == Kind::kGather) {
    for (int m = 0; m < c->nranks; ++m) {
      if (it.bytes > 0) std::memcpy(dst + m * it.bytes, r.parts[m].data(), it.bytes);
    }
  } else {
    RingSum(r.parts, reinterpret_cast<float*>(dst), it.bytes / sizeof(float));
  }
  if (--r.left == 0) c->clique->rounds.erase(it.round);
  return true;
}

// Removes the sends `c` posted that no receive took.
void Withdraw(FakeNccl::Comm* c) {
  for (auto& [key, queue] : c->clique->channels) {
    std::erase_if(queue, [c](const std::shared_ptr<PendingSend>& p) { return p->from.get() == c; });
  }
}

void Retire(Item& it, bool finished);

// Runs `it` as far as it can; true once it is finished. World mutex held.
bool TryRun(Item& it) {
  switch (it.kind) {
    case Kind::kCopy:
      if (it.bytes > 0) std::memcpy(it.dst, it.src, it.bytes);
      return true;
    case Kind::kRecord:
      it.event->reached = std::max(it.event->reached, it.seq);
      return true;
    case Kind::kWait:
      return it.event->reached >= it.seq;
    case Kind::kHostFn:
      return true;  // run by the stream loop, outside the lock
    case Kind::kGather:
    case Kind::kReduce:
      return RunCollective(it);
    case Kind::kGroup: {  // every part as far as it goes: all sends are posted at once
      bool all = true;
      for (size_t k = 0; k < it.parts.size(); ++k) {
        if (!it.done[k] && TryRun(it.parts[k])) {
          Retire(it.parts[k], /*finished=*/true);
          it.done[k] = true;
        }
        all = all && it.done[k];
      }
      return all;
    }
    case Kind::kSum: {
      const size_t n = it.bytes / sizeof(float);
      const float* src = static_cast<const float*>(it.src);
      float* dst = static_cast<float*>(it.dst);
      for (size_t i = 0; i < n; ++i) {
        float sum = src[i];
        for (int m = 1; m < it.members; ++m) sum = sum + src[m * n + i];
        dst[i] = sum;
      }
      return true;
    }
    case Kind::kSend: {
      FakeNccl::Comm* c = it.comm.get();
      if (c->gone) return true;
      if (!it.posted) {
        if (c->error != NcclResult::kSuccess) return false;  // broken: hangs until aborted
        it.posted = std::make_shared<PendingSend>();
        it.posted->data = static_cast<const char*>(it.src);
        it.posted->bytes = it.bytes;
        it.posted->claimed = it.claimed;
        it.posted->from = it.comm;
        c->clique->channels[{c->rank, it.peer}].push_back(it.posted);
      }
      return it.posted->taken;
    }
    case Kind::kRecv: {
      FakeNccl::Comm* c = it.comm.get();
      if (c->gone) return true;
      if (it.drop || c->error != NcclResult::kSuccess) return false;
      auto& queue = c->clique->channels[{it.peer, c->rank}];
      if (queue.empty()) return false;
      PendingSend& p = *queue.front();
      if (p.claimed != it.bytes) {
        const std::string why =
            absl::StrCat("fake NCCL: a send of ", p.claimed, " bytes from rank ", it.peer,
                         " matched a receive of ", it.bytes, " bytes on rank ", c->rank);
        Break(c, NcclResult::kInvalidUsage, why);
        Break(p.from.get(), NcclResult::kInvalidUsage, why);
        return false;
      }
      if (it.bytes > 0) std::memcpy(it.dst, p.data, it.bytes);
      p.taken = true;
      queue.pop_front();
      return true;
    }
  }
  return true;
}

// Bookkeeping once `it` leaves its queue, finished or dropped. World mutex held.
void Retire(Item& it, bool finished) {
  if (it.kind == Kind::kGroup) {  // its finished parts retired as they finished
    for (size_t k = 0; k < it.parts.size(); ++k) {
      if (!it.done[k]) Retire(it.parts[k], finished);
    }
    return;
  }
  if (it.kind == Kind::kGather || it.kind == Kind::kReduce) {
    --it.comm->pending;
    return;
  }
  if (it.kind != Kind::kSend && it.kind != Kind::kRecv) return;
  if (!finished && it.posted && !it.posted->taken) {
    auto& queue = it.comm->clique->channels[{it.comm->rank, it.peer}];
    std::erase(queue, it.posted);
  }
  --it.comm->pending;
}

}  // namespace

struct FakeNccl::Stream {
  std::deque<Item> queue;
  bool stop = false;
  std::thread thread;
};

struct FakeNccl::Group {
  int depth = 0;  // GroupStart calls not yet ended
  Item work;      // kind kGroup
  FakeNccl::Stream* stream = nullptr;
  FakeNccl::Comm* comm = nullptr;
};

namespace {

// Queues `it` on `s` for communicator `c`; kInProgress for the fake's in-progress polls.
// World mutex held.
NcclResult Queue(FakeNccl::Comm* c, FakeNccl::Stream* s, Item it, int in_progress_polls) {
  ++c->pending;
  s->queue.push_back(std::move(it));
  TheWorld().cv.notify_all();
  if (in_progress_polls > 0) {
    c->in_progress_left = in_progress_polls;
    return NcclResult::kInProgress;
  }
  return NcclResult::kSuccess;
}

void RunStream(std::shared_ptr<FakeNccl::Stream> s) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  while (!s->stop) {
    if (s->queue.empty()) {
      w.cv.wait_for(lock.native(), kRecheck);
      continue;
    }
    Item& it = s->queue.front();
    if (it.kind == Kind::kHostFn) {
      std::function<void()> fn = std::move(it.fn);
      lock.unlock();
      fn();
      lock.lock();
      s->queue.pop_front();
      w.cv.notify_all();
      continue;
    }
    if (TryRun(it)) {
      Retire(it, /*finished=*/true);
      s->queue.pop_front();
      w.cv.notify_all();
    } else {
      w.cv.wait_for(lock.native(), kRecheck);
    }
  }
  for (Item& it : s->queue) Retire(it, /*finished=*/false);
  s->queue.clear();
  w.cv.notify_all();
}

template <typename Map, typename Key>
auto Lookup(Map& map, Key key) -> decltype(map.begin()->second.get()) {
  auto it = map.find(key);
  return it == map.end() ? nullptr : it->second.get();
}

absl::Status UnknownHandle(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("fake nccl: unknown ", what, " handle"));
}

}  // namespace

FakeNccl::FakeNccl(FakeNcclOptions options) : options_(options) {}

FakeNccl::~FakeNccl() {
  World& w = TheWorld();
  std::vector<std::thread> threads;
  {
    MutexLock lock(w.mu);
    for (auto& [handle, c] : comms_) {
      c->gone = true;
      Withdraw(c.get());
    }
    comms_.clear();
    for (auto& [handle, s] : streams_) {
      s->stop = true;
      threads.push_back(std::move(s->thread));
    }
    streams_.clear();
    events_.clear();
    w.cv.notify_all();
  }
  for (auto& t : threads) t.join();
  MutexLock lock(w.mu);
  for (auto& [p, bytes] : buffers_) ::operator delete (p, std::align_val_t{64});
  buffers_.clear();
}

std::unique_ptr<FakeNccl> MakeFakeNccl(FakeNcclOptions options) {
  return std::make_unique<FakeNccl>(options);
}

NcclResult FakeNccl::GetUniqueId(NcclUniqueId* id) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  *id = NcclUniqueId{};
  const std::string s = absl::StrCat("fake-nccl/", getpid(), "/", ++w.next_id);
  std::memcpy(id->bytes.data(), s.data(), std::min(s.size(), id->bytes.size()));
  return NcclResult::kSuccess;
}

NcclResult FakeNccl::CommInitRank(NcclComm* comm, int nranks, const NcclUniqueId& id, int rank,
                                  int cuda_device) {
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) return NcclResult::kInvalidArgument;
  World& w = TheWorld();
  MutexLock lock(w.mu);
  const std::string key(id.bytes.data(), id.bytes.size());
  std::shared_ptr<Clique> clique = w.cliques[key].lock();
  if (!clique) {
    clique = std::make_shared<Clique>();
    clique->nranks = nranks;
    clique->members.resize(nranks);
    w.cliques[key] = clique;
  }
  if (clique->nranks != nranks || clique->members[rank].lock() != nullptr) {
    return NcclResult::kInvalidUsage;  // another size, or the rank joined twice
  }
  std::erase_if(w.cliques, [](const auto& kv) { return kv.second.expired(); });
  auto c = std::make_shared<Comm>();
  c->clique = clique;
  c->rank = rank;
  c->nranks = nranks;
  const NcclComm handle = reinterpret_cast<NcclComm>(c.get());
  comms_[handle] = c;
  *comm = handle;
  if (options_.init_fails) {
    c->init = NcclResult::kSystemError;
    c->last_error = "fake NCCL: injected initialisation failure";
  } else if (!options_.init_never_completes) {
    clique->members[rank] = c;
    if (++clique->joined == nranks) {
      for (auto& m : clique->members) {
        if (auto member = m.lock()) member->init = NcclResult::kSuccess;
      }
    }
  }
  w.cv.notify_all();
  if (options_.blocking_init && !options_.init_fails) {
    const bool all = w.cv.wait_for(lock.native(), absl::ToChronoNanoseconds(options_.blocking_init_timeout),
                                   [&] { return clique->joined == nranks; });
    if (!all) {
      c->init = NcclResult::kSystemError;
      c->last_error = absl::StrCat("fake NCCL: a blocking ncclCommInitRank waited ",
                                   absl::FormatDuration(options_.blocking_init_timeout),
                                   " for the other members (a real one waits forever)");
      return NcclResult::kSystemError;
    }
    return NcclResult::kSuccess;
  }
  return NcclResult::kInProgress;
}

NcclResult FakeNccl::CommGetAsyncError(NcclComm comm, NcclResult* state) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Comm* c = Lookup(comms_, comm);
  if (c == nullptr) return NcclResult::kInvalidArgument;
  if (c->in_progress_left > 0) {
    --c->in_progress_left;
    *state = NcclResult::kInProgress;
  } else if (c->error != NcclResult::kSuccess) {
    *state = c->error;
  } else if (c->init != NcclResult::kSuccess) {
    *state = c->init;
  } else if (c->finalizing && c->pending > 0) {
    *state = NcclResult::kInProgress;
  } else {
    *state = NcclResult::kSuccess;
  }
  return NcclResult::kSuccess;
}

NcclResult FakeNccl::Admit(NcclComm comm, CudaStream stream, Comm** c, Stream** s) {
  *c = Lookup(comms_, comm);
  *s = Lookup(streams_, stream);
  if (*c == nullptr || *s == nullptr) return NcclResult::kInvalidArgument;
  if ((*c)->init != NcclResult::kSuccess) {
    (*c)->last_error = "fake NCCL: an operation on a communicator that is not ready";
    return NcclResult::kInvalidUsage;
  }
  if ((*c)->in_progress_left > 0 || (*c)->finalizing) {
    (*c)->last_error = "fake NCCL: a call while the previous one is in progress or finalizing";
    return NcclResult::kInvalidUsage;
  }
  return NcclResult::kSuccess;
}

int FakeNccl::CountOp(Comm* c) {
  const int op = ++c->ops;
  if (options_.async_error_at_op > 0 && op >= options_.async_error_at_op) {
    Break(c, options_.async_error,
          absl::StrCat("fake NCCL: injected ", NcclResultName(options_.async_error),
                       " at operation ", op));
  }
  return op;
}

NcclResult FakeNccl::Enqueue(bool send, void* buf, size_t bytes, int peer, NcclComm comm,
                             CudaStream stream) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Comm* c = nullptr;
  Stream* s = nullptr;
  if (NcclResult r = Admit(comm, stream, &c, &s); r != NcclResult::kSuccess) return r;
  if (peer < 0 || peer >= c->nranks) return NcclResult::kInvalidArgument;
  const int op = CountOp(c);
  Item it;
  it.kind = send ? Kind::kSend : Kind::kRecv;
  it.comm = comms_[comm];
  it.peer = peer;
  it.bytes = bytes;
  if (send) {
    it.src = buf;
    it.claimed = bytes;
    if (op == options_.mismatch_bytes_at_op) {
      it.claimed = static_cast<size_t>(static_cast<int64_t>(bytes) + options_.bytes_delta);
    }
  } else {
    it.dst = buf;
    it.drop = options_.drop_recvs_from_op > 0 && op >= options_.drop_recvs_from_op;
  }
  if (group_ != nullptr) {  // queued at GroupEnd, with the rest of the group
    if (group_->stream != nullptr && group_->stream != s) {
      c->last_error = "fake NCCL: a group on more than one stream is not modelled";
      return NcclResult::kInvalidUsage;
    }
    group_->stream = s;
    group_->comm = c;
    ++c->pending;
    group_->work.parts.push_back(std::move(it));
    group_->work.done.push_back(false);
    return NcclResult::kSuccess;
  }
  return Queue(c, s, std::move(it), options_.in_progress_polls);
}

NcclResult FakeNccl::Send(const void* buf, size_t bytes, int peer, NcclComm comm,
                          CudaStream stream) {
  return Enqueue(true, const_cast<void*>(buf), bytes, peer, comm, stream);
}

NcclResult FakeNccl::Recv(void* buf, size_t bytes, int peer, NcclComm comm, CudaStream stream) {
  return Enqueue(false, buf, bytes, peer, comm, stream);
}

NcclResult FakeNccl::Collective(bool gather, const void* send, void* recv, size_t count,
                                NcclComm comm, CudaStream stream) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Comm* c = nullptr;
  Stream* s = nullptr;
  if (NcclResult r = Admit(comm, stream, &c, &s); r != NcclResult::kSuccess) return r;
  if (group_ != nullptr) {
    c->last_error = "fake NCCL: collectives inside a group are not modelled";
    return NcclResult::kInvalidUsage;
  }
  CountOp(c);
  Item it;
  it.kind = gather ? Kind::kGather : Kind::kReduce;
  it.comm = comms_[comm];
  it.src = send;
  it.dst = recv;
  it.bytes = count * sizeof(float);
  it.round = ++c->collectives;
  return Queue(c, s, std::move(it), options_.in_progress_polls);
}

NcclResult FakeNccl::AllGather(const void* send, void* recv, size_t count, NcclComm comm,
                               CudaStream stream) {
  return Collective(true, send, recv, count, comm, stream);
}

NcclResult FakeNccl::AllReduceSum(const void* send, void* recv, size_t count, NcclComm comm,
                                  CudaStream stream) {
  return Collective(false, send, recv, count, comm, stream);
}

absl::Status FakeNccl::OrderedSum(float* dst, const float* src, int members, size_t count,
                                  CudaStream stream) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Stream* s = Lookup(streams_, stream);
  if (s == nullptr) return UnknownHandle("stream");
  Item it;
  it.kind = Kind::kSum;
  it.dst = dst;
  it.src = src;
  it.bytes = count * sizeof(float);
  it.members = members;
  s->queue.push_back(std::move(it));
  w.cv.notify_all();
  return absl::OkStatus();
}

NcclResult FakeNccl::GroupStart() {
  MutexLock lock(TheWorld().mu);
  if (group_ == nullptr) {
    group_ = std::make_unique<Group>();
    group_->work.kind = Kind::kGroup;
  }
  ++group_->depth;
  return NcclResult::kSuccess;
}

NcclResult FakeNccl::GroupEnd() {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  if (group_ == nullptr) return NcclResult::kInvalidUsage;
  if (--group_->depth > 0) return NcclResult::kSuccess;
  std::unique_ptr<Group> g = std::move(group_);
  if (g->work.parts.empty()) return NcclResult::kSuccess;
  // The stream and communicator outlive the group unless the caller destroyed them
  // between the calls, which NCCL does not allow either.
  g->stream->queue.push_back(std::move(g->work));
  w.cv.notify_all();
  if (options_.in_progress_polls > 0) {
    g->comm->in_progress_left = options_.in_progress_polls;
    return NcclResult::kInProgress;
  }
  return NcclResult::kSuccess;
}

NcclResult FakeNccl::CommFinalize(NcclComm comm) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Comm* c = Lookup(comms_, comm);
  if (c == nullptr) return NcclResult::kInvalidArgument;
  c->finalizing = true;
  return NcclResult::kInProgress;
}

void FakeNccl::EndComm(NcclComm comm, bool abort) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  auto it = comms_.find(comm);
  if (it == comms_.end()) return;
  const Comm& c = *it->second;
  if (c.finalizing && c.pending == 0 && c.error == NcclResult::kSuccess) ++finalized_;
  it->second->gone = true;
  Withdraw(it->second.get());
  comms_.erase(it);
  ++(abort ? aborted_ : destroyed_);
  w.cv.notify_all();
}

NcclResult FakeNccl::CommDestroy(NcclComm comm) {
  {
    MutexLock lock(TheWorld().mu);
    if (Lookup(comms_, comm) == nullptr) return NcclResult::kInvalidArgument;
  }
  EndComm(comm, /*abort=*/false);
  return NcclResult::kSuccess;
}

NcclResult FakeNccl::CommAbort(NcclComm comm) {
  {
    MutexLock lock(TheWorld().mu);
    if (Lookup(comms_, comm) == nullptr) return NcclResult::kInvalidArgument;
  }
  EndComm(comm, /*abort=*/true);
  return NcclResult::kSuccess;
}

std::string FakeNccl::ErrorString(NcclResult r) {
  return absl::StrCat(NcclResultName(r), " (fake)");
}

std::string FakeNccl::LastError(NcclComm comm) {
  MutexLock lock(TheWorld().mu);
  Comm* c = Lookup(comms_, comm);
  return c == nullptr ? std::string() : c->last_error;
}

absl::StatusOr<CudaStream> FakeNccl::StreamCreate(int cuda_device) {
  auto s = std::make_shared<Stream>();
  const CudaStream handle = reinterpret_cast<CudaStream>(s.get());
  MutexLock lock(TheWorld().mu);
  s->thread = std::thread(RunStream, s);
  streams_[handle] = std::move(s);
  return handle;
}

absl::Status FakeNccl::StreamDestroy(CudaStream stream) {
  World& w = TheWorld();
  std::thread t;
  {
    MutexLock lock(w.mu);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return UnknownHandle("stream");
    it->second->stop = true;
    t = std::move(it->second->thread);
    streams_.erase(it);
    w.cv.notify_all();
  }
  t.join();
  return absl::OkStatus();
}

absl::StatusOr<CudaEvent> FakeNccl::EventCreate(int cuda_device) {
  auto e = std::make_shared<Event>();
  const CudaEvent handle = reinterpret_cast<CudaEvent>(e.get());
  MutexLock lock(TheWorld().mu);
  events_[handle] = std::move(e);
  return handle;
}

absl::Status FakeNccl::EventDestroy(CudaEvent event) {
  MutexLock lock(TheWorld().mu);
  if (events_.erase(event) == 0) return UnknownHandle("event");
  return absl::OkStatus();
}

absl::Status FakeNccl::EventRecord(CudaEvent event, CudaStream stream) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  auto e = events_.find(event);
  Stream* s = Lookup(streams_, stream);
  if (e == events_.end()) return UnknownHandle("event");
  if (s == nullptr) return UnknownHandle("stream");
  Item it;
  it.kind = Kind::kRecord;
  it.event = e->second;
  it.seq = ++e->second->recorded;
  s->queue.push_back(std::move(it));
  w.cv.notify_all();
  return absl::OkStatus();
}

absl::Status FakeNccl::StreamWaitEvent(CudaStream stream, CudaEvent event) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  auto e = events_.find(event);
  Stream* s = Lookup(streams_, stream);
  if (e == events_.end()) return UnknownHandle("event");
  if (s == nullptr) return UnknownHandle("stream");
  Item it;
  it.kind = Kind::kWait;
  it.event = e->second;
  it.seq = e->second->recorded;
  s->queue.push_back(std::move(it));
  w.cv.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeNccl::EventQuery(CudaEvent event) {
  MutexLock lock(TheWorld().mu);
  Event* e = Lookup(events_, event);
  if (e == nullptr) return UnknownHandle("event");
  return e->reached >= e->recorded;
}

absl::StatusOr<void*> FakeNccl::DeviceAlloc(size_t bytes, int cuda_device) {
  return HostAlloc(bytes);
}

absl::Status FakeNccl::DeviceFree(void* p) {
  {
    MutexLock lock(TheWorld().mu);
    ++device_wide_frees_;
  }
  return HostFree(p);
}

absl::StatusOr<void*> FakeNccl::DeviceAllocAsync(size_t bytes, CudaStream stream) {
  {
    MutexLock lock(TheWorld().mu);
    if (Lookup(streams_, stream) == nullptr) return UnknownHandle("stream");
  }
  return HostAlloc(bytes);
}

absl::Status FakeNccl::DeviceFreeAsync(void* p, CudaStream stream) {
  {
    MutexLock lock(TheWorld().mu);
    if (buffers_.count(p) == 0) return UnknownHandle("buffer");
    Stream* s = Lookup(streams_, stream);
    if (s == nullptr) return UnknownHandle("stream");
    if (!s->queue.empty()) {  // after the work before it
      Item it;
      it.kind = Kind::kHostFn;
      it.fn = [this, p] { (void)HostFree(p); };
      s->queue.push_back(std::move(it));
      TheWorld().cv.notify_all();
      return absl::OkStatus();
    }
  }
  return HostFree(p);  // nothing queued before it: given back now
}

absl::StatusOr<void*> FakeNccl::HostAlloc(size_t bytes) {
  void* p = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{64});
  MutexLock lock(TheWorld().mu);
  buffers_[p] = bytes;
  return p;
}

absl::Status FakeNccl::HostFree(void* p) {
  {
    MutexLock lock(TheWorld().mu);
    if (buffers_.erase(p) == 0) return UnknownHandle("buffer");
  }
  ::operator delete (p, std::align_val_t{64});
  return absl::OkStatus();
}

absl::Status FakeNccl::MemcpyAsync(void* dst, const void* src, size_t bytes, CudaStream stream) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Stream* s = Lookup(streams_, stream);
  if (s == nullptr) return UnknownHandle("stream");
  Item it;
  it.kind = Kind::kCopy;
  it.dst = dst;
  it.src = src;
  it.bytes = bytes;
  s->queue.push_back(std::move(it));
  w.cv.notify_all();
  return absl::OkStatus();
}

absl::Status FakeNccl::LaunchHostFunc(CudaStream stream, std::function<void()> fn) {
  World& w = TheWorld();
  MutexLock lock(w.mu);
  Stream* s = Lookup(streams_, stream);
  if (s == nullptr) return UnknownHandle("stream");
  Item it;
  it.kind = Kind::kHostFn;
  it.fn = std::move(fn);
  s->queue.push_back(std::move(it));
  w.cv.notify_all();
  return absl::OkStatus();
}

FakeNccl::Counts FakeNccl::counts() const {
  MutexLock lock(TheWorld().mu);
  Counts c;
  c.comms = static_cast<int>(comms_.size());
  c.aborted = aborted_;
  c.destroyed = destroyed_;
  c.finalized = finalized_;
  c.streams = static_cast<int>(streams_.size());
  c.events = static_cast<int>(events_.size());
  c.device_wide_frees = device_wide_frees_;
  c.buffers = static_cast<int>(buffers_.size());
  return c;
}

}  // namespace baton

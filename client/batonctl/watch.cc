// batonctl watch: follow a job's state changes and steps until it ends.
//
// On a terminal, progress is one line rewritten in place ("step 120/300  loss 2.4312  1520
// samples/s  ETA 0:42"); otherwise each step is a plain line. State changes are printed
// with their reasons, and at the end the final state (for SUCCEEDED, the weights digest).
// --output json prints each JobEvent as one JSON object per line. Exit code 0 only when
// the job SUCCEEDED.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "common/rpc/rpc.h"

namespace baton::cli {
namespace {

constexpr char kCommand[] = "watch";
// Unary calls made while watching (GetJob at the end) never wait longer than this.
constexpr absl::Duration kUnaryTimeout = absl::Seconds(10);
// Times a stream that ended before the job did is opened again.
constexpr int kMaxReopen = 3;

constexpr char kUsage[] =
    "usage: batonctl watch JOB [--output text|json] [--timeout 24h]\n"
    "\n"
    "Follows the job until it ends: state changes with their reasons, and per step the\n"
    "loss, throughput and ETA (one line updated in place on a terminal). Prints the final\n"
    "state and, for a job that succeeded, its weights digest. Exits 0 only if the job\n"
    "SUCCEEDED. --output json prints one JobEvent per line.";

// The progress display: a line rewritten in place on a terminal, plain lines otherwise.
class Progress {
 public:
  explicit Progress(bool tty) : tty_(tty) {}

  void Step(const std::string& text) {
    if (tty_) {
      std::printf("\r%s\033[K", text.c_str());
      shown_ = true;
    } else {
      std::printf("%s\n", text.c_str());
    }
    std::fflush(stdout);
  }

  // Prints a full line; a progress line being shown stays as it is, above it.
  void Line(const std::string& text) {
    Finish();
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }

  // Ends the progress line so that what follows starts on a fresh line.
  void Finish() {
    if (tty_ && shown_) std::printf("\n");
    shown_ = false;
    std::fflush(stdout);
  }

 private:
  bool tty_;
  bool shown_ = false;
};

// Seconds per step: the mean of the last few steps' durations (as reported, or as seen
// between events when the report has none).
class StepClock {
 public:
  double Observe(const baton::v1::StepProgress& s) {
    const absl::Time now = absl::Now();
    double d = absl::ToDoubleSeconds(FromProtoDuration(s.duration()));
    if (d <= 0 && have_last_ && s.step() > last_step_) {
      d = absl::ToDoubleSeconds(now - last_time_) / static_cast<double>(s.step() - last_step_);
    }
    have_last_ = true;
    last_time_ = now;
    last_step_ = s.step();
    if (d > 0) {
      recent_.push_back(d);
      if (recent_.size() > 10) recent_.pop_front();
    }
    if (recent_.empty()) return -1;
    double sum = 0;
    for (double x : recent_) sum += x;
    return sum / static_cast<double>(recent_.size());
  }

 private:
  std::deque<double> recent_;
  bool have_last_ = false;
  absl::Time last_time_;
  int64_t last_step_ = 0;
};

std::string StepLine(const baton::v1::StepProgress& s, double seconds_per_step) {
  std::string line = absl::StrFormat("step %d/%d  loss %.4f  %.0f samples/s", s.step(),
                                     s.total_steps(), s.loss(), s.samples_per_second());
  if (s.has_val_loss()) absl::StrAppendFormat(&line, "  val %.4f", s.val_loss());
  if (s.learning_rate() > 0) absl::StrAppendFormat(&line, "  lr %.3g", s.learning_rate());
  if (s.has_grad_norm()) absl::StrAppendFormat(&line, "  |g| %.3f", s.grad_norm());
  if (s.mfu() > 0) absl::StrAppendFormat(&line, "  MFU %.1f%%", 100 * s.mfu());
  const int64_t left = s.total_steps() - s.step();
  if (left <= 0) {
    absl::StrAppend(&line, "  ETA 0:00");
  } else if (seconds_per_step > 0) {
    absl::StrAppend(&line, "  ETA ", FormatEta(seconds_per_step * static_cast<double>(left)));
  } else {
    absl::StrAppend(&line, "  ETA ?");
  }
  return line;
}

std::string StateLine(const std::string& job_id, const baton::v1::StateChange& c) {
  std::string line =
      absl::StrCat(FormatClock(c.time()), "  ", job_id, " ", JobStateName(c.state()));
  if (!c.reason().empty()) absl::StrAppend(&line, ": ", c.reason());
  return line;
}

}  // namespace

int WatchUntilDone(const ClusterClient& c, const std::string& job_id,
                   absl::Duration stream_timeout) {
  const bool text = !c.json();
  Progress progress(text && isatty(fileno(stdout)) == 1);
  StepClock clock;
  const absl::Time deadline = absl::Now() + stream_timeout;
  baton::v1::JobState state = baton::v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  const absl::Duration unary = std::min(c.timeout(), kUnaryTimeout);

  for (int reopen = 0;; ++reopen) {
    std::unique_ptr<grpc::ClientContext> ctx = c.Context(deadline - absl::Now());
    baton::v1::WatchJobRequest req;
    req.set_job_id(job_id);
    std::unique_ptr<grpc::ClientReader<baton::v1::JobEvent>> reader =
        c.stub().WatchJob(ctx.get(), req);
    baton::v1::JobEvent ev;
    bool received = false;
    while (reader->Read(&ev)) {
      received = true;
      if (!text) {
        std::printf("%s\n", ToJson(ev, /*pretty=*/false).c_str());
        std::fflush(stdout);
      }
      if (ev.has_state_change()) {
        const baton::v1::StateChange& sc = ev.state_change();
        // A reopened stream starts with the current state again; say it once.
        const bool repeat = sc.state() == state && sc.reason() == reason;
        state = sc.state();
        reason = sc.reason();
        if (text && !repeat) progress.Line(StateLine(job_id, sc));
      } else if (ev.has_step()) {
        const double spp = clock.Observe(ev.step());
        if (text) progress.Step(StepLine(ev.step(), spp));
      }
    }
    const grpc::Status st = reader->Finish();
    if (!st.ok()) {
      progress.Finish();
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && absl::Now() >= deadline) {
        return CommandFail(
            kCommand, absl::StrCat("stopped watching ", job_id, " after ",
                                   absl::FormatDuration(stream_timeout), " (--timeout); it was ",
                                   JobStateName(state), "; it goes on running"));
      }
      return c.Fail(st, received);
    }
    if (IsTerminal(state)) break;
    // The stream ended before the job did (e.g. the coordinator restarted): ask, then
    // watch again.
    baton::v1::GetJobRequest get;
    get.set_job_id(job_id);
    baton::v1::Job job;
    std::unique_ptr<grpc::ClientContext> gctx = c.Context(unary);
    if (const grpc::Status gs = c.stub().GetJob(gctx.get(), get, &job); !gs.ok()) {
      progress.Finish();
      return c.Fail(gs);
    }
    if (IsTerminal(job.state())) {
      state = job.state();
      break;
    }
    if (reopen >= kMaxReopen || absl::Now() >= deadline) {
      progress.Finish();
      return CommandFail(kCommand, absl::StrCat("the watch stream of ", job_id,
                                                " keeps ending while the job is ",
                                                JobStateName(job.state())));
    }
  }
  progress.Finish();

  // The final state, reason, loss and digest.
  baton::v1::GetJobRequest get;
  get.set_job_id(job_id);
  baton::v1::Job job;
  std::unique_ptr<grpc::ClientContext> gctx = c.Context(unary);
  const grpc::Status gs = c.stub().GetJob(gctx.get(), get, &job);
  if (gs.ok()) {
    state = job.state();
    if (!job.history().empty()) reason = job.history().rbegin()->reason();
  } else {
    c.Fail(gs);  // the stream said how it ended; the details are missing
  }
  if (text) {
    if (state == baton::v1::JOB_STATE_SUCCEEDED && gs.ok()) {
      std::printf("%s SUCCEEDED: %lld/%d steps, final loss %.4f\n", job_id.c_str(),
                  static_cast<long long>(job.steps_done()), job.spec().steps(), job.last_loss());
      std::printf("weights digest %s\n", job.weights_digest().c_str());
    } else {
      std::printf("%s %s%s%s\n", job_id.c_str(), JobStateName(state).c_str(),
                  reason.empty() ? "" : ": ", reason.c_str());
    }
    std::fflush(stdout);
  }
  return state == baton::v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

int Watch(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = kCommand;
  command.usage = kUsage;
  command.default_timeout = absl::Hours(24);
  command.run = [](const Args& args, const ClusterClient& c) {
    return WatchUntilDone(c, args.positional()[0], c.timeout());
  };
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli

// batonctl get: one job: its spec, state and history, progress, workers and digest.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "baton/v1/jobs.pb.h"
#include "client/batonctl/cluster_client.h"
#include "client/batonctl/cluster_command.h"
#include "client/batonctl/commands.h"
#include "common/core/log_text.h"
#include "common/rpc/rpc.h"

namespace baton::cli {
namespace {

// Where the job's initial weights come from, as `batonctl train-local` says it.
std::string InitialWeights(const baton::v1::JobSpec& spec) {
  if (spec.has_resume_from()) {
    const baton::v1::ResumeFrom& r = spec.resume_from();
    return absl::StrCat("job ", EchoInput(r.job_id()), "'s checkpoint ",
                        r.step() > 0 ? absl::StrCat("after step ", r.step())
                                     : std::string("(its newest complete one)"));
  }
  if (spec.init().has_from_hf()) {
    return absl::StrCat("Hugging Face model ", EchoInput(spec.init().from_hf()),
                        " (init.from_hf, under the workers' data roots)");
  }
  return absl::StrCat("seed ", spec.seed());
}

void PrintJob(const baton::v1::Job& job) {
  std::printf("%s  %s\n", job.id().c_str(), JobStateName(job.state()).c_str());
  if (!job.spec().name().empty()) std::printf("  name:       %s\n", job.spec().name().c_str());
  if (!job.submission_id().empty()) {
    std::printf("  submission: %s\n", job.submission_id().c_str());
  }
  std::printf("  spec:       %s\n", DescribeSpec(job.spec()).c_str());
  std::printf("  weights:    from %s\n", InitialWeights(job.spec()).c_str());
  std::printf("  created:    %s\n", FormatDateTime(job.create_time()).c_str());
  std::printf("  progress:   step %lld/%d", static_cast<long long>(job.steps_done()),
              job.spec().steps());
  if (job.steps_done() > 0) std::printf(", loss %.4f", job.last_loss());
  std::printf("\n");
  if (job.spec().eval().only() && job.steps_done() > 0) {
    std::printf(
        "  eval:       validation loss %.6f, perplexity %.4f (evaluation only: nothing "
        "trained)\n",
        job.last_loss(), std::exp(static_cast<double>(job.last_loss())));
  }
  if (job.spec().priority() != 0) std::printf("  priority:   %d\n", job.spec().priority());
  if (job.queue_position() > 0) {
    std::printf("  queue:      #%d (1: placed next): %s\n", job.queue_position(),
                job.wait_reason().c_str());
  }
  if (!job.workers().empty()) {
    std::printf("  workers:    %s\n", absl::StrJoin(job.workers(), " ").c_str());
  }
  if (job.has_pipeline() && !job.pipeline().device().empty()) {
    std::printf("  device:     %s\n", job.pipeline().device().c_str());
  }
  // The digest depends on these (docs/precision.md): train-local prints its own to compare.
  for (const std::string& k : job.pipeline().kernels()) {
    std::printf("  kernels:    %s%s\n", k.c_str(),
                job.pipeline().kernels_size() > 1 ? " (ranks differ: the digest matches no "
                                                    "single-machine reference run)"
                                                  : "");
  }
  for (const baton::v1::LinkReport& l : job.pipeline().links()) {
    std::printf("  link:       ranks %d-%d %s (%s)\n", l.rank(), l.peer(), l.transport().c_str(),
                l.reason().c_str());
  }
  for (const baton::v1::GroupReport& g : job.pipeline().groups()) {
    std::printf("  dp group:   rank %d x %d replicas %s %s (%s)\n", g.rank(),
                job.pipeline().data_parallel(), g.engine().c_str(), g.mode().c_str(),
                g.reason().c_str());
  }
  if (job.has_pipeline() && job.pipeline().has_recv_timeout()) {
    std::printf("  peer waits: %s at most, then the job ends (the receive deadline)\n",
                absl::FormatDuration(FromProtoDuration(job.pipeline().recv_timeout())).c_str());
  }
  if (job.spec().optimizer().shard()) {
    std::printf("  optimizer:  sharded across the %d replicas (optimizer.shard)\n",
                job.spec().pipeline().data_parallel());
  }
  if (job.has_pipeline() && !job.pipeline().stage_blocks().empty()) {
    std::printf("  stages:     %s (blocks per stage)\n",
                absl::StrJoin(job.pipeline().stage_blocks(), " ").c_str());
  }
  if (job.has_checkpoints()) {
    const baton::v1::JobCheckpoints& c = job.checkpoints();
    if (!c.resumed_from_job().empty()) {
      std::printf("  resumed:    from %s step %lld (%s)\n", c.resumed_from_job().c_str(),
                  static_cast<long long>(c.resumed_from_step()), c.resumed_from_dir().c_str());
    }
    if (!c.job_dir().empty()) {
      std::vector<std::string> steps;
      for (const baton::v1::CheckpointRecord& r : c.complete()) {
        steps.push_back(absl::StrCat(r.step()));
      }
      std::printf("  checkpoints: %s, complete after step %s\n", c.job_dir().c_str(),
                  steps.empty() ? "none yet" : absl::StrJoin(steps, ", ").c_str());
    }
  }
  // How often it was preempted, and by whom: "2 times, by job-000005 (alice), job-000009 (bob)".
  std::vector<std::string> preemptors;
  for (const baton::v1::Recovery& r : job.recoveries()) {
    if (r.preempted_by().empty()) continue;
    preemptors.push_back(r.preempted_by_user().empty()
                             ? r.preempted_by()
                             : absl::StrCat(r.preempted_by(), " (", r.preempted_by_user(), ")"));
  }
  if (!preemptors.empty()) {
    std::printf("  preemptions: %zu %s, by %s\n", preemptors.size(),
                preemptors.size() == 1 ? "time" : "times", absl::StrJoin(preemptors, ", ").c_str());
  }
  for (const baton::v1::Recovery& r : job.recoveries()) {
    std::printf("  %s %s -> %s stages, from step %lld (%lld steps again)%s: %s\n",
                r.preempted_by().empty() ? "recovery:  " : "preempted: ",
                absl::StrCat(r.stages_before()).c_str(),
                r.stages_after() > 0 ? absl::StrCat(r.stages_after()).c_str() : "?",
                static_cast<long long>(r.from_step()), static_cast<long long>(r.lost_steps()),
                r.has_resumed()               ? ""
                : r.preempted_by().empty()    ? " (recovering)"
                                              : " (waiting to resume)",
                r.reason().c_str());
  }
  if (!job.weights_digest().empty()) {
    std::printf("  digest:     %s\n", job.weights_digest().c_str());
  }
  std::printf("  history:\n");
  for (const baton::v1::StateChange& c : job.history()) {
    std::printf("    %s  %-10s %s\n", FormatDateTime(c.time()).c_str(),
                JobStateName(c.state()).c_str(), c.reason().c_str());
  }
}

int RunGet(const Args& args, const ClusterClient& c) {
  baton::v1::GetJobRequest req;
  req.set_job_id(args.positional()[0]);
  baton::v1::Job job;
  std::unique_ptr<grpc::ClientContext> ctx = c.Context();
  if (const grpc::Status st = c.stub().GetJob(ctx.get(), req, &job); !st.ok()) return c.Fail(st);
  if (c.json()) {
    std::fputs(ToJson(job, /*pretty=*/true).c_str(), stdout);
  } else {
    PrintJob(job);
  }
  return 0;
}

}  // namespace

int Get(const std::vector<std::string>& argv) {
  ClusterCommand command;
  command.name = "get";
  command.usage = "usage: batonctl get JOB [--output text|json]";
  command.run = RunGet;
  return RunClusterCommand(command, argv);
}

}  // namespace baton::cli

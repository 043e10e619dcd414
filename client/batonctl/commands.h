// batonctl subcommands. Each takes the arguments after its name and returns the process
// exit code; errors are printed to stderr with what was wrong.
#ifndef BATON_CLIENT_BATONCTL_COMMANDS_H_
#define BATON_CLIENT_BATONCTL_COMMANDS_H_

#include <string>
#include <vector>

namespace baton::cli {

// batonctl train-local -f SPEC.json [--pipeline [--schedule-csv FILE]] [--steps N] [--seed S]
//                      [--blas-threads T]
//                      [--output text|json]
int TrainLocal(const std::vector<std::string>& argv);

// batonctl plan --schedule NAME --stages S --microbatches M [--virtual V] [--costs F=1,I=1,W=1]
//               [--output table|json|svg|csv] [--blocks N] [-f SPEC.json]
// batonctl plan --schedule custom --csv FILE [--costs ...] [--output ...]
// Builds (or imports), validates and simulates a pipeline schedule; no cluster needed.
int Plan(const std::vector<std::string>& argv);

// batonctl sample (--hf MODEL_DIR | --from DIR/JOB --spec SPEC.json) (--prompt TEXT |
//                 --prompt-ids IDS) [--tokenizer FILE] [--tokens N] [--temperature T]
//                 [--top-k K] [--seed S] [--output text|json]
// Generates text from a model in this process (common/nn/generate.h); no cluster needed.
int Sample(const std::vector<std::string>& argv);

// Cluster commands: they talk to the coordinator's JobService (proto/baton/v1/jobs.proto).
// Common flags: --coordinator HOST:PORT (default $BATON_COORDINATOR, else 127.0.0.1:7070),
// --timeout DURATION (each RPC's deadline: 10s; watch's stream 24h), --output text|json.
// See cluster_client.h; each is a ClusterCommand run by RunClusterCommand
// (cluster_command.h), which parses, prints --help and connects for it.

// batonctl submit -f SPEC.json [--steps N] [--seed S] [--schedule gpipe|1f1b|...]
//                 [--stages N] [--virtual N] [--microbatches N] [--name X]
//                 [--submission-id ID] [--watch] [--resume-from JOB[@STEP]]
// batonctl submit --resume-from JOB[@STEP] [overrides]: JOB's spec, from its checkpoint.
int Submit(const std::vector<std::string>& argv);

// batonctl get JOB
int Get(const std::vector<std::string>& argv);

// batonctl list [--page-size N] [--page-token T] [--all]
int List(const std::vector<std::string>& argv);

// batonctl watch JOB: follows the job to its end; exit 0 only if it SUCCEEDED.
int Watch(const std::vector<std::string>& argv);

// batonctl cancel JOB [--reason R]
int Cancel(const std::vector<std::string>& argv);
int Priority(const std::vector<std::string>& argv);

// batonctl workers
int Workers(const std::vector<std::string>& argv);

// batonctl trace JOB [--step N] [-o FILE]: one step's action timeline on every rank as
// Chrome trace-event JSON (Perfetto, chrome://tracing), one track per stage.
int Trace(const std::vector<std::string>& argv);

// batonctl history JOB [--csv]: the job's loss and throughput, one row per step (every page
// of GetJobHistory): an aligned table, CSV with a header, or the JobHistory as JSON.
int History(const std::vector<std::string>& argv);

// batonctl export: a job's weights from a complete checkpoint, as one safetensors file.
int Export(const std::vector<std::string>& argv);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_COMMANDS_H_

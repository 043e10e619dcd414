#include "client/batonctl/cluster_command.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton::cli {
namespace {

// A command whose run records what it was given; nothing connects (channels are lazy).
struct Recorder {
  int runs = 0;
  int offline_runs = 0;
  std::string address;
  bool json = false;
  absl::Duration timeout;

  ClusterCommand Command(Positional positional = Positional::kOneJob) {
    ClusterCommand c;
    c.name = "probe";
    c.usage = "usage: batonctl probe JOB";
    c.flags = {{"step", "", false, "a step"}};
    c.positional = positional;
    c.default_timeout = absl::Seconds(7);
    c.run = [this](const Args&, const ClusterClient& client) {
      ++runs;
      address = client.address();
      json = client.json();
      timeout = client.timeout();
      return 5;
    };
    return c;
  }
};

TEST(ClusterCommandTest, RunsWithAClientFromTheCommonFlags) {
  Recorder r;
  EXPECT_EQ(RunClusterCommand(r.Command(), {"job-1", "--coordinator", "h:1", "-o", "json"}), 5);
  EXPECT_EQ(r.runs, 1);
  EXPECT_EQ(r.address, "h:1");
  EXPECT_TRUE(r.json);
  EXPECT_EQ(r.timeout, absl::Seconds(7));
}

TEST(ClusterCommandTest, HelpExitsZeroWithoutRunning) {
  Recorder r;
  EXPECT_EQ(RunClusterCommand(r.Command(), {"--help"}), 0);
  EXPECT_EQ(r.runs, 0);
}

TEST(ClusterCommandTest, CommandLineMistakesExitTwo) {
  Recorder r;
  EXPECT_EQ(RunClusterCommand(r.Command(), {"job-1", "--nope"}), 2);              // unknown flag
  EXPECT_EQ(RunClusterCommand(r.Command(), {}), 2);                               // no JOB
  EXPECT_EQ(RunClusterCommand(r.Command(Positional::kNone), {"x"}), 2);           // unexpected
  EXPECT_EQ(RunClusterCommand(r.Command(), {"job-1", "--coordinator", "h"}), 2);  // no port
  EXPECT_EQ(RunClusterCommand(r.Command(), {"job-1", "--output", "yaml"}), 2);
  EXPECT_EQ(RunClusterCommand(r.Command(), {"job-1", "--timeout", "-1s"}), 2);
  ClusterCommand checked = r.Command();
  checked.check = [](const Args&) { return absl::InvalidArgumentError("bad --step"); };
  EXPECT_EQ(RunClusterCommand(checked, {"job-1"}), 2);
  EXPECT_EQ(r.runs, 0);
}

TEST(ClusterCommandTest, OfflineRunsWithoutAClient) {
  Recorder r;
  ClusterCommand c = r.Command(Positional::kOwn);
  c.offline = [](const Args& args) { return args.Has("step"); };
  c.run_offline = [&r](const Args&) { return ++r.offline_runs, 0; };
  // A --coordinator that would be refused is not even read.
  EXPECT_EQ(RunClusterCommand(c, {"--step", "3", "--coordinator", "nohost"}), 0);
  EXPECT_EQ(r.offline_runs, 1);
  EXPECT_EQ(r.runs, 0);
}

TEST(ClusterCommandTest, AnOutputFileKeepsTextAndGetsItsHelp) {
  Recorder r;
  ClusterCommand c = r.Command();
  c.output_file_help = "file to write";
  EXPECT_EQ(RunClusterCommand(c, {"job-1", "-o", "out.json"}), 5);
  EXPECT_FALSE(r.json);
  bool found = false;
  for (const FlagSpec& f : AllFlags(c)) {
    if (f.name == "output") found = f.help == "file to write";
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace baton::cli

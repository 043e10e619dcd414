#include "common/core/host_info.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace baton {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  }
  return std::max(1, CPU_COUNT(&set));
}

namespace {

// "VmSize:  123456 kB" from /proc/self/status, in bytes; -1 when absent.
int64_t StatusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kb = -1;
    fields >> kb;
    return kb < 0 ? -1 : kb * 1024;
  }
  return -1;
}

// A number in a cgroup file ("max" and unreadable files: -1).
int64_t CgroupNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  try {
    return std::stoll(word);
  } catch (...) {
    return -1;
  }
}

int64_t Left(int64_t limit, int64_t used) {
  if (limit < 0) return -1;
  return std::max<int64_t>(0, limit - std::max<int64_t>(used, 0));
}

int64_t RlimitLeft(int resource, const std::string& usage_key) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return Left(static_cast<int64_t>(r.rlim_cur), StatusBytes(usage_key));
}

}  // namespace

MemoryLimits ReadMemoryLimits() {
  MemoryLimits m;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) m.physical_bytes = static_cast<int64_t>(pages) * page;
  m.address_space_left = RlimitLeft(RLIMIT_AS, "VmSize");
  m.data_left = RlimitLeft(RLIMIT_DATA, "VmData");
  // cgroup v2: "0::/path" in /proc/self/cgroup names this process's group.
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    m.cgroup_left = Left(CgroupNumber(dir + "/memory.max"), CgroupNumber(dir + "/memory.current"));
  }
  return m;
}

int64_t UsableMemoryBytes(const MemoryLimits& m) {
  int64_t out = -1;  // none known yet
  for (int64_t bound : {m.physical_bytes, m.address_space_left, m.data_left, m.cgroup_left}) {
    if (bound >= 0) out = out < 0 ? bound : std::min(out, bound);
  }
  return std::max<int64_t>(out, 0);
}

int64_t UsableMemoryBytes() { return UsableMemoryBytes(ReadMemoryLimits()); }

}  // namespace baton

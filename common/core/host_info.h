// Facts about the host a process runs on, for device info and benchmark reports.
#ifndef BATON_COMMON_CORE_HOST_INFO_H_
#define BATON_COMMON_CORE_HOST_INFO_H_

#include <cstdint>
#include <string>

namespace baton {

// The CPU's model name from /proc/cpuinfo ("AMD EPYC 7763 64-Core Processor"), or "cpu"
// when it cannot be read.
std::string CpuModelName();

// The CPUs this process may run on (its affinity mask: taskset, a cpuset, a container's
// --cpuset-cpus), at least 1.
int UsableCores();

// What this process's memory limits let it still allocate, from what /proc and the cgroup
// files say (each -1 when there is no such limit or it cannot be read).
struct MemoryLimits {
  int64_t physical_bytes = -1;      // the host's RAM
  int64_t address_space_left = -1;  // RLIMIT_AS minus the address space in use (VmSize)
  int64_t data_left = -1;           // RLIMIT_DATA minus the data segment in use (VmData)
  int64_t cgroup_left = -1;         // the cgroup's memory.max minus memory.current (v2)
};
MemoryLimits ReadMemoryLimits();

// The memory a job on this process may use: the least of the limits above that apply
// (the host's RAM when none does; 0 when even that cannot be read).
int64_t UsableMemoryBytes();
int64_t UsableMemoryBytes(const MemoryLimits& limits);

}  // namespace baton

#endif  // BATON_COMMON_CORE_HOST_INFO_H_

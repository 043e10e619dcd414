// Facts about the host a process runs on, for device info and benchmark reports.
#ifndef BATON_COMMON_CORE_HOST_INFO_H_
#define BATON_COMMON_CORE_HOST_INFO_H_

#include <string>

namespace baton {

// The CPU's model name from /proc/cpuinfo ("AMD EPYC 7763 64-Core Processor"), or "cpu"
// when it cannot be read.
std::string CpuModelName();

}  // namespace baton

#endif  // BATON_COMMON_CORE_HOST_INFO_H_

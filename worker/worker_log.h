// The worker's log: one line per event on stderr, "worker: <line>".
#ifndef BATON_WORKER_WORKER_LOG_H_
#define BATON_WORKER_WORKER_LOG_H_

#include <cstdio>
#include <string>

#include "common/core/log_text.h"

namespace baton {

inline void WorkerLog(const std::string& line) {
  // Lines carry text from the coordinator and its clients (abort reasons): keep one line.
  std::fprintf(stderr, "worker: %s\n", OneLine(line).c_str());
  std::fflush(stderr);
}

}  // namespace baton

#endif  // BATON_WORKER_WORKER_LOG_H_

// Human- and machine-readable views of a schedule and its simulation. (The CSV view is
// ToCsv in schedule.h.)
#ifndef BATON_COMMON_SCHEDULE_RENDER_H_
#define BATON_COMMON_SCHEDULE_RENDER_H_

#include <string>

#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"

namespace baton {

// A text grid: a header line (schedule, S, V, M, makespan, bubble ratio), then one row per
// rank. With `sim`, the columns are time: one per unit of the shortest action's duration,
// each action's text at its start, '-' while it continues, '.' where the rank idles (when
// durations are not whole multiples of that unit, the columns are clock positions instead).
// Then per rank: busy time, idle time, peak in-flight. Without `sim`, the columns are
// positions in each rank's clock. Communication and STEP are omitted from the grid when
// they take no time.
std::string RenderTable(const Schedule& s, const SimResult* sim);

// A JSON object: schedule, stages (S), virtual (V), microbatches (M), num_stages (S*V),
// stage_to_rank, and with `sim` also makespan, bubble_ratio, peak_inflight, busy (per
// rank); with `costs` the costs; always ranks: per rank, the action strings of its clock
// (communication and STEP included). Valid JSON (RFC 8259); numbers in shortest round-trip
// form.
std::string RenderJson(const Schedule& s, const SimResult* sim, const Costs* costs = nullptr);

// A self-contained SVG of the simulated timeline: one row per rank, one rectangle per action
// that takes time, coloured by kind (F, B, I, W; a darker shade for odd model chunks under
// interleaving), labelled with its micro-batch when wide enough, with a title (schedule, S,
// V, M, makespan, bubble) and a legend.
std::string RenderSvg(const Schedule& s, const SimResult& sim);

}  // namespace baton

#endif  // BATON_COMMON_SCHEDULE_RENDER_H_

#include "common/schedule/render.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton {
namespace {

// Shortest text that reads back as the same double; "null" for NaN and infinities.
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string Header(const Schedule& s, const SimResult* sim) {
  std::string out =
      absl::StrCat(ScheduleKindName(s.kind), ": S=", s.num_ranks, " ranks, V=", s.virtual_stages,
                   ", M=", s.num_microbatches, " micro-batches, ", s.num_stages(), " stages\n");
  if (sim != nullptr) {
    absl::StrAppend(&out, "makespan ", Num(sim->makespan), ", bubble ratio ",
                    absl::StrFormat("%.4f", sim->bubble_ratio), " (idle / total rank-time)\n");
  }
  return out;
}

// Columns = positions in each rank's clock.
std::string PositionGrid(const Schedule& s, bool compute_only) {
  std::vector<std::vector<std::string>> cells(s.ranks.size());
  size_t width = 1;
  size_t cols = 0;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (const Action& a : s.ranks[r]) {
      if (compute_only && !IsCompute(a.kind)) continue;
      cells[r].push_back(a.ToString());
      width = std::max(width, cells[r].back().size());
    }
    cols = std::max(cols, cells[r].size());
  }
  const size_t label = absl::StrCat("rank ", s.ranks.size() - 1).size();
  std::string out;
  for (size_t r = 0; r < cells.size(); ++r) {
    std::string line = Pad(absl::StrCat("rank ", r), label) + " |";
    for (const std::string& c : cells[r]) line += " " + Pad(c, width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// Columns = time, in units of the shortest span; "" if durations are not whole multiples.
std::string TimeGrid(const Schedule& s, const SimResult& sim) {
  double q = 0;
  for (const auto& sp : sim.timeline) {
    const double d = sp.end - sp.start;
    if (d > 0 && (q == 0 || d < q)) q = d;
  }
  if (q == 0) return "";
  auto whole = [&](double x, int64_t* out) {
    const double u = x / q;
    const double r = std::round(u);
    if (std::fabs(u - r) > 1e-6 * std::max(1.0, std::fabs(u))) return false;
    *out = static_cast<int64_t>(r);
    return true;
  };
  int64_t cols = 0;
  if (!whole(sim.makespan, &cols) || cols > 200000) return "";
  const int num_ranks = static_cast<int>(s.ranks.size());
  std::vector<std::vector<std::string>> cells(num_ranks, std::vector<std::string>(cols, "."));
  std::vector<std::vector<bool>> cont(num_ranks, std::vector<bool>(cols, false));
  size_t width = 1;
  for (const auto& sp : sim.timeline) {
    if (sp.end - sp.start <= 0) continue;
    int64_t c0 = 0;
    int64_t c1 = 0;
    if (!whole(sp.start, &c0) || !whole(sp.end, &c1)) return "";
    if (c0 < 0 || c1 > cols || c1 <= c0) return "";
    cells[sp.rank][c0] = sp.action.ToString();
    width = std::max(width, cells[sp.rank][c0].size());
    for (int64_t c = c0 + 1; c < c1; ++c) cont[sp.rank][c] = true;
  }
  width = std::max<size_t>(width, 2);
  const size_t label = absl::StrCat("rank ", num_ranks - 1).size();
  std::string out;
  // Ruler: the time at every 5th column, where it fits.
  std::string ruler = Pad("time", label) + " |";
  const size_t base = ruler.size();
  for (int64_t c = 0; c <= cols; c += 5) {
    const size_t at = base + 1 + static_cast<size_t>(c) * (width + 1);
    const std::string t = Num(static_cast<double>(c) * q);
    if (ruler.size() + (ruler.size() > base ? 1 : 0) > at) continue;
    ruler = Pad(ruler, at) + t;
  }
  out += ruler + "\n";
  for (int r = 0; r < num_ranks; ++r) {
    std::string line = Pad(absl::StrCat("rank ", r), label) + " |";
    for (int64_t c = 0; c < cols; ++c) {
      line += ' ';
      line += cont[r][c] ? std::string(width, '-') : Pad(cells[r][c], width);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

struct Palette {
  const char* light;
  const char* dark;
  const char* name;
};

Palette ColorOf(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return {"#8ecae6", "#3a8fb7", "F forward"};
    case ActionKind::kBackward:
      return {"#ffc46b", "#e8890c", "B backward"};
    case ActionKind::kBackwardInput:
      return {"#a7d98b", "#5a9e3a", "I input gradient"};
    case ActionKind::kBackwardWeight:
      return {"#d3b0f0", "#9556c9", "W weight gradient"};
    case ActionKind::kStep:
      return {"#777777", "#777777", "STEP optimizer"};
    default:
      return {"#c8c8c8", "#a0a0a0", "communication"};
  }
}

// A round tick interval giving about `target` ticks over [0, span].
double TickStep(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

}  // namespace

std::string RenderTable(const Schedule& s, const SimResult* sim) {
  std::string out = Header(s, sim);
  if (sim == nullptr) return out + PositionGrid(s, /*compute_only=*/false);
  std::string grid = TimeGrid(s, *sim);
  if (grid.empty()) {
    out += "(durations are not whole multiples of one unit: columns are clock positions)\n";
    grid = PositionGrid(s, /*compute_only=*/true);
  }
  out += grid;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const double busy = r < sim->busy.size() ? sim->busy[r] : 0;
    const double idle = sim->makespan - busy;
    absl::StrAppend(&out, "rank ", r, ": busy ", Num(busy), ", idle ", Num(idle),
                    ", peak in-flight ", r < sim->peak_inflight.size() ? sim->peak_inflight[r] : 0,
                    "\n");
  }
  return out;
}

std::string RenderJson(const Schedule& s, const SimResult* sim, const Costs* costs) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"schedule\": ", JsonString(ScheduleKindName(s.kind)), ",\n");
  absl::StrAppend(&out, "  \"stages\": ", s.num_ranks, ",\n");
  absl::StrAppend(&out, "  \"virtual\": ", s.virtual_stages, ",\n");
  absl::StrAppend(&out, "  \"microbatches\": ", s.num_microbatches, ",\n");
  absl::StrAppend(&out, "  \"num_stages\": ", s.num_stages(), ",\n");
  out += "  \"stage_to_rank\": [";
  for (size_t i = 0; i < s.stage_to_rank.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", s.stage_to_rank[i]);
  }
  out += "],\n";
  if (costs != nullptr) {
    absl::StrAppend(&out, "  \"costs\": {\"F\": ", Num(costs->f),
                    ", \"B\": ", Num(costs->backward()), ", \"I\": ", Num(costs->i),
                    ", \"W\": ", Num(costs->w), ", \"SEND\": ", Num(costs->send),
                    ", \"RECV\": ", Num(costs->recv), ", \"STEP\": ", Num(costs->step), "},\n");
  }
  if (sim != nullptr) {
    absl::StrAppend(&out, "  \"makespan\": ", Num(sim->makespan), ",\n");
    absl::StrAppend(&out, "  \"bubble_ratio\": ", Num(sim->bubble_ratio), ",\n");
    out += "  \"peak_inflight\": [";
    for (size_t i = 0; i < sim->peak_inflight.size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", sim->peak_inflight[i]);
    }
    out += "],\n  \"busy\": [";
    for (size_t i = 0; i < sim->busy.size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", Num(sim->busy[i]));
    }
    out += "],\n";
  }
  out += "  \"ranks\": [";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out += r ? ",\n    [" : "\n    [";
    for (size_t j = 0; j < s.ranks[r].size(); ++j) {
      absl::StrAppend(&out, j ? ", " : "", JsonString(s.ranks[r][j].ToString()));
    }
    out += "]";
  }
  out += s.ranks.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

std::string RenderSvg(const Schedule& s, const SimResult& sim) {
  const int num_ranks = static_cast<int>(s.ranks.size());
  const double left = 70;
  const double top = 48;
  const double row_h = 22;
  const double gap = 6;
  const double right = 20;
  const double span = sim.makespan > 0 ? sim.makespan : 1;
  const double scale = std::clamp(1200.0 / span, 1.0, 36.0);
  const double plot_w = span * scale;
  const double rows_bottom = top + num_ranks * (row_h + gap);
  const double axis_y = rows_bottom + 4;
  const double legend_y = axis_y + 34;
  const double width = std::max(left + plot_w + right, 560.0);
  const double height = legend_y + 26;
  const bool tooltips = sim.timeline.size() <= 20000;

  std::string out;
  absl::StrAppend(&out, absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
                                        "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                                        "font-family=\"Helvetica, Arial, sans-serif\">\n",
                                        width, height, width, height));
  absl::StrAppend(&out, absl::StrFormat("<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
                                        width, height));
  const std::string title = absl::StrFormat(
      "%s: S=%d, V=%d, M=%d; makespan %s, bubble %.1f%%", ScheduleKindName(s.kind), s.num_ranks,
      s.virtual_stages, s.num_microbatches, Num(sim.makespan), 100.0 * sim.bubble_ratio);
  absl::StrAppend(&out, absl::StrFormat("<text x=\"%.0f\" y=\"26\" font-size=\"15\" "
                                        "font-weight=\"bold\">%s</text>\n",
                                        left, XmlEscape(title)));
  for (int r = 0; r < num_ranks; ++r) {
    const double y = top + r * (row_h + gap);
    absl::StrAppend(&out, absl::StrFormat("<text x=\"8\" y=\"%.1f\" font-size=\"12\" "
                                          "dominant-baseline=\"middle\">rank %d</text>\n",
                                          y + row_h / 2, r));
    absl::StrAppend(&out, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                                          "height=\"%.1f\" fill=\"#f2f2f2\"/>\n",
                                          left, y, plot_w, row_h));
  }
  bool seen[9] = {};
  const int label_font = 11;
  for (const auto& sp : sim.timeline) {
    if (sp.end - sp.start <= 0) continue;
    const Palette p = ColorOf(sp.action.kind);
    seen[static_cast<int>(sp.action.kind)] = true;
    const bool dark =
        s.num_ranks > 0 && IsCompute(sp.action.kind) && (sp.action.stage / s.num_ranks) % 2 == 1;
    const double x = left + sp.start * scale;
    const double w = (sp.end - sp.start) * scale;
    const double y = top + sp.rank * (row_h + gap);
    absl::StrAppend(&out, absl::StrFormat("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                                          "height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                                          "stroke-width=\"0.6\">",
                                          x, y, w, row_h, dark ? p.dark : p.light));
    if (tooltips) {
      absl::StrAppend(&out, "<title>", sp.action.ToString(), " [", Num(sp.start), ", ", Num(sp.end),
                      ")</title>");
    }
    out += "</rect>\n";
    if (IsCompute(sp.action.kind)) {
      const std::string label = absl::StrCat(sp.action.microbatch);
      if (w >= 6.5 * label.size() + 3) {
        absl::StrAppend(&out, absl::StrFormat("<text x=\"%.2f\" y=\"%.1f\" font-size=\"%d\" "
                                              "text-anchor=\"middle\" "
                                              "dominant-baseline=\"middle\">%s</text>\n",
                                              x + w / 2, y + row_h / 2 + 0.5, label_font, label));
      }
    }
  }
  // Time axis.
  absl::StrAppend(&out, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                        "stroke=\"#444\" stroke-width=\"0.8\"/>\n",
                                        left, axis_y, left + plot_w, axis_y));
  const double tick = TickStep(span, 12);
  for (double t = 0; t <= span + 1e-9; t += tick) {
    const double x = left + t * scale;
    absl::StrAppend(&out, absl::StrFormat("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" "
                                          "stroke=\"#444\" stroke-width=\"0.8\"/>"
                                          "<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" "
                                          "text-anchor=\"middle\">%s</text>\n",
                                          x, axis_y, x, axis_y + 4, x, axis_y + 15, Num(t)));
  }
  absl::StrAppend(&out, absl::StrFormat("<text x=\"8\" y=\"%.1f\" font-size=\"10\">time</text>\n",
                                        axis_y + 15));
  // Legend.
  double lx = left;
  auto legend = [&](const char* color, const std::string& text) {
    absl::StrAppend(&out,
                    absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" "
                                    "height=\"14\" fill=\"%s\"/><text x=\"%.1f\" "
                                    "y=\"%.1f\" font-size=\"12\" "
                                    "dominant-baseline=\"middle\">%s</text>\n",
                                    lx, legend_y, color, lx + 19, legend_y + 7.5, XmlEscape(text)));
    lx += 28 + 7.0 * text.size();
  };
  for (ActionKind k : {ActionKind::kForward, ActionKind::kBackward, ActionKind::kBackwardInput,
                       ActionKind::kBackwardWeight}) {
    if (seen[static_cast<int>(k)]) legend(ColorOf(k).light, ColorOf(k).name);
  }
  if (seen[static_cast<int>(ActionKind::kSendF)] || seen[static_cast<int>(ActionKind::kRecvF)] ||
      seen[static_cast<int>(ActionKind::kSendB)] || seen[static_cast<int>(ActionKind::kRecvB)]) {
    legend(ColorOf(ActionKind::kSendF).light, "communication");
  }
  if (s.virtual_stages > 1) legend("#3a8fb7", "darker: odd model chunk");
  legend("#f2f2f2", "idle");
  out += "</svg>\n";
  return out;
}

}  // namespace baton

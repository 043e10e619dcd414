#!/usr/bin/env python3
"""Static checks of the Grafana dashboard and its provisioning (deploy/grafana/).

No Grafana and no Prometheus server needed: python3 (stdlib only) and `promtool` (Debian
package `prometheus`). Checks, each failing with a message naming the panel:

  1. structure: the dashboard JSON loads; panel ids are unique (rows' nested panels
     included); each panel's target refIds are unique; gridPos rectangles lie in the
     24-column grid and don't overlap.
  2. datasource: every panel, target and query variable uses the datasource uid that
     deploy/grafana/provisioning/datasources/prometheus.yml provisions (a default
     Prometheus at http://prometheus:9090), and the dashboard provider loads the directory
     the dashboard is mounted at (/var/lib/grafana/dashboards).
  3. promql: every expression, with template variables substituted, is valid PromQL:
     they are written as recording rules into a temporary rules file and
     `promtool check rules` must accept it.
  4. variables: every $variable in an expression is defined in templating.list or is a
     Grafana built-in; each query variable is `label_values(metric, label)` with a metric
     and label from docs/observability.md and refreshes on time-range change; every
     selector of a per-job metric filters on job_id="$job_id".
  5. contract: every metric an expression names (histograms through their _bucket, _sum
     or _count series) is listed in docs/observability.md, and the labels it selects,
     groups by or shows in a legend are that metric's documented labels (plus `le` on
     buckets and the scrape labels `instance` and `job`).

usage:
  dashboard_test.py [--dashboard FILE] [--promtool PATH]   run the checks; exit 1 on failure
  dashboard_test.py --print-exprs JOB_ID                   print every panel target's
      expression with the variables substituted ($job_id -> JOB_ID), one JSON object a
      line: {"panel": TITLE, "refId": REFID, "expr": EXPR}

From Python: `substituted_exprs(job_id)` returns the same list of dicts.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "baton.json"
DASHBOARDS_DIR = GRAFANA / "dashboards"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "baton.yml"
CONTRACT = REPO / "docs" / "observability.md"

DASHBOARD_UID = "baton"
DASHBOARD_TITLE = "baton"
DATASOURCE_UID = "prometheus"
DATASOURCE_URL = "http://prometheus:9090"
DASHBOARDS_MOUNT = "/var/lib/grafana/dashboards"
GRID_COLUMNS = 24
EXAMPLE_JOB_ID = "job-000001"

# Grafana's built-in variables and the literal each stands for when an expression is
# checked or printed.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "5m",
    "__rate_interval_ms": "60000",
    "__interval_ms": "60000",
    "__range_s": "300",
    "__range_ms": "300000",
}
# Labels Prometheus attaches at scrape time; not part of the metric contract.
SCRAPE_LABELS = {"instance", "job"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# $name, ${name}, ${name:format}, [[name]] (the first character of a name is not a
# digit, so "$1" in a label_replace replacement is not a variable).
VARIABLE = re.compile(
    r"\$\{([A-Za-z_]\w*)(?::[^}]*)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)(?::[^\]]*)?\]\]")
LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*,\s*([A-Za-z_]\w*)\s*\)\s*$")
LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")


class Problems:
    """Collects failures per check so one run reports all of them."""

    def __init__(self):
        self.items = []
        self.check = "?"

    def add(self, message):
        self.items.append((self.check, message))


def panel_name(panel):
    return 'panel {} "{}"'.format(panel.get("id", "?"), panel.get("title", ""))


# ------------------------------------------------------------------------ loading

def load_dashboard(path=DASHBOARD):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_panels(dashboard):
    """Yields (panel, parent_row_or_None) for top-level panels and those nested in rows."""
    for panel in dashboard.get("panels", []) or []:
        yield panel, None
        for child in panel.get("panels", []) or []:
            yield child, panel


def targets_of(panel):
    return panel.get("targets", []) or []


def variables_of(dashboard):
    return (dashboard.get("templating") or {}).get("list", []) or []


def variable_query(variable):
    """The query string of a query variable (a plain string, or an object with "query")."""
    query = variable.get("query", "")
    if isinstance(query, dict):
        query = query.get("query", "")
    return query if isinstance(query, str) else ""


def substitute(expr, values):
    """Replaces every template variable named in `values`; others are left as they are."""

    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))

    return VARIABLE.sub(repl, expr)


def variable_values(dashboard, job_id):
    """A literal for every template variable: job_id gets `job_id`; the others their
    current value, or a placeholder."""
    values = dict(BUILTINS)
    for variable in variables_of(dashboard):
        name = variable.get("name", "")
        if name == "job_id":
            values[name] = job_id
        else:
            current = (variable.get("current") or {}).get("value")
            values[name] = current if isinstance(current, str) and current else "x"
    return values


def substituted_exprs(job_id=EXAMPLE_JOB_ID, dashboard=None):
    """Every panel target's expression with the template variables substituted:
    a list of {"panel": title, "refId": refId, "expr": expr} in dashboard order."""
    if dashboard is None:
        dashboard = load_dashboard()
    values = variable_values(dashboard, job_id)
    out = []
    for panel, _ in iter_panels(dashboard):
        for target in targets_of(panel):
            expr = target.get("expr")
            if isinstance(expr, str) and expr.strip():
                out.append({"panel": panel.get("title", ""), "refId": target.get("refId", ""),
                            "expr": substitute(expr, values)})
    return out


# --------------------------------------------------------------- a little YAML

def _strip_comment(line):
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    if text in ("[]", "{}"):
        return [] if text == "[]" else {}
    if text[:1] in "[{|>&*!":
        raise ValueError("unsupported YAML value: " + text)
    lower = text.lower()
    if lower in ("true", "yes", "on"):
        return True
    if lower in ("false", "no", "off"):
        return False
    if lower in ("null", "~", ""):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


_KEY = re.compile(r"^(\"[^\"]*\"|'[^']*'|[^\s\"'#][^:]*?)\s*:(?:\s+(.*))?$")


def _is_item(text):
    return text == "-" or text.startswith("- ")


def _block(lines, i, indent):
    if _is_item(lines[i][1]):
        items = []
        while i < len(lines) and lines[i][0] == indent and _is_item(lines[i][1]):
            content = lines[i][1][1:].strip()
            if not content:
                if i + 1 >= len(lines) or lines[i + 1][0] <= indent:
                    items.append(None)
                    i += 1
                    continue
                item, i = _block(lines, i + 1, lines[i + 1][0])
            elif _KEY.match(content):
                column = indent + len(lines[i][1]) - len(content)
                lines[i] = (column, content)
                item, i = _block(lines, i, column)
            else:
                item, i = _scalar(content), i + 1
            items.append(item)
        return items, i
    mapping = {}
    while i < len(lines) and lines[i][0] == indent and not _is_item(lines[i][1]):
        m = _KEY.match(lines[i][1])
        if not m:
            raise ValueError("cannot parse YAML line: " + lines[i][1])
        key = _scalar(m.group(1))
        rest = m.group(2)
        if rest is None or not rest.strip():
            nxt = lines[i + 1] if i + 1 < len(lines) else None
            if nxt and (nxt[0] > indent or (nxt[0] == indent and _is_item(nxt[1]))):
                value, i = _block(lines, i + 1, nxt[0])
            else:
                value, i = None, i + 1
        else:
            value, i = _scalar(rest), i + 1
        mapping[key] = value
    if i < len(lines) and lines[i][0] > indent:
        raise ValueError("unexpected indentation at YAML line: " + lines[i][1])
    return mapping, i


def parse_yaml_subset(text):
    """Block mappings and lists with plain or quoted scalars: enough for Grafana's
    provisioning files, for machines without PyYAML."""
    lines = []
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if not line.strip() or line.strip() == "---":
            continue
        if "\t" in line[:len(line) - len(line.lstrip())]:
            raise ValueError("tab in YAML indentation: " + raw)
        lines.append((len(line) - len(line.lstrip(" ")), line.strip()))
    if not lines:
        return None
    value, i = _block(lines, 0, lines[0][0])
    if i != len(lines):
        raise ValueError("cannot parse YAML from line: " + lines[i][1])
    return value


def load_yaml(path):
    text = Path(path).read_text(encoding="utf-8")
    try:
        import yaml  # PyYAML, where installed
    except ImportError:
        return parse_yaml_subset(text)
    return yaml.safe_load(text)


# ------------------------------------------------------------------- contract

def parse_contract(text):
    """{metric: {"type": ..., "labels": set}} from the tables of docs/observability.md:
    metric names in the `metric` column, label names (backticked, outside parentheses)
    in the `labels` column; "same as above" repeats the previous row's labels."""
    metrics = {}
    columns = None
    previous = set()
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            columns = None if not line else columns
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [c.lower() for c in cells]
        if "metric" in names and "labels" in names:
            columns = (names.index("metric"), names.index("type"), names.index("labels"))
            continue
        if columns is None or max(columns) >= len(cells):
            continue
        m = re.fullmatch(r"`([A-Za-z_:][A-Za-z0-9_:]*)`", cells[columns[0]])
        if not m:
            continue
        labels_cell = cells[columns[2]]
        if re.match(r"same as above", labels_cell, re.I):
            labels = set(previous)
        else:
            stripped = labels_cell
            while True:
                shorter = re.sub(r"\([^()]*\)", "", stripped)
                if shorter == stripped:
                    break
                stripped = shorter
            labels = set(re.findall(r"`([A-Za-z_]\w*)`", stripped))
        kind = (cells[columns[1]].split() or [""])[0].lower()
        metrics[m.group(1)] = {"type": kind, "labels": labels}
        previous = labels
    return metrics


# ------------------------------------------------------------ PromQL, lightly

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = AGGREGATIONS | GROUPING | {"bool", "and", "or", "unless", "offset", "atan2",
                                      "inf", "nan", "Inf", "NaN"}
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<matchers>\{(?:[^}"']|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')*\})
  | (?P<dur>(?:\d+(?:ms|[smhdwy]))+(?![A-Za-z0-9_:]))
  | (?P<num>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>.)
""", re.X | re.S)
_MATCHER = re.compile(r"""\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*,?""")


def parse_matchers(text):
    """[(label, op, value)] from '{a="x", b=~"y"}'; None if it does not parse."""
    body = text.strip()[1:-1]
    out = []
    pos = 0
    while pos < len(body):
        if not body[pos:].strip():
            break
        m = _MATCHER.match(body, pos)
        if not m:
            return None
        out.append((m.group(1), m.group(2), m.group(3)[1:-1]))
        pos = m.end()
    return out


def analyse(expr):
    """The metric selectors and grouping labels of a PromQL expression:
    ({"selectors": [(metric, matchers_or_None)], "grouping": set, "problems": [str]})."""
    tokens = [(m.lastgroup, m.group(0)) for m in _TOKEN.finditer(expr)]
    tokens = [t for t in tokens if t[0] != "ws"]
    selectors, grouping, problems = [], set(), []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else (None, None)
        if kind == "ident" and text in GROUPING and nxt == ("op", "("):
            j = i + 2
            while j < len(tokens) and tokens[j] != ("op", ")"):
                if tokens[j][0] == "ident":
                    grouping.add(tokens[j][1])
                j += 1
            i = j + 1
            continue
        if kind == "ident" and text not in KEYWORDS and nxt != ("op", "("):
            if nxt[0] == "matchers":
                matchers = parse_matchers(nxt[1])
                if matchers is None:
                    problems.append("cannot read the label matchers of {}{}".format(text, nxt[1]))
                selectors.append((text, matchers or []))
                i += 2
                continue
            selectors.append((text, []))
        elif kind == "matchers" and not (i > 0 and tokens[i - 1][0] == "ident"):
            problems.append("selector without a metric name: " + text)
        i += 1
    return {"selectors": selectors, "grouping": grouping, "problems": problems}


def contract_metric(name, contract):
    """(base metric, problem or None): resolves histogram series names to the histogram."""
    if name in contract:
        if contract[name]["type"] == "histogram":
            return name, ("histogram {} has no series of that name; use {}_bucket, _sum or "
                          "_count".format(name, name))
        return name, None
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            base = name[:-len(suffix)]
            if base in contract and contract[base]["type"] == "histogram":
                return base, None
            if base in contract:
                return base, "{} is a {}, it has no {} series".format(
                    base, contract[base]["type"], suffix)
    return None, "metric {} is not in docs/observability.md".format(name)


def allowed_labels(name, base, contract):
    labels = set(contract[base]["labels"]) | SCRAPE_LABELS
    if name.endswith("_bucket"):
        labels.add("le")
    return labels


# --------------------------------------------------------------------- checks

def check_structure(dashboard, problems):
    if dashboard.get("uid") != DASHBOARD_UID:
        problems.add('dashboard uid is {!r}, expected "{}"'.format(dashboard.get("uid"), DASHBOARD_UID))
    if dashboard.get("title") != DASHBOARD_TITLE:
        problems.add('dashboard title is {!r}, expected "{}"'.format(dashboard.get("title"), DASHBOARD_TITLE))
    if not isinstance(dashboard.get("schemaVersion"), int):
        problems.add("dashboard has no integer schemaVersion")
    if not isinstance(dashboard.get("panels"), list) or not dashboard["panels"]:
        problems.add("dashboard has no panels")
        return

    seen = {}
    for panel, row in iter_panels(dashboard):
        pid = panel.get("id")
        where = panel_name(panel) + (" (in row {})".format(panel_name(row)) if row else "")
        if not isinstance(pid, int) or isinstance(pid, bool):
            problems.add("{} has no integer id".format(where))
        elif pid in seen:
            problems.add("{} has the same id as {}".format(where, seen[pid]))
        else:
            seen[pid] = where
        if not panel.get("title"):
            problems.add("{} has no title".format(where))

        if panel.get("type") == "row":
            if targets_of(panel):
                problems.add("{} is a row but has targets".format(where))
            if panel.get("panels") and not panel.get("collapsed"):
                problems.add("{} is an expanded row with nested panels; Grafana does not show "
                             "them (put them after the row at the top level)".format(where))
            continue
        targets = targets_of(panel)
        if not targets and panel.get("type") != "text":
            problems.add("{} has no targets".format(where))
        refids = {}
        for n, target in enumerate(targets):
            ref = target.get("refId")
            if not isinstance(ref, str) or not ref:
                problems.add("{} target #{} has no refId".format(where, n + 1))
            elif ref in refids:
                problems.add("{} has refId {} twice (targets #{} and #{})".format(
                    where, ref, refids[ref] + 1, n + 1))
            else:
                refids[ref] = n
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                problems.add("{} target {} has no expr".format(where, ref))

    # One grid for the top-level panels (rows included); a collapsed row keeps its own
    # panels' positions for when it is expanded.
    grids = [("the dashboard", dashboard["panels"])]
    for panel in dashboard["panels"]:
        if panel.get("type") == "row" and panel.get("collapsed") and panel.get("panels"):
            grids.append(("collapsed row " + panel_name(panel), panel["panels"]))
    for grid_name, panels in grids:
        rects = []
        for panel in panels:
            gp = panel.get("gridPos")
            keys = ("x", "y", "w", "h")
            if not isinstance(gp, dict) or not all(
                    isinstance(gp.get(k), int) and not isinstance(gp.get(k), bool) for k in keys):
                problems.add("{} has no gridPos with integer x, y, w, h".format(panel_name(panel)))
                continue
            x, y, w, h = (gp[k] for k in keys)
            if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > GRID_COLUMNS:
                problems.add("{} gridPos {} is outside the {}-column grid".format(
                    panel_name(panel), gp, GRID_COLUMNS))
                continue
            for other, (ox, oy, ow, oh) in rects:
                if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                    problems.add("{} gridPos {} overlaps {} in {}".format(
                        panel_name(panel), gp, panel_name(other), grid_name))
            rects.append((panel, (x, y, w, h)))


def _uid(datasource):
    return datasource.get("uid") if isinstance(datasource, dict) else datasource


def check_datasource(dashboard, problems, datasources_path=DATASOURCES, providers_path=PROVIDERS):
    try:
        provisioned = load_yaml(datasources_path)
    except (OSError, ValueError) as e:
        problems.add("cannot read {}: {}".format(datasources_path, e))
        provisioned = None
    entries = (provisioned or {}).get("datasources") if isinstance(provisioned, dict) else None
    entries = [e for e in entries or [] if isinstance(e, dict)]
    matching = [e for e in entries if e.get("uid") == DATASOURCE_UID]
    if len(matching) != 1:
        problems.add('{} provisions {} datasources with uid "{}", expected exactly one'.format(
            datasources_path, len(matching), DATASOURCE_UID))
    else:
        ds = matching[0]
        if ds.get("type") != "prometheus":
            problems.add('{}: datasource "{}" has type {!r}, expected prometheus'.format(
                datasources_path, DATASOURCE_UID, ds.get("type")))
        if ds.get("url") != DATASOURCE_URL:
            problems.add('{}: datasource "{}" has url {!r}, expected {}'.format(
                datasources_path, DATASOURCE_UID, ds.get("url"), DATASOURCE_URL))
        if ds.get("isDefault") is not True:
            problems.add('{}: datasource "{}" is not isDefault: true'.format(
                datasources_path, DATASOURCE_UID))
    if sum(1 for e in entries if e.get("isDefault") is True) > 1:
        problems.add("{} marks more than one datasource as default".format(datasources_path))

    try:
        providers = load_yaml(providers_path)
    except (OSError, ValueError) as e:
        problems.add("cannot read {}: {}".format(providers_path, e))
        providers = None
    entries = (providers or {}).get("providers") if isinstance(providers, dict) else None
    paths = [((e.get("options") or {}).get("path"), e.get("type", "file"))
             for e in entries or [] if isinstance(e, dict)]
    if (DASHBOARDS_MOUNT, "file") not in paths:
        problems.add("{} has no file provider with options.path {} (found {})".format(
            providers_path, DASHBOARDS_MOUNT, paths))
    uids = {}
    for other in sorted(DASHBOARDS_DIR.glob("*.json")):
        try:
            uid = load_dashboard(other).get("uid")
        except (OSError, ValueError) as e:
            problems.add("{} (loaded by the provider) is not valid JSON: {}".format(other, e))
            continue
        if uid in uids:
            problems.add("{} and {} have the same dashboard uid {!r}".format(uids[uid], other, uid))
        uids[uid] = other

    for panel, _ in iter_panels(dashboard):
        if panel.get("type") == "row":
            if panel.get("datasource") is not None and _uid(panel.get("datasource")) != DATASOURCE_UID:
                problems.add("{} datasource uid is {!r}, expected {!r}".format(
                    panel_name(panel), _uid(panel.get("datasource")), DATASOURCE_UID))
            continue
        if not targets_of(panel):
            continue
        if _uid(panel.get("datasource")) != DATASOURCE_UID:
            problems.add("{} datasource uid is {!r}, expected {!r}".format(
                panel_name(panel), _uid(panel.get("datasource")), DATASOURCE_UID))
        for target in targets_of(panel):
            if _uid(target.get("datasource")) != DATASOURCE_UID:
                problems.add("{} target {} datasource uid is {!r}, expected {!r}".format(
                    panel_name(panel), target.get("refId"), _uid(target.get("datasource")),
                    DATASOURCE_UID))
    for variable in variables_of(dashboard):
        if variable.get("type") == "query" and _uid(variable.get("datasource")) != DATASOURCE_UID:
            problems.add('template variable "{}" datasource uid is {!r}, expected {!r}'.format(
                variable.get("name"), _uid(variable.get("datasource")), DATASOURCE_UID))


def all_expressions(dashboard, job_id=EXAMPLE_JOB_ID):
    """[(where, expr with variables substituted)] for every target, and the metric
    selector of every label_values() variable query."""
    values = variable_values(dashboard, job_id)
    out = []
    for panel, _ in iter_panels(dashboard):
        for target in targets_of(panel):
            expr = target.get("expr")
            if isinstance(expr, str) and expr.strip():
                out.append(("{} refId {}".format(panel_name(panel), target.get("refId")),
                            substitute(expr, values)))
    for variable in variables_of(dashboard):
        m = LABEL_VALUES.match(variable_query(variable))
        if variable.get("type") == "query" and m:
            out.append(('template variable "{}"'.format(variable.get("name")),
                        substitute(m.group(1) + (m.group(2) or ""), values)))
    return out


def find_promtool(explicit=None):
    """--promtool, else $PROMTOOL, else promtool on PATH; None if not executable."""
    chosen = explicit or os.environ.get("PROMTOOL")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("promtool") or (
        "/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else None)


def _run_promtool(promtool, exprs, directory, name):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:expr_{}".format(n + 1), "expr": expr}
        for n, (_, expr) in enumerate(exprs)]}]}
    path = Path(directory) / name
    # JSON is YAML: promtool reads it as a rules file.
    path.write_text(json.dumps(rules, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    result = subprocess.run([promtool, "check", "rules", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=60)
    return result.returncode, result.stdout


def check_promql(dashboard, problems, promtool=None):
    promtool = find_promtool(promtool)
    if promtool is None:
        problems.add("promtool not found (install the Debian package `prometheus`, or pass "
                     "--promtool PATH or set PROMTOOL)")
        return
    exprs = all_expressions(dashboard)
    if not exprs:
        problems.add("the dashboard has no expressions")
        return
    with tempfile.TemporaryDirectory(prefix="dashboard_test.") as tmp:
        rc, output = _run_promtool(promtool, exprs, tmp, "dashboard.rules.yml")
        found = re.search(r"SUCCESS: (\d+) rules found", output)
        if rc == 0 and found and int(found.group(1)) == len(exprs):
            return
        # Find which expressions promtool refuses, one at a time, to name the panel.
        named = False
        for n, (where, expr) in enumerate(exprs):
            rc1, out1 = _run_promtool(promtool, [(where, expr)], tmp, "expr_{}.rules.yml".format(n + 1))
            if rc1 != 0:
                detail = " ".join(l.strip() for l in out1.splitlines()
                                  if l.strip() and not l.startswith("Checking"))
                detail = re.sub(r"\S*expr_\d+\.rules\.yml:\s*", "", detail)
                problems.add("{}: promtool refuses {!r}: {}".format(where, expr, detail))
                named = True
        if not named:
            problems.add("promtool check rules failed (rc {}):\n{}".format(rc, output))


def check_variables(dashboard, contract, problems):
    variables = variables_of(dashboard)
    defined = set()
    for variable in variables:
        name = variable.get("name")
        if not name:
            problems.add("a template variable has no name")
            continue
        if name in defined:
            problems.add('template variable "{}" is defined twice'.format(name))
        defined.add(name)
        if name in BUILTINS:
            problems.add('template variable "{}" shadows a Grafana built-in'.format(name))
        if variable.get("type") != "query":
            continue
        query = variable_query(variable)
        m = LABEL_VALUES.match(query)
        if not m:
            problems.add('template variable "{}": query {!r} is not label_values(metric, label)'.format(
                name, query))
            continue
        metric, label = m.group(1), m.group(3)
        base, problem = contract_metric(metric, contract)
        if problem:
            problems.add('template variable "{}": {}'.format(name, problem))
        elif label not in contract[base]["labels"]:
            problems.add('template variable "{}": metric {} has no label {} in docs/observability.md '
                         "(labels: {})".format(name, metric, label,
                                               ", ".join(sorted(contract[base]["labels"])) or "none"))
        if variable.get("refresh") != 2:
            problems.add('template variable "{}" has refresh {!r}; expected 2 (on time range '
                         "change)".format(name, variable.get("refresh")))
        for used in _variables_in(query):
            if used not in defined and used not in BUILTINS:
                problems.add('template variable "{}" uses ${} before it is defined'.format(name, used))

    for panel, _ in iter_panels(dashboard):
        for target in targets_of(panel):
            expr = target.get("expr") or ""
            where = "{} refId {}".format(panel_name(panel), target.get("refId"))
            for used in sorted(_variables_in(expr)):
                if used not in defined and used not in BUILTINS:
                    problems.add("{} uses ${}, which is neither in templating.list nor a Grafana "
                                 "built-in".format(where, used))
            if "job_id" not in defined:
                continue
            # A per-job metric unfiltered by job mixes every job's history in one panel.
            for metric, matchers in analyse(expr)["selectors"]:
                base, problem = contract_metric(metric, contract)
                if problem or "job_id" not in contract[base]["labels"]:
                    continue
                if not any(l == "job_id" and op == "=" and v in ("$job_id", "${job_id}")
                           for l, op, v in matchers):
                    problems.add('{}: {} is a per-job metric but is not selected with '
                                 'job_id="$job_id"'.format(where, metric))


def _variables_in(text):
    return {m.group(1) or m.group(2) or m.group(3) for m in VARIABLE.finditer(text)}


def check_contract(dashboard, contract, problems):
    for panel, _ in iter_panels(dashboard):
        for target in targets_of(panel):
            expr = target.get("expr") or ""
            if not expr.strip():
                continue
            where = "{} refId {}".format(panel_name(panel), target.get("refId"))
            found = analyse(substitute(expr, variable_values(dashboard, EXAMPLE_JOB_ID)))
            for problem in found["problems"]:
                problems.add("{}: {}".format(where, problem))
            if not found["selectors"]:
                problems.add("{}: the expression names no metric".format(where))
            union = set(SCRAPE_LABELS)
            unknown = False
            for metric, matchers in found["selectors"]:
                base, problem = contract_metric(metric, contract)
                if problem:
                    problems.add("{}: {}".format(where, problem))
                    unknown = True
                    continue
                labels = allowed_labels(metric, base, contract)
                union |= labels
                for label, _, _ in matchers:
                    if label not in labels:
                        problems.add("{}: {} has no label {} in docs/observability.md "
                                     "(labels: {})".format(where, metric, label,
                                                           ", ".join(sorted(labels))))
            if unknown:
                continue  # the labels of an unknown metric are unknown too
            for label in sorted(found["grouping"] - union):
                problems.add("{}: groups by label {}, which none of its metrics has in "
                             "docs/observability.md".format(where, label))
            legend = target.get("legendFormat") or ""
            for label in sorted(set(LEGEND_LABEL.findall(legend)) - union):
                problems.add("{}: legend {!r} shows label {}, which none of its metrics has in "
                             "docs/observability.md".format(where, legend, label))


# ----------------------------------------------------------------------- main

def run_checks(dashboard_path=DASHBOARD, contract_path=CONTRACT, promtool=None):
    problems = Problems()
    problems.check = "structure"
    try:
        dashboard = load_dashboard(dashboard_path)
    except (OSError, ValueError) as e:
        problems.add("cannot load {}: {}".format(dashboard_path, e))
        return problems, []
    if not isinstance(dashboard, dict):
        problems.add("{} is not a JSON object".format(dashboard_path))
        return problems, []
    passed = []
    problems.check = "contract"
    try:
        contract = parse_contract(Path(contract_path).read_text(encoding="utf-8"))
        if not contract:
            problems.add("no metric tables found in {}".format(contract_path))
    except OSError as e:
        contract = {}
        problems.add("cannot read {}: {}".format(contract_path, e))

    checks = [
        ("structure", lambda: check_structure(dashboard, problems)),
        ("datasource", lambda: check_datasource(dashboard, problems)),
        ("promql", lambda: check_promql(dashboard, problems, promtool)),
        ("variables", lambda: check_variables(dashboard, contract, problems)),
        ("contract", lambda: check_contract(dashboard, contract, problems)),
    ]
    for name, check in checks:
        before = len(problems.items)
        problems.check = name
        check()
        if len(problems.items) == before:
            passed.append(name)
    return problems, passed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dashboard", default=str(DASHBOARD))
    parser.add_argument("--contract", default=str(CONTRACT))
    parser.add_argument("--promtool", default=None)
    parser.add_argument("--print-exprs", metavar="JOB_ID",
                        help="print every target's substituted expression as JSON lines and exit")
    args = parser.parse_args(argv)

    if args.print_exprs is not None:
        for item in substituted_exprs(args.print_exprs, load_dashboard(args.dashboard)):
            print(json.dumps(item, ensure_ascii=False))
        return 0

    problems, passed = run_checks(args.dashboard, args.contract, args.promtool)
    try:
        dashboard = load_dashboard(args.dashboard)
        n_panels = sum(1 for p, _ in iter_panels(dashboard) if p.get("type") != "row")
        n_exprs = len(all_expressions(dashboard))
        print("dashboard_test: {} ({} panels, {} expressions)".format(args.dashboard, n_panels, n_exprs))
    except (OSError, ValueError, AttributeError):
        pass
    for name in passed:
        print("PASS {}".format(name))
    for check, message in problems.items:
        print("FAIL {}: {}".format(check, message))
    if problems.items:
        print("dashboard_test: {} problem(s)".format(len(problems.items)))
        return 1
    print("dashboard_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Offline checks of the deployment files in deploy/ (deploy/README.md). No Docker engine
# and no Kubernetes cluster run here, so this checks what can be checked without them:
#
#   yamllint       every YAML file under deploy/ (deploy/.yamllint.yml)
#   compose        docker-compose config -q on the base file and base + GPU override; the
#                  GPU reservations (none in the base, one per worker with the override);
#                  flags, healthchecks and Prometheus targets against the port table
#   prometheus     promtool check config / check rules / test rules
#   k8s            kubernetes-validate --strict against the bundled Kubernetes schemas;
#                  flags, probes, Services and annotations against the port table; the
#                  Prometheus ConfigMap checked by promtool, its rules equal to deploy's
#   docker         the Dockerfile's package lists against scripts/setup.sh and against the
#                  libraries the binaries in build/bin link to; ports; the entrypoint
#
# The port table is the one in docs/observability.md. Every check runs even when an earlier
# one failed; the exit status is non-zero when any failed. Tools: docker-compose, promtool
# and yamllint from scripts/setup.sh; kubernetes-validate installed by
# scripts/test-tools.sh into build/test-tools (needs PyPI the first time).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Kubernetes versions the manifests are validated against: the first with GA gRPC probes,
# and the newest kubernetes-validate bundles.
K8S_VERSIONS=(1.27.0 1.37.0)

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
failed_names=()

# check NAME COMMAND...: runs COMMAND, counts and reports the result.
check() {
  local name="$1"
  shift
  echo "=== $name"
  if "$@"; then
    echo "--- ok: $name"
    passed=$((passed + 1))
  else
    echo "--- FAILED: $name"
    failed=$((failed + 1))
    failed_names+=("$name")
  fi
}

# ---- tools ------------------------------------------------------------------------------
for tool in docker-compose promtool yamllint dpkg-query; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "deploy_test: $tool not found; scripts/setup.sh installs it" >&2
    exit 1
  fi
done
if ! TOOLS_BIN="$(scripts/test-tools.sh)"; then
  echo "deploy_test: scripts/test-tools.sh could not install kubernetes-validate; the" \
    "Kubernetes manifests cannot be validated" >&2
  exit 1
fi
PY="$TOOLS_BIN/python"  # has PyYAML (a kubernetes-validate dependency)

# ---- the Python side of the checks ------------------------------------------------------
cat >"$TMP/checks.py" <<'PYEOF'
"""Consistency checks of deploy/ (see tests/deploy_test.sh). Usage: checks.py COMMAND ARGS."""
import glob
import os
import re
import subprocess
import sys

import yaml

errors = []


def error(msg):
    errors.append(msg)
    print("  error: " + msg)


def expect(cond, msg):
    if not cond:
        error(msg)
    return cond


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def port_table():
    """docs/observability.md's port table: {(service, 'grpc'|'metrics'|'health'): port}."""
    table = {}
    row = re.compile(r"^\|\s*(\d+)\s*\|\s*(coordinator|worker) (gRPC|metrics|health)\b")
    with open("docs/observability.md") as f:
        for line in f:
            m = row.match(line)
            if m:
                table[(m.group(2), m.group(3).lower())] = int(m.group(1))
    want = {(s, k) for s in ("coordinator", "worker") for k in ("grpc", "metrics", "health")}
    if set(table) != want:
        print("cannot read the port table of docs/observability.md (found %s)" % table)
        sys.exit(1)
    return table


def security_ok(f):
    """A non-loopback listener starts only with TLS (cert and key) or an explicit --insecure."""
    return ("insecure" in f) != bool(f.get("tls_cert") and f.get("tls_key"))


def mounted_files(f, mounts):
    """The --tls_*, --auth_tokens and --join_token_file paths that lie outside `mounts`."""
    keys = ("tls_cert", "tls_key", "tls_ca", "auth_tokens", "join_token_file")
    return [f[k] for k in keys
            if k in f and not any(f[k].startswith(m.rstrip("/") + "/") for m in mounts)]


def flags(args):
    """--name=value / --name value arguments as a dict."""
    out, i = {}, 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                k, v = a[2:], str(args[i + 1])
                i += 1
            else:
                k, v = a[2:], ""
            out[k] = v
        i += 1
    return out


def port_of(hostport):
    try:
        return int(str(hostport).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


# ---- compose -----------------------------------------------------------------------------
def nvidia_devices(svc):
    res = (svc.get("deploy") or {}).get("resources") or {}
    devices = (res.get("reservations") or {}).get("devices") or []
    return [d for d in devices
            if d.get("driver") == "nvidia" or "gpu" in (d.get("capabilities") or [])]


def cmd_compose(cpu_path, gpu_path, prometheus_path, grafana_dir):
    ports = port_table()
    cg, cm = ports[("coordinator", "grpc")], ports[("coordinator", "metrics")]
    wg, wm = ports[("worker", "grpc")], ports[("worker", "metrics")]
    cpu = load(cpu_path)["services"]
    gpu = load(gpu_path)["services"]

    def program(svc):
        cmd = svc.get("command") or []
        return cmd[0] if cmd else None

    coords = [n for n, s in cpu.items() if program(s) == "coordinator"]
    workers = sorted(n for n, s in cpu.items() if program(s) == "worker")
    if not expect(len(coords) == 1, "expected one coordinator service, found %s" % coords):
        return
    coord = coords[0]
    expect(workers == ["worker-%d" % i for i in range(4)],
           "expected services worker-0..worker-3, found %s" % workers)

    # GPU reservations: none in the base file, exactly one GPU per worker with the override.
    for name, svc in cpu.items():
        expect(not nvidia_devices(svc),
               "base file: %s reserves a GPU; the base must run without GPUs" % name)
    for name, svc in gpu.items():
        devs = nvidia_devices(svc)
        if name in workers:
            expect(len(devs) == 1 and devs[0].get("count") == 1
                   and devs[0].get("driver") == "nvidia"
                   and devs[0].get("capabilities") == ["gpu"],
                   "with the GPU override, %s must reserve one nvidia GPU, has %s" % (name, devs))
        elif name == "dcgm-exporter":  # watches every GPU, computes on none
            expect(len(devs) == 1 and devs[0].get("count") == "all",
                   "dcgm-exporter must see all GPUs, has %s" % devs)
        else:
            expect(not devs, "with the GPU override, %s reserves a GPU: %s" % (name, devs))
    expect("dcgm-exporter" in gpu, "the GPU override runs no dcgm-exporter")
    # The GPU Prometheus config is prometheus.yml plus the dcgm job, nothing else.
    gpu_prom_path = os.path.join(os.path.dirname(prometheus_path), "prometheus.gpu.yml")
    base, withgpu = load(prometheus_path), load(gpu_prom_path)
    extra = [j for j in withgpu.get("scrape_configs", []) if j.get("job_name") == "dcgm"]
    withgpu["scrape_configs"] = [j for j in withgpu.get("scrape_configs", [])
                                 if j.get("job_name") != "dcgm"]
    expect(extra and extra[0]["static_configs"][0]["targets"] == ["dcgm-exporter:9400"],
           "prometheus.gpu.yml: no dcgm job scraping dcgm-exporter:9400")
    expect(withgpu == base, "prometheus.gpu.yml differs from prometheus.yml beyond the dcgm job")
    gpu_prom = [v for v in (gpu.get("prometheus") or {}).get("volumes", [])
                if isinstance(v, str) and v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    expect(gpu_prom and "prometheus.gpu.yml" in gpu_prom[0],
           "the GPU override does not give Prometheus prometheus.gpu.yml: %s" % gpu_prom)

    # Coordinator flags, volume, published port, healthcheck.
    c = cpu[coord]
    f = flags(c["command"][1:])
    expect(f.get("listen") == "0.0.0.0:%d" % cg,
           "%s: --listen=%s, want 0.0.0.0:%d" % (coord, f.get("listen"), cg))
    expect(f.get("metrics_listen") == "0.0.0.0:%d" % cm,
           "%s: --metrics_listen=%s, want 0.0.0.0:%d" % (coord, f.get("metrics_listen"), cm))
    db_dir = os.path.dirname(f.get("db", ""))
    targets = [v.split(":")[1] for v in c.get("volumes", []) if isinstance(v, str)]
    targets += [v.get("target") for v in c.get("volumes", []) if isinstance(v, dict)]
    expect(db_dir in targets, "%s: --db directory %r is not a volume (%s)" % (coord, db_dir, targets))
    expect(security_ok(f), "%s: listens on 0.0.0.0 without TLS or --insecure (it would refuse "
                           "to start)" % coord)
    published = [str(p.get("target") if isinstance(p, dict) else p).split("/")[0].rsplit(":", 1)[-1]
                 for p in c.get("ports", [])]
    expect(str(cg) in published, "%s: gRPC port %d is not published (%s)" % (coord, cg, published))
    hc = " ".join(str(x) for x in (c.get("healthcheck") or {}).get("test") or [])
    expect("127.0.0.1:%d" % cg in hc, "%s: healthcheck %r does not probe port %d" % (coord, hc, cg))

    # Worker flags and healthchecks.
    for w in workers:
        f = flags(cpu[w]["command"][1:])
        want = {
            "coordinator": "%s:%d" % (coord, cg),
            "listen": "0.0.0.0:%d" % wg,
            "advertise": "%s:%d" % (w, wg),
            "worker_id": w,
            "metrics_listen": "0.0.0.0:%d" % wm,
        }
        for k, v in want.items():
            expect(f.get(k) == v, "%s: --%s=%s, want %s" % (w, k, f.get(k), v))
        expect(security_ok(f), "%s: listens on 0.0.0.0 without TLS or --insecure" % w)
        hc = " ".join(str(x) for x in (cpu[w].get("healthcheck") or {}).get("test") or [])
        expect("/%d" % wg in hc, "%s: healthcheck %r does not probe port %d" % (w, hc, wg))

    # Prometheus scrapes exactly the services' metrics ports.
    prom = load(prometheus_path)
    jobs = {j["job_name"]: sorted(t for sc in j.get("static_configs", []) for t in sc["targets"])
            for j in prom["scrape_configs"]}
    expect(jobs.get("baton-coordinator") == ["%s:%d" % (coord, cm)],
           "prometheus.yml: baton-coordinator targets %s, want %s:%d"
           % (jobs.get("baton-coordinator"), coord, cm))
    want = sorted("%s:%d" % (w, wm) for w in workers)
    expect(jobs.get("baton-worker") == want,
           "prometheus.yml: baton-worker targets %s, want %s" % (jobs.get("baton-worker"), want))
    mounts = [v for v in cpu["prometheus"].get("volumes", []) if isinstance(v, str)]
    for name in ("prometheus.yml", "rules.yml"):
        expect(any(m.split(":")[1] == "/etc/prometheus/" + name for m in mounts),
               "prometheus service: %s is not mounted at /etc/prometheus/%s" % (name, name))

    # Grafana: the dashboards are mounted where the provisioned provider reads them, and the
    # datasource names a compose service.
    mounts = {m.split(":")[0]: m.split(":")[1]
              for m in cpu["grafana"].get("volumes", []) if isinstance(m, str)}
    prov = os.path.realpath(os.path.join(grafana_dir, "provisioning"))
    dash = os.path.realpath(os.path.join(grafana_dir, "dashboards"))
    expect(mounts.get(prov) == "/etc/grafana/provisioning",
           "grafana: %s is not mounted at /etc/grafana/provisioning (%s)" % (prov, mounts))
    for path in glob.glob(os.path.join(prov, "dashboards", "*.y*ml")):
        for p in (load(path) or {}).get("providers", []):
            want = (p.get("options") or {}).get("path")
            expect(mounts.get(dash) == want, "grafana: dashboards mounted at %s, but %s reads %s"
                   % (mounts.get(dash), os.path.relpath(path), want))
    env = cpu["grafana"].get("environment") or {}
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home and mounts.get(dash):
        rel = os.path.relpath(home, mounts[dash])
        expect(os.path.isfile(os.path.join(dash, rel)),
               "grafana: the home dashboard %s is not a file of %s" % (home, dash))
    for path in glob.glob(os.path.join(prov, "datasources", "*.y*ml")):
        for ds in (load(path) or {}).get("datasources", []):
            m = re.match(r"https?://([^:/]+)", ds.get("url", ""))
            expect(m and m.group(1) in cpu, "grafana datasource %s: %s is not a compose service"
                   % (ds.get("name"), ds.get("url")))
    print("  %d services, %d workers, GPU reservations, ports %d/%d/%d/%d"
          % (len(cpu), len(workers), cg, cm, wg, wm))


# ---- Kubernetes -------------------------------------------------------------------------
def k8s_objects(k8s_dir):
    objs = []
    for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
        if os.path.basename(path) == "kustomization.yaml":
            continue
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    objs.append((os.path.basename(path), doc))
    return objs


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def container_ports(pod_spec):
    return {p["name"]: p["containerPort"] for c in pod_spec["containers"]
            for p in c.get("ports", []) if "name" in p}


def cmd_compose_tls(tls_path):
    services = load(tls_path)["services"]
    baton = {n: svc for n, svc in services.items()
             if (svc.get("command") or [None])[0] in ("coordinator", "worker")}
    expect(len(baton) >= 2, "the TLS override runs %d baton services" % len(baton))
    for name, svc in baton.items():
        f = flags(svc["command"][1:])
        expect("insecure" not in f and f.get("tls_cert") and f.get("tls_key") and f.get("tls_ca"),
               "%s: not on mutual TLS (%s)" % (name, svc["command"]))
        expect(f.get("join_token_file"), "%s: no --join_token_file" % name)
        targets = [str(v.get("target") if isinstance(v, dict) else v.split(":")[1])
                   for v in svc.get("volumes", [])]
        expect(not mounted_files(f, targets), "%s: %s not on a mounted volume (%s)"
               % (name, mounted_files(f, targets), targets))
        if svc["command"][0] == "coordinator":
            expect(f.get("auth_tokens"), "%s: no --auth_tokens" % name)
            hc = " ".join(str(x) for x in (svc.get("healthcheck") or {}).get("test") or [])
            expect("--tls_ca" in hc, "%s: healthcheck %r does not speak TLS" % (name, hc))


def cmd_k8s(k8s_dir, rules_path):
    ports = port_table()
    objs = k8s_objects(k8s_dir)
    by_kind = {}
    for _, o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o

    # kustomization.yaml lists every manifest, and only those.
    kust = load(os.path.join(k8s_dir, "kustomization.yaml"))
    files = {f for f, _ in objs}
    expect(set(kust.get("resources", [])) == files,
           "kustomization.yaml resources %s != manifests %s" % (kust.get("resources"), sorted(files)))
    kust_images = {i["name"] for i in kust.get("images", [])}

    workloads = [o for kind in ("Deployment", "StatefulSet") for o in by_kind.get(kind, {}).values()]
    baton = {}  # program -> workload
    for w in workloads:
        name = "%s/%s" % (w["kind"], w["metadata"]["name"])
        tmpl = w["spec"]["template"]
        spec = tmpl["spec"]
        expect(selects(w["spec"]["selector"]["matchLabels"], tmpl["metadata"].get("labels", {})),
               "%s: selector does not match its pod labels" % name)
        cports = container_ports(spec)
        all_ports = set(cports) | set(cports.values())
        for c in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                p = c.get(probe)
                if not p:
                    continue
                if "grpc" in p:
                    # The TLS port cannot answer Kubernetes' probes: the plaintext health
                    # port does.
                    expect(p["grpc"].get("port") == cports.get("health"),
                           "%s: %s grpc port %s != containerPort named health (%s)"
                           % (name, probe, p["grpc"].get("port"), cports.get("health")))
                for kind in ("httpGet", "tcpSocket"):
                    if kind in p:
                        expect(p[kind]["port"] in all_ports, "%s: %s port %s is not declared"
                               % (name, probe, p[kind]["port"]))
            args = c.get("args") or []
            if args and args[0] in ("coordinator", "worker"):
                expect(args[0] not in baton, "two workloads run %s" % args[0])
                baton[args[0]] = (w, c)
                image = c["image"].split(":")[0]
                expect(image in kust_images, "%s: image %s is not in kustomization.yaml images"
                       % (name, image))
        ann = tmpl["metadata"].get("annotations") or {}
        if ann.get("prometheus.io/scrape") == "true":
            expect(ann.get("prometheus.io/port") == str(cports.get("metrics")),
                   "%s: prometheus.io/port %s != containerPort named metrics (%s)"
                   % (name, ann.get("prometheus.io/port"), cports.get("metrics")))

    # Every Service selects the pods of one workload and targets ports they declare.
    svc_of = {}
    for s in by_kind.get("Service", {}).values():
        sel = s["spec"].get("selector") or {}
        matched = [w for w in workloads if selects(sel, w["spec"]["template"]["metadata"]["labels"])]
        if not expect(len(matched) == 1, "Service/%s selects %d workloads"
                      % (s["metadata"]["name"], len(matched))):
            continue
        w = matched[0]
        svc_of.setdefault(w["metadata"]["name"], []).append(s)
        cports = container_ports(w["spec"]["template"]["spec"])
        for p in s["spec"]["ports"]:
            t = p.get("targetPort", p["port"])
            expect(t in cports or t in cports.values(), "Service/%s: targetPort %s is not declared"
                   " by %s" % (s["metadata"]["name"], t, w["metadata"]["name"]))

    for program in ("coordinator", "worker"):
        if not expect(program in baton, "no workload runs %s" % program):
            return
    # Coordinator: one replica, Recreate, gRPC and metrics ports, database on a claim.
    w, c = baton["coordinator"]
    name = "%s/%s" % (w["kind"], w["metadata"]["name"])
    cp = container_ports(w["spec"]["template"]["spec"])
    cg, cm = ports[("coordinator", "grpc")], ports[("coordinator", "metrics")]
    expect(w["kind"] == "Deployment" and w["spec"].get("replicas") == 1
           and w["spec"].get("strategy", {}).get("type") == "Recreate",
           "%s: must be a Deployment of 1 replica with strategy Recreate (SQLite)" % name)
    expect(cp.get("grpc") == cg and cp.get("metrics") == cm, "%s: ports %s, want grpc %d metrics %d"
           % (name, cp, cg, cm))
    f = flags(c["args"][1:])
    expect(f.get("listen") == "0.0.0.0:%d" % cg, "%s: --listen=%s" % (name, f.get("listen")))
    expect(f.get("metrics_listen") == "0.0.0.0:%d" % cm,
           "%s: --metrics_listen=%s" % (name, f.get("metrics_listen")))
    ch = ports[("coordinator", "health")]
    expect(f.get("health_listen") == "0.0.0.0:%d" % ch and cp.get("health") == ch,
           "%s: --health_listen=%s and containerPort health %s, want %d"
           % (name, f.get("health_listen"), cp.get("health"), ch))
    expect(security_ok(f), "%s: listens on 0.0.0.0 without TLS or --insecure" % name)
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    expect(not mounted_files(f, mounts), "%s: %s not on a mounted volume"
           % (name, mounted_files(f, mounts)))
    vols = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes", [])}
    vol = vols.get(mounts.get(os.path.dirname(f.get("db", ""))), {})
    claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
    expect(claim in by_kind.get("PersistentVolumeClaim", {}),
           "%s: --db=%s is not on a PersistentVolumeClaim of these manifests" % (name, f.get("db")))
    coord_svcs = [s for s in svc_of.get(w["metadata"]["name"], [])
                  if s["spec"].get("clusterIP") != "None"]
    coord_addrs = {"%s:%d" % (s["metadata"]["name"], p["port"]) for s in coord_svcs
                   for p in s["spec"]["ports"] if p.get("targetPort") in ("grpc", cg)}

    # Workers: StatefulSet behind a headless Service, flags from the downward API, one GPU.
    w, c = baton["worker"]
    name = "%s/%s" % (w["kind"], w["metadata"]["name"])
    spec = w["spec"]
    cp = container_ports(spec["template"]["spec"])
    wg, wm = ports[("worker", "grpc")], ports[("worker", "metrics")]
    expect(w["kind"] == "StatefulSet" and spec.get("podManagementPolicy") == "Parallel",
           "%s: must be a StatefulSet with podManagementPolicy Parallel" % name)
    expect(cp.get("grpc") == wg and cp.get("metrics") == wm, "%s: ports %s, want grpc %d metrics %d"
           % (name, cp, wg, wm))
    headless = by_kind.get("Service", {}).get(spec.get("serviceName"), {})
    expect(headless.get("spec", {}).get("clusterIP") == "None"
           and headless in svc_of.get(w["metadata"]["name"], []),
           "%s: serviceName %s is not a headless Service selecting its pods"
           % (name, spec.get("serviceName")))
    env = {e["name"]: ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
           for e in c.get("env", [])}
    expect(env.get("POD_NAME") == "metadata.name", "%s: env POD_NAME is not metadata.name" % name)
    expect(env.get("POD_NAMESPACE") == "metadata.namespace",
           "%s: env POD_NAMESPACE is not metadata.namespace" % name)
    f = flags(c["args"][1:])
    want = {
        "listen": "0.0.0.0:%d" % wg,
        "advertise": "$(POD_NAME).%s.$(POD_NAMESPACE).svc:%d" % (spec.get("serviceName"), wg),
        "worker_id": "$(POD_NAME)",
        "metrics_listen": "0.0.0.0:%d" % wm,
    }
    for k, v in want.items():
        expect(f.get(k) == v, "%s: --%s=%s, want %s" % (name, k, f.get(k), v))
    wh = ports[("worker", "health")]
    wp = container_ports(spec["template"]["spec"])
    expect(f.get("health_listen") == "0.0.0.0:%d" % wh and wp.get("health") == wh,
           "%s: --health_listen=%s and containerPort health %s, want %d"
           % (name, f.get("health_listen"), wp.get("health"), wh))
    expect(security_ok(f), "%s: listens on 0.0.0.0 without TLS or --insecure" % name)
    wmounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
    expect(not mounted_files(f, wmounts), "%s: %s not on a mounted volume"
           % (name, mounted_files(f, wmounts)))
    expect(f.get("coordinator") in coord_addrs, "%s: --coordinator=%s is not the coordinator's"
           " gRPC Service (%s)" % (name, f.get("coordinator"), sorted(coord_addrs)))
    limits = (c.get("resources") or {}).get("limits") or {}
    expect(str(limits.get("nvidia.com/gpu")) == "1", "%s: limits nvidia.com/gpu is %s, want 1"
           % (name, limits.get("nvidia.com/gpu")))
    for prog, (wl, _) in baton.items():
        grace = wl["spec"]["template"]["spec"].get("terminationGracePeriodSeconds")
        expect(isinstance(grace, int) and grace >= 10, "%s %s: terminationGracePeriodSeconds %s"
               " leaves no time for the SIGTERM shutdown" % (prog, wl["metadata"]["name"], grace))

    # The Prometheus ConfigMap: its rules are deploy/prometheus/rules.yml's, and its jobs keep
    # the pods of the matching component.
    cms = [o for o in by_kind.get("ConfigMap", {}).values() if "prometheus.yml" in o.get("data", {})]
    if not expect(len(cms) == 1, "expected one ConfigMap with a prometheus.yml, found %d" % len(cms)):
        return
    data = cms[0]["data"]
    expect(yaml.safe_load(data.get("rules.yml", "")) == load(rules_path),
           "ConfigMap %s: rules.yml differs from %s" % (cms[0]["metadata"]["name"], rules_path))
    prom = yaml.safe_load(data["prometheus.yml"])
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for job, prog in (("baton-coordinator", "coordinator"), ("baton-worker", "worker")):
        if not expect(job in jobs, "ConfigMap prometheus.yml: no job %s" % job):
            continue
        component = baton[prog][0]["spec"]["template"]["metadata"]["labels"].get(
            "app.kubernetes.io/component")
        keeps = [r for r in jobs[job].get("relabel_configs", []) if r.get("action") == "keep"
                 and r.get("source_labels") ==
                 ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]]
        expect(keeps and re.fullmatch(keeps[0].get("regex", ""), component or ""),
               "ConfigMap prometheus.yml: job %s does not keep component %s" % (job, component))
    print("  %d objects; ports %d/%d/%d/%d" % (len(objs), cg, cm, wg, wm))


def cmd_k8s_prometheus(k8s_dir, out_dir):
    """Writes the ConfigMap's prometheus.yml and rules.yml to OUT_DIR for promtool.
    Debian's promtool is built without Kubernetes service discovery, so the
    kubernetes_sd_configs blocks are checked here and left out of the file promtool reads;
    everything else (relabelling, rule files, globals) promtool checks."""
    cms = [o for _, o in k8s_objects(k8s_dir)
           if o["kind"] == "ConfigMap" and "prometheus.yml" in o.get("data", {})]
    if len(cms) != 1:
        print("  expected one ConfigMap with a prometheus.yml, found %d" % len(cms))
        sys.exit(1)
    data = cms[0]["data"]
    prom = yaml.safe_load(data["prometheus.yml"])
    roles = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
    for job in prom.get("scrape_configs", []):
        for sd in job.pop("kubernetes_sd_configs", []):
            expect(sd.get("role") in roles, "job %s: kubernetes_sd role %r" % (job["job_name"],
                                                                               sd.get("role")))
            ns = sd.get("namespaces") or {}
            expect(set(ns) <= {"own_namespace", "names"}, "job %s: namespaces keys %s"
                   % (job["job_name"], sorted(ns)))
            expect(isinstance(ns.get("own_namespace", False), bool),
                   "job %s: own_namespace is not a boolean" % job["job_name"])
            extra = set(sd) - {"role", "namespaces", "selectors", "attach_metadata",
                               "api_server", "kubeconfig_file"}
            expect(not extra, "job %s: unknown kubernetes_sd keys %s" % (job["job_name"], extra))
    with open(os.path.join(out_dir, "prometheus.yml"), "w") as f:
        yaml.safe_dump(prom, f, sort_keys=False)
    for name, text in data.items():
        if name != "prometheus.yml":
            with open(os.path.join(out_dir, name), "w") as f:
                f.write(text)


# ---- Dockerfile -------------------------------------------------------------------------
def dockerfile_arg(text, name):
    m = re.search(r'^ARG %s="((?:[^"\\]|\\\n)*)"' % name, text, re.M)
    return m.group(1).replace("\\\n", " ").split() if m else None


def dpkg_owners(paths):
    """{path: package} for the paths dpkg knows (trying /lib and /usr/lib spellings)."""
    variants = {}
    for p in paths:
        for v in {p, os.path.realpath(p)}:
            variants[v] = p
            if v.startswith("/usr/lib/"):
                variants[v[4:]] = p
            elif v.startswith("/lib/"):
                variants["/usr" + v] = p
    out = subprocess.run(["dpkg-query", "-S"] + sorted(variants), capture_output=True, text=True)
    owners = {}
    for line in out.stdout.splitlines():
        pkgs, _, path = line.partition(": ")
        if path in variants:
            owners[variants[path]] = pkgs.split(",")[0].split(":")[0].strip()
    return owners


def installed_packages():
    fmt = "${Package}\t${Priority}\t${Essential}\t${Depends}\t${Pre-Depends}\t${Provides}\n"
    out = subprocess.run(["dpkg-query", "-W", "-f=" + fmt], capture_output=True, text=True,
                         check=True).stdout
    pkgs, provides = {}, {}
    for line in out.splitlines():
        name, prio, essential, dep, predep, prov = (line.split("\t") + [""] * 6)[:6]
        deps = [re.sub(r"[:\s(].*", "", alt.strip())
                for d in (dep + "," + predep).split(",") if d.strip() for alt in d.split("|")]
        pkgs[name] = (prio, essential, deps)
        for p in prov.split(","):
            if p.strip():
                provides.setdefault(re.sub(r"[\s(].*", "", p.strip()), []).append(name)
    return pkgs, provides


def closure(roots, pkgs, provides):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        for q in [p] + provides.get(p, []):
            if q in pkgs and q not in seen:
                seen.add(q)
                todo.extend(pkgs[q][2])
    return seen


def cmd_docker(dockerfile, setup_sh, bin_dir):
    ports = port_table()
    text = open(dockerfile).read()
    build = dockerfile_arg(text, "BUILD_PACKAGES")
    runtime = dockerfile_arg(text, "RUNTIME_PACKAGES")
    if not expect(build and runtime, "%s: no ARG BUILD_PACKAGES / RUNTIME_PACKAGES" % dockerfile):
        return
    # Build stage: every package scripts/setup.sh installs for building, but the ones the
    # image does not need.
    m = re.search(r"^PACKAGES=\((.*?)^\)", open(setup_sh).read(), re.M | re.S)
    setup = set(re.sub(r"#.*", "", m.group(1)).split()) if m else set()
    not_for_image = {"ccache", "python3", "python3-venv", "libbenchmark-dev", "prometheus",
                     "docker-compose", "yamllint", "clang", "libclang-rt-14-dev", "iproute2",
                     "openssl"}
    missing = sorted(setup - not_for_image - set(build))
    expect(setup and not missing, "Dockerfile BUILD_PACKAGES lacks %s from %s"
           % (missing, setup_sh))

    exposed = {int(p.split("/")[0]) for line in re.findall(r"^EXPOSE (.*)$", text, re.M)
               for p in line.split()}
    expect(set(ports.values()) <= exposed, "Dockerfile EXPOSE %s lacks ports of %s"
           % (sorted(exposed), sorted(ports.values())))

    # Runtime stage: every shared library the binaries link to comes from RUNTIME_PACKAGES
    # (or their dependencies, or the base image's required packages).
    bins = [os.path.join(bin_dir, b) for b in ("coordinator", "worker", "batonctl")]
    if not all(os.path.exists(b) for b in bins):
        print("  skipped the runtime-library check: %s has no coordinator/worker/batonctl"
              " (scripts/build.sh builds them)" % bin_dir)
        return
    libs = {}
    for b in bins:
        for line in subprocess.run(["ldd", b], capture_output=True, text=True).stdout.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if m:
                libs[m.group(2)] = m.group(1)
            elif "not found" in line:
                error("%s: %s" % (b, line.strip()))
    owners = dpkg_owners(list(libs))
    pkgs, provides = installed_packages()
    base = closure([p for p, (prio, ess, _) in pkgs.items() if prio == "required" or ess == "yes"],
                   pkgs, provides)
    image = closure(runtime, pkgs, provides) | base
    for path, soname in sorted(libs.items()):
        pkg = owners.get(path)
        if re.match(r"lib(a|ub|t|l)san\.so", soname):
            continue  # a sanitizer build (BATON_SANITIZE); the image is a plain Release build
        if pkg:
            expect(pkg in image, "%s (needed by %s) comes from %s, which RUNTIME_PACKAGES"
                   " does not bring in" % (soname, bin_dir, pkg))
        elif re.match(r"libcudart\.so", soname):
            expect(re.search(r"cuda-cudart-\$\{cuda_pkg\}", text),
                   "%s needed, but the runtime stage installs no cuda-cudart" % soname)
        elif re.match(r"libcublas(Lt)?\.so", soname):
            expect(re.search(r"libcublas-\$\{cuda_pkg\}", text),
                   "%s needed, but the runtime stage installs no libcublas" % soname)
        elif not soname.startswith("libcuda.so"):  # the driver's, from the host
            error("%s (%s): no Debian package provides it; the image would lack it"
                  % (soname, path))
    print("  %d build packages, %d runtime packages, %d libraries of %s"
          % (len(build), len(runtime), len(libs), bin_dir))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"compose": cmd_compose, "compose-tls": cmd_compose_tls, "k8s": cmd_k8s, "k8s-prometheus": cmd_k8s_prometheus,
     "docker": cmd_docker}[command](*args)
    sys.exit(1 if errors else 0)
PYEOF
checks() { "$PY" "$TMP/checks.py" "$@"; }

COMPOSE=deploy/compose/docker-compose.yml
COMPOSE_GPU=deploy/compose/docker-compose.gpu.yml
COMPOSE_TLS=deploy/compose/docker-compose.tls.yml
K8S_MANIFESTS=()
for f in deploy/k8s/*.yaml; do
  [[ "$(basename "$f")" == kustomization.yaml ]] || K8S_MANIFESTS+=("$f")
done

# ---- yamllint ---------------------------------------------------------------------------
check "yamllint deploy/" yamllint -s -c deploy/.yamllint.yml deploy/

# ---- compose ----------------------------------------------------------------------------
check "docker-compose config: base (CPU)" docker-compose -f "$COMPOSE" config -q
check "docker-compose config: base + GPU override" \
  docker-compose -f "$COMPOSE" -f "$COMPOSE_GPU" config -q
check "docker-compose config: base + TLS override" \
  docker-compose -f "$COMPOSE" -f "$COMPOSE_TLS" config -q
compose_tls() {
  docker-compose -f "$COMPOSE" -f "$COMPOSE_TLS" config >"$TMP/compose-tls.yml" &&
    checks compose-tls "$TMP/compose-tls.yml"
}
check "compose TLS: every baton service on mutual TLS, files on the mounted volume" compose_tls
compose_consistency() {
  docker-compose -f "$COMPOSE" config >"$TMP/compose-cpu.yml" &&
    docker-compose -f "$COMPOSE" -f "$COMPOSE_GPU" config >"$TMP/compose-gpu.yml" &&
    checks compose "$TMP/compose-cpu.yml" "$TMP/compose-gpu.yml" \
      deploy/prometheus/prometheus.yml deploy/grafana
}
check "compose: GPU reservations, flags and ports" compose_consistency

# ---- Prometheus -------------------------------------------------------------------------
check "promtool check config deploy/prometheus/prometheus.yml" \
  promtool check config deploy/prometheus/prometheus.yml
check "promtool check config deploy/prometheus/prometheus.gpu.yml" \
  promtool check config deploy/prometheus/prometheus.gpu.yml
check "promtool check rules deploy/prometheus/rules.yml" \
  promtool check rules deploy/prometheus/rules.yml
check "promtool test rules deploy/prometheus/rules.test.yml" \
  promtool test rules deploy/prometheus/rules.test.yml

# ---- Kubernetes -------------------------------------------------------------------------
for version in "${K8S_VERSIONS[@]}"; do
  check "kubernetes-validate --strict -k $version" \
    "$TOOLS_BIN/kubernetes-validate" --strict --quiet -k "$version" "${K8S_MANIFESTS[@]}"
done
check "k8s: flags, probes, Services and annotations" \
  checks k8s deploy/k8s deploy/prometheus/rules.yml
k8s_promtool() {
  mkdir -p "$TMP/k8s-prometheus" &&
    checks k8s-prometheus deploy/k8s "$TMP/k8s-prometheus" &&
    promtool check config "$TMP/k8s-prometheus/prometheus.yml"
}
check "promtool check config: the k8s Prometheus ConfigMap" k8s_promtool

# ---- Docker image -----------------------------------------------------------------------
check "Dockerfile: packages, libraries and ports" \
  checks docker deploy/docker/Dockerfile scripts/setup.sh build/bin
entrypoint() {
  sh -n deploy/docker/entrypoint.sh || return 1
  # Stand-in programs that print how they were called, including one the entrypoint must
  # refuse to run.
  local bin="$TMP/fake-bin" out
  mkdir -p "$bin"
  for program in coordinator worker batonctl no-such-program; do
    printf '#!/bin/sh\necho "%s $*"\n' "$program" >"$bin/$program"
    chmod +x "$bin/$program"
  done
  out="$(BATON_BIN_DIR="$bin" sh deploy/docker/entrypoint.sh worker --listen=0.0.0.0:7071)" ||
    true
  if [[ "$out" != "worker --listen=0.0.0.0:7071" ]]; then
    echo "  'worker --listen=0.0.0.0:7071' ran: ${out:-nothing}"
    return 1
  fi
  if out="$(BATON_BIN_DIR="$bin" sh deploy/docker/entrypoint.sh no-such-program 2>/dev/null)" ||
    [[ -n "$out" ]]; then
    echo "  the entrypoint ran an unknown program: ${out:-(exit 0)}"
    return 1
  fi
  if BATON_BIN_DIR="$bin" sh deploy/docker/entrypoint.sh >/dev/null 2>&1; then
    echo "  the entrypoint exited 0 without a program"
    return 1
  fi
  # The real batonctl, when built.
  if [[ -x build/bin/batonctl ]]; then
    BATON_BIN_DIR=build/bin sh deploy/docker/entrypoint.sh batonctl --help >/dev/null ||
      { echo "  the entrypoint did not run build/bin/batonctl"; return 1; }
  fi
}
check "docker entrypoint" entrypoint

echo
if [[ $failed -gt 0 ]]; then
  printf 'failed: %s\n' "${failed_names[@]}"
fi
echo "deploy: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

#!/usr/bin/env python3
"""Checks komputed's deployment files: docker/, helm/komputed/ and deploy/.

    check_deploy.py SOURCE_DIR [--build-dir BUILD_DIR]

Sections (each prints PASS, FAIL or SKIP lines, then one closing "N passed, N failed, N skipped"):
  flags      the flags the daemon accepts: BUILD_DIR/server/komputed --helpfull where it is built,
             else the ABSL_FLAG definitions under server/ and the authentication flags
             (--tenants_file, --tls_cert, --tls_key, --tls_client_ca, --insecure and
             --default_quota_<name> for each quota of server/src/tenants.cc QuotaFields()).
  kustomize  deploy/base and both overlays render with `kubectl kustomize` (kustomize v4 or later),
             with no warning.
  yamllint   every plain YAML file (helm's Chart.yaml, values.yaml, ci/*.yaml; deploy/**; docker/**)
             passes `yamllint -s -c tests/deploy/yamllint.yaml`. Helm templates are not YAML until
             rendered and are left out.
  objects    the objects that each overlay renders: every container has startup, liveness and
             readiness probes that are native gRPC probes (service "") on the port that the
             daemon's --health_listen names (plaintext grpc.health.v1 alone, since the kubelet's
             gRPC probe has no TLS; never the --listen port, TLS or not, nor a TCP probe, which
             sees neither draining nor a lost device), that port a declared container port (named
             health) apart from the --listen and --metrics_listen ones, on 0.0.0.0; resource
             requests and a memory limit, a strict
             securityContext (runAsNonRoot, read-only root filesystem, no privilege escalation,
             capabilities drop ALL, RuntimeDefault seccomp); every object carries the labels
             app.kubernetes.io/name and app.kubernetes.io/instance; terminationGracePeriodSeconds
             is above the flag file's --drain_timeout; the Services select the pods and name their
             ports; GPU scheduling is in the gpu overlay and nowhere in the cpu one. Access: every
             flag of the flag file is one the daemon accepts (section flags); the daemon serves
             TLS (--tls_cert with --tls_key) and authenticates (--tenants_file or
             --tls_client_ca), without --insecure; each file flag names a key of a Secret that is
             mounted read-only as a folder (no subPath, which the kubelet never updates); a
             NetworkPolicy selects the pods, and each of its ingress rules names its peers and
             only container ports. A self-test breaks rendered copies (a probe removed, a probe
             on the TLS gRPC port, a TCP probe, --health_listen removed or moved, the health
             container port removed, a limit removed, a Secret mounted through subPath, --insecure
             added, an unknown flag, the NetworkPolicy removed, ...) and copies of deploy/ (the
             readiness probe deleted from daemonset.yaml, --health_listen from komputed.flags),
             and asserts that the check then fails.
  helm       the chart without helm: one resource kind per template file, balanced template
             blocks, every .Values path defined in values.yaml, every values.yaml key commented,
             every include defined, the ci/*-values.yaml scenarios' keys defined, optional pieces
             behind their *.enabled flag, strict security defaults (TLS and the NetworkPolicy on,
             insecure off, a `fail` that names tls.existingSecret, auth.tenants.existingSecret,
             tls.clientCA.enabled and insecure=true), the chart's quota names those of the daemon,
             the same daemon settings as deploy/base.
  helm-render where Debian's Go and Sprig packages are installed: tests/deploy/helmrender renders
             each ci/*-values.yaml scenario as Helm would (text/template + Sprig) and the objects
             pass the same checks as the overlays (gRPC probes on the --health_listen port in
             every scenario, TLS or not; --insecure and plaintext only where the scenario
             sets insecure; the Secret, ServiceMonitor and NetworkPolicy exactly where asked for;
             auth.defaultQuota as --default_quota_<name>); the defaults alone, and values short of
             TLS or authentication, are refused with a message naming the value to set; the
             defaults with the two Secrets give the TLS and tenants flags and mounts and the
             NetworkPolicy, and probes and --health_listen on config.healthPort (also when it is
             moved); a config.healthPort equal to the gRPC port is refused; insecure=true alone
             renders --insecure; a 78-character release name stays within 63; values that break a
             rule fail (self-test).
  docker     every RUN step calls only scripts/setup, cmake, apt-get, docker/runtime-packages.sh or
             a few base tools; COPY sources exist and cover the folders CMakeLists.txt adds; the
             final stage installs no -dev package, runs as uid 10001, exposes 50051 and 9464 and
             starts komputed listening on 0.0.0.0; the ICD file parses and names
             libEGL_nvidia.so.0; the runtime packages have Debian candidates (skipped when the apt
             lists are empty) and cover every shared library of a built komputed (skipped when
             BUILD_DIR/server/komputed does not exist).
  metrics    the Grafana dashboard parses and queries every komputed metric and no other, rate()
             only on counters, only defined variables; the Prometheus scrape config parses and
             keeps komputed's metrics ports; where promtool exists, `promtool check config` passes
             and promtool parses every dashboard query; where server/ sources name komputed_*
             metrics, the dashboard's are among them.

Needs python3 with PyYAML (Debian: python3-yaml), yamllint, and kubectl with kustomize v4 or later;
a section whose tool is missing is skipped with the reason. Exit status 1 when a check failed.
"""

import argparse
import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # The PATH's python3 may lack PyYAML where Debian's python3 has it.
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath(
            "/usr/bin/python3") and not os.environ.get("CHECK_DEPLOY_REEXEC"):
        os.environ["CHECK_DEPLOY_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    yaml = None

# The daemon's metrics (the contract with server/'s metrics table). Histograms also expose
# NAME_bucket, NAME_sum and NAME_count.
METRICS = {
    "komputed_rpcs_total": "counter",
    "komputed_rpc_duration_seconds": "histogram",
    "komputed_sessions_open": "gauge",
    "komputed_sessions_opened_total": "counter",
    "komputed_sessions_reaped_total": "counter",
    "komputed_device_memory_used_bytes": "gauge",
    "komputed_device_memory_limit_bytes": "gauge",
    "komputed_submissions_total": "counter",
    "komputed_gpu_execution_seconds_total": "counter",
    "komputed_queue_depth": "gauge",
    "komputed_bytes_transferred_total": "counter",
    "komputed_shader_compilations_total": "counter",
    "komputed_shader_validations_total": "counter",
    "komputed_device_losses_total": "counter",
    "komputed_device_recoveries_total": "counter",
}

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
WORKLOAD_KINDS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob", "Pod"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PriorityClass", "RuntimeClass", "StorageClass"}
# What the image's ENTRYPOINT passes when the flag file does not say (docker/Dockerfile*).
IMAGE_DEFAULT_FLAGS = {"listen": "0.0.0.0:50051", "metrics_listen": "0.0.0.0:9464"}
DAEMON_DEFAULT_DRAIN = "25s"
GPU_RESOURCE = "nvidia.com/gpu"


class Report:
    """Collects check results and prints them as they come."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def result(self, section, name, errors):
        if errors:
            self.failed += 1
            print(f"FAIL {section}: {name}")
            for e in errors:
                print(f"       {e}")
        else:
            self.passed += 1
            print(f"PASS {section}: {name}")
        sys.stdout.flush()

    def skip(self, section, name, reason):
        self.skipped += 1
        print(f"SKIP {section}: {name} ({reason})")
        sys.stdout.flush()


def run(cmd, cwd=None):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ------------------------------------------------------------------------------------------------
# kustomize


def kustomize_version():
    """Returns (major, text) of kubectl's embedded kustomize, or (None, why)."""
    if not shutil.which("kubectl"):
        return None, "kubectl is not installed"
    rc, out, err = run(["kubectl", "version", "--client"])
    m = re.search(r"Kustomize Version:\s*v?(\d+)\.(\d+)", out + err)
    if not m:
        return None, "kubectl prints no Kustomize version (too old): need kubectl 1.21 or later"
    return int(m.group(1)), m.group(0)


def render(path):
    """Returns (objects or None, errors) for `kubectl kustomize path`."""
    rc, out, err = run(["kubectl", "kustomize", path])
    errors = []
    if rc != 0:
        return None, [f"kubectl kustomize {path} exited {rc}: {err.strip()}"]
    if err.strip():
        errors.append(f"kubectl kustomize {path} warned: {err.strip()}")
    if yaml is None:
        return None, errors
    try:
        objs = [o for o in yaml.safe_load_all(out) if o]
    except yaml.YAMLError as e:
        return None, errors + [f"rendered {path} does not parse: {e}"]
    return objs, errors


# ------------------------------------------------------------------------------------------------
# objects


def parse_duration_seconds(text):
    """absl/Go duration ("25s", "1m30s", "500ms", "1h") in seconds, or None."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    text = text.strip()
    if text in ("0", "inf"):
        return 0.0 if text == "0" else float("inf")
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", text)
    if not parts or "".join(a + b for a, b in parts) != text:
        return None
    return sum(float(a) * units[b] for a, b in parts)


def parse_flagfile(text):
    """absl flag file: one --name=value a line, '#' lines are comments. Returns (flags, errors)."""
    flags, errors = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", s)
        if not m:
            errors.append(f"flag file line {n} is not --name=value: {s!r}")
            continue
        flags[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return flags, errors


def host_port(value):
    m = re.fullmatch(r"(.*):(\d+)", value or "")
    return (m.group(1), int(m.group(2))) if m else (None, None)


def pod_spec_of(obj):
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get(
            "spec") or {}
    return (spec.get("template") or {}).get("spec") or {}


def pod_labels_of(obj):
    if obj.get("kind") == "Pod":
        return (obj.get("metadata") or {}).get("labels") or {}
    spec = obj.get("spec") or {}
    if obj.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    return ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}


def effective(container_sc, pod_sc, key):
    if key in (container_sc or {}):
        return container_sc[key]
    return (pod_sc or {}).get(key)


def daemon_flags(obj, pod, container, configmaps):
    """The daemon's flags: the image's defaults, then each --flagfile's, then the args."""
    flags, errors = dict(IMAGE_DEFAULT_FLAGS), []
    mounts = {m.get("mountPath", "").rstrip("/"): m.get("name")
              for m in container.get("volumeMounts") or []}
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for arg in (container.get("command") or [])[1:] + (container.get("args") or []):
        m = re.fullmatch(r"--?flagfile=(.*)", arg)
        if m:
            path = m.group(1)
            directory, key = os.path.dirname(path), os.path.basename(path)
            vol = volumes.get(mounts.get(directory))
            cm_name = ((vol or {}).get("configMap") or {}).get("name")
            cm = configmaps.get(cm_name)
            if cm is None or key not in (cm.get("data") or {}):
                errors.append(f"{path}: no ConfigMap mounted at {directory} with key {key}")
                continue
            more, errs = parse_flagfile(cm["data"][key])
            flags.update(more)
            errors += errs
            continue
        m = re.fullmatch(r"--?([A-Za-z0-9_]+)=(.*)", arg)
        if m:
            flags[m.group(1)] = m.group(2)
    return flags, errors


# Flags of the authentication contract (tenants, TLS, --insecure; --default_quota_<name> for each
# quota of server/src/tenants.h), known before server/main.cc defines them.
AUTH_FLAGS = ("tenants_file", "tls_cert", "tls_key", "tls_client_ca", "insecure")
ABSL_BUILTIN_FLAGS = {"flagfile", "fromenv", "tryfromenv", "undefok", "help", "helpfull",
                      "helpshort", "helppackage", "helpon", "helpmatch", "version",
                      "only_check_args"}
# Flags whose value is a file that the daemon reads from a mounted Secret.
SECRET_FILE_FLAGS = ("tenants_file", "tls_cert", "tls_key", "tls_client_ca")
ABSL_FLAG_RE = re.compile(r"ABSL_FLAG\(\s*(?:[^,()<>]|<[^<>]*>)+,\s*([A-Za-z0-9_]+)\s*,")


def quota_names(src):
    """The quota names, in order: tenants.cc's QuotaFields() where it lists them, else the fields
    of tenants.h's struct Quota. Returns (names, where)."""
    cc = os.path.join(src, "server", "src", "tenants.cc")
    if os.path.isfile(cc):
        m = re.search(r"QuotaFields\(\)\s*{(.*?)\n}", read(cc), re.S)
        names = re.findall(r'{\s*"([a-z0-9_]+)"\s*,\s*&Quota::', m.group(1)) if m else []
        if names:
            return names, "server/src/tenants.cc QuotaFields()"
    h = os.path.join(src, "server", "src", "tenants.h")
    if os.path.isfile(h):
        m = re.search(r"struct Quota\s*{(.*?)};", read(h), re.S)
        if m:
            return (re.findall(r"uint64_t\s+([a-z0-9_]+)\s*=", m.group(1)),
                    "server/src/tenants.h struct Quota")
    return [], "no server/src/tenants.h"


def daemon_flag_names(src, build_dir):
    """(flag names the daemon accepts, where they come from, errors). The built daemon's
    --helpfull when BUILD_DIR/server/komputed exists (what would run), else the ABSL_FLAG
    definitions under server/ plus the authentication contract's flags."""
    daemon = os.path.join(build_dir, "server", "komputed") if build_dir else None
    if daemon and os.path.isfile(daemon) and os.access(daemon, os.X_OK):
        try:
            p = subprocess.run([daemon, "--helpfull"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{daemon} --helpfull", [f"{daemon} --helpfull: {e}"]
        names = set(re.findall(r"(?m)^\s*--([A-Za-z0-9_]+) \(", p.stdout + p.stderr))
        if "listen" not in names:
            return None, f"{daemon} --helpfull", [
                f"{daemon} --helpfull lists no --listen (exit {p.returncode}): "
                f"{(p.stdout + p.stderr).strip()[:300]}"]
        return names | ABSL_BUILTIN_FLAGS, f"{os.path.relpath(daemon, build_dir)} --helpfull", []
    names = set()
    for f in glob.glob(os.path.join(src, "server", "**", "*.cc"), recursive=True):
        names |= set(ABSL_FLAG_RE.findall(read(f)))
    if not names:
        return None, "server/ sources", ["no ABSL_FLAG definition found under server/"]
    quotas, _ = quota_names(src)
    names |= set(AUTH_FLAGS) | {f"default_quota_{q}" for q in quotas}
    return names | ABSL_BUILTIN_FLAGS, ("ABSL_FLAG definitions under server/ and the "
                                         "authentication flags"), []


# What the rendered objects must do about access. tls: the gRPC port serves TLS; insecure:
# --insecure (no authentication) is allowed; network_policy: a NetworkPolicy guards the pods.
SECURE = {"tls": True, "insecure": False, "network_policy": True}


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def secret_file_errors(cname, flag, path, container, pod, secrets):
    """A file flag's path must be a key of a Secret mounted read-only as a whole folder."""
    errors = []
    directory, key = os.path.dirname(path), os.path.basename(path)
    mounts = [m for m in container.get("volumeMounts") or []
              if m.get("mountPath", "").rstrip("/") in (directory, path)]
    if not mounts:
        return [f"{cname}: --{flag}={path}: no volume is mounted at {directory}"]
    m = mounts[0]
    vol = next((v for v in pod.get("volumes") or [] if v.get("name") == m.get("name")), None)
    sec = (vol or {}).get("secret")
    if sec is None:
        return [f"{cname}: --{flag}={path}: the volume {m.get('name')} at {directory} is not a "
                "Secret"]
    if m.get("subPath") or m.get("subPathExpr") or m.get("mountPath", "").rstrip("/") == path:
        errors.append(f"{cname}: --{flag}: the Secret {sec.get('secretName')} is mounted with "
                      "subPath, which the kubelet never updates (a rotated key would not reach "
                      "the daemon): mount the Secret as a folder")
    if m.get("readOnly") is not True:
        errors.append(f"{cname}: --{flag}: the Secret mount {m.get('mountPath')} is not readOnly")
    secret_key = key
    if sec.get("items"):
        item = next((i for i in sec["items"] if i.get("path") == key), None)
        if item is None:
            errors.append(f"{cname}: --{flag}: the Secret volume's items put no file at {key}")
        else:
            secret_key = item.get("key")
    obj = secrets.get(sec.get("secretName"))
    if obj is not None and secret_key not in {**(obj.get("data") or {}),
                                              **(obj.get("stringData") or {})}:
        errors.append(f"{cname}: --{flag}: the rendered Secret {sec.get('secretName')} has no "
                      f"key {secret_key}")
    return errors


def security_errors(objs, flags_of, known_flags, security):
    """Authentication, TLS, Secret mounts, flags and NetworkPolicy of rendered objects.
    flags_of: [(workload name, pod spec, pod labels, container name, container, flags)]."""
    errors = []
    secrets = {(o.get("metadata") or {}).get("name"): o for o in objs if o.get("kind") == "Secret"}
    policies = [o for o in objs if o.get("kind") == "NetworkPolicy"]
    for wname, pod, labels, cname, c, flags in flags_of:
        if known_flags is not None:
            for name in sorted(flags):
                if name not in known_flags:
                    errors.append(f"{cname}: --{name} is no flag of the daemon (it would refuse "
                                  "to start)")
        insecure = flags.get("insecure", "false") not in ("false", "0")
        if insecure and not security["insecure"]:
            errors.append(f"{cname}: --insecure is set (no authentication) where it was not asked "
                          "for")
        if not insecure and not (flags.get("tenants_file") or flags.get("tls_client_ca")):
            errors.append(f"{cname}: listens on 0.0.0.0 with neither --tenants_file nor "
                          "--tls_client_ca, and without --insecure: the daemon refuses to start")
        if bool(flags.get("tls_cert")) != bool(flags.get("tls_key")):
            errors.append(f"{cname}: --tls_cert and --tls_key go together")
        if flags.get("tls_client_ca") and not flags.get("tls_cert"):
            errors.append(f"{cname}: --tls_client_ca without --tls_cert")
        if security["tls"] and not flags.get("tls_cert"):
            errors.append(f"{cname}: no --tls_cert: the gRPC port serves plaintext")
        for flag in SECRET_FILE_FLAGS:
            if flags.get(flag):
                errors += secret_file_errors(cname, flag, flags[flag], c, pod, secrets)
        ports = set()
        for p in c.get("ports") or []:
            ports |= {p.get("name"), p.get("containerPort")}
        selecting = [p for p in policies if labels_match(
            ((p.get("spec") or {}).get("podSelector") or {}).get("matchLabels"), labels)]
        if security["network_policy"] and not selecting:
            errors.append(f"{wname}: no NetworkPolicy selects its pods")
        for p in selecting:
            pname = f"NetworkPolicy/{(p.get('metadata') or {}).get('name')}"
            spec = p.get("spec") or {}
            if "Ingress" not in (spec.get("policyTypes") or []):
                errors.append(f"{pname}: policyTypes lacks Ingress")
            for n, rule in enumerate(spec.get("ingress") or []):
                if not rule.get("from"):
                    errors.append(f"{pname}: ingress rule {n} has no 'from': open to every peer")
                if not rule.get("ports"):
                    errors.append(f"{pname}: ingress rule {n} has no 'ports': opens every port")
                for port in rule.get("ports") or []:
                    if port.get("port") not in ports:
                        errors.append(f"{pname}: ingress rule {n} port {port.get('port')} is no "
                                      f"container port of {cname}")
    return errors


PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def probe_errors(cname, c, health_port, grpc_port, tls):
    """Native gRPC probes on the --health_listen port: the daemon serves grpc.health.v1 alone
    there, in plaintext, which the kubelet's gRPC probe (no TLS) can speak whether or not the
    --listen port serves TLS. A TCP probe would see that the daemon listens, not whether it drains
    or has a usable device."""
    errors = []
    for probe in PROBES:
        p = c.get(probe)
        if not p:
            errors.append(f"{cname}: no {probe}")
            continue
        others = [k for k in ("httpGet", "tcpSocket", "exec") if k in p]
        g = p.get("grpc")
        if not isinstance(g, dict):
            errors.append(f"{cname}: {probe} is not a native gRPC probe ({others or 'no action'}): "
                          "a TCP, HTTP or exec probe cannot see draining or a lost device")
            continue
        if others:
            errors.append(f"{cname}: {probe} has {others} besides grpc")
        port = g.get("port")
        if health_port is None:
            errors.append(f"{cname}: {probe} gRPC port {port}: there is no --health_listen port "
                          "to probe")
        elif port != health_port:
            why = ""
            if port == grpc_port:
                why = (" (it is the --listen port, which serves TLS: the kubelet's gRPC probe "
                       "has no TLS and never passes)" if tls else " (it is the --listen port)")
            errors.append(f"{cname}: {probe} gRPC port {port} is not the --health_listen port "
                          f"{health_port}{why}")
        if g.get("service", "") != "":
            errors.append(f"{cname}: {probe} asks for health service "
                          f"{g.get('service')!r}; the daemon reports the overall one, \"\"")
    return errors


def check_objects(objs, variant, known_flags=None, security=None):
    """Structural rules over rendered objects; returns a list of errors (empty: all good)."""
    errors = []
    where = {}
    configmaps = {}
    namespaces = set()
    for o in objs:
        md = o.get("metadata") or {}
        name = f"{o.get('kind')}/{md.get('name')}"
        where[id(o)] = name
        labels = md.get("labels") or {}
        for label in (NAME_LABEL, INSTANCE_LABEL):
            if not labels.get(label):
                errors.append(f"{name}: label {label} missing")
        if o.get("kind") == "ConfigMap":
            configmaps[md.get("name")] = o
        if o.get("kind") == "Namespace":
            namespaces.add(md.get("name"))
    for o in objs:
        if o.get("kind") not in CLUSTER_SCOPED:
            ns = (o.get("metadata") or {}).get("namespace")
            if not ns:
                errors.append(f"{where[id(o)]}: no namespace")
            elif namespaces and ns not in namespaces:
                errors.append(f"{where[id(o)]}: namespace {ns} is not the rendered Namespace")

    workloads = [o for o in objs if o.get("kind") in WORKLOAD_KINDS]
    if not any(o.get("kind") == "DaemonSet" for o in workloads):
        errors.append("no DaemonSet rendered")
    for kind in ("Namespace", "ServiceAccount", "ConfigMap", "Service"):
        if not any(o.get("kind") == kind for o in objs):
            errors.append(f"no {kind} rendered")

    pod_ports = []  # (labels, {port name or number})
    flags_of = []  # (workload, pod, labels, container name, container, flags) of each daemon
    for w in workloads:
        wname = where[id(w)]
        pod = pod_spec_of(w)
        labels = pod_labels_of(w)
        for label in (NAME_LABEL, INSTANCE_LABEL):
            if not labels.get(label):
                errors.append(f"{wname}: pod template label {label} missing")
        if w.get("kind") != "Pod":
            selector = ((w.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if not selector:
                errors.append(f"{wname}: no selector.matchLabels")
            for k, v in selector.items():
                if labels.get(k) != v:
                    errors.append(f"{wname}: selector {k}={v} does not match the pod template")
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key):
                errors.append(f"{wname}: {key} is on")
        for v in pod.get("volumes") or []:
            if "hostPath" in v:
                errors.append(f"{wname}: hostPath volume {v.get('name')}")
        if pod.get("automountServiceAccountToken") is not False:
            errors.append(f"{wname}: automountServiceAccountToken is not false")
        pod_sc = pod.get("securityContext") or {}
        grace = pod.get("terminationGracePeriodSeconds")
        containers = pod.get("containers") or []
        if not containers:
            errors.append(f"{wname}: no containers")
        ports = set()
        for is_init, c in ([(True, c) for c in pod.get("initContainers") or []] +
                           [(False, c) for c in containers]):
            cname = f"{wname} container {c.get('name')}"
            sc = c.get("securityContext") or {}
            if effective(sc, pod_sc, "runAsNonRoot") is not True:
                errors.append(f"{cname}: runAsNonRoot is not true")
            if effective(sc, pod_sc, "runAsUser") == 0:
                errors.append(f"{cname}: runAsUser is 0")
            if sc.get("readOnlyRootFilesystem") is not True:
                errors.append(f"{cname}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                errors.append(f"{cname}: allowPrivilegeEscalation is not false")
            if sc.get("privileged"):
                errors.append(f"{cname}: privileged")
            caps = sc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                errors.append(f"{cname}: capabilities.drop does not name ALL")
            if caps.get("add"):
                errors.append(f"{cname}: capabilities.add {caps['add']}")
            seccomp = (effective(sc, pod_sc, "seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                errors.append(f"{cname}: seccompProfile is {seccomp!r}, not RuntimeDefault")
            res = c.get("resources") or {}
            for part, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
                for k in keys:
                    if not (res.get(part) or {}).get(k):
                        errors.append(f"{cname}: resources.{part}.{k} missing")
            image = c.get("image") or ""
            if not re.search(r"(:[\w.-]+|@sha256:[0-9a-f]{64})$", image.split("/")[-1]):
                errors.append(f"{cname}: image {image!r} has no tag or digest")
            elif image.endswith(":latest"):
                errors.append(f"{cname}: image {image!r} uses :latest")
            if is_init:
                continue
            cports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
            ports |= set(cports) | set(cports.values())
            flags, ferrs = daemon_flags(w, pod, c, configmaps)
            errors += [f"{cname}: {e}" for e in ferrs]
            host, grpc_port = host_port(flags.get("listen"))
            mhost, metrics_port = host_port(flags.get("metrics_listen"))
            hhost, health_port = host_port(flags.get("health_listen"))
            for flag, h in (("listen", host), ("metrics_listen", mhost),
                            ("health_listen", hhost)):
                if flag == "health_listen" and health_port is None:
                    continue
                if h not in ("0.0.0.0", "[::]", ""):
                    errors.append(f"{cname}: --{flag}={flags.get(flag)} is not reachable from "
                                  "outside the pod (listen on 0.0.0.0)")
            if cports.get("grpc") != grpc_port:
                errors.append(f"{cname}: container port 'grpc' ({cports.get('grpc')}) is not the "
                              f"--listen port ({grpc_port})")
            if cports.get("metrics") != metrics_port:
                errors.append(f"{cname}: container port 'metrics' ({cports.get('metrics')}) is "
                              f"not the --metrics_listen port ({metrics_port})")
            if health_port is None:
                errors.append(f"{cname}: no --health_listen=0.0.0.0:PORT (is "
                              f"{flags.get('health_listen')!r}): the probes need the daemon's "
                              "plaintext health port")
            else:
                if health_port not in cports.values():
                    errors.append(f"{cname}: the --health_listen port {health_port} is no "
                                  f"declared container port (ports: {cports})")
                if "health" in cports and cports["health"] != health_port:
                    errors.append(f"{cname}: container port 'health' ({cports['health']}) is not "
                                  f"the --health_listen port ({health_port})")
                if health_port in (grpc_port, metrics_port):
                    errors.append(f"{cname}: the --health_listen port {health_port} is also the "
                                  "--listen or --metrics_listen port (the daemon cannot bind it "
                                  "twice)")
            errors += probe_errors(cname, c, health_port, grpc_port, bool(flags.get("tls_cert")))
            flags_of.append((wname, pod, labels, cname, c, flags))
            drain_text = flags.get("drain_timeout", DAEMON_DEFAULT_DRAIN)
            drain = parse_duration_seconds(drain_text)
            if drain is None:
                errors.append(f"{cname}: --drain_timeout={drain_text} is not a duration")
            elif not isinstance(grace, int):
                errors.append(f"{wname}: terminationGracePeriodSeconds is not set "
                              f"(must be above --drain_timeout={drain_text})")
            elif grace <= drain:
                errors.append(f"{wname}: terminationGracePeriodSeconds {grace} is not above "
                              f"--drain_timeout={drain_text}")
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            limits = (c.get("resources") or {}).get("limits") or {}
            repo = image.split("@")[0].rsplit(":", 1)[0].split("/")[-1] if image else ""
            if variant == "gpu":
                count = str(limits.get(GPU_RESOURCE, "0"))
                if not count.isdigit() or int(count) < 1:
                    errors.append(f"{cname}: no {GPU_RESOURCE} limit")
                caps_env = set((env.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(","))
                if not {"compute", "graphics"} <= caps_env and "all" not in caps_env:
                    errors.append(f"{cname}: NVIDIA_DRIVER_CAPABILITIES must name compute and "
                                  "graphics (Vulkan), is "
                                  f"{env.get('NVIDIA_DRIVER_CAPABILITIES')!r}")
                if repo != "komputed":
                    errors.append(f"{cname}: image {image!r} is not the GPU image komputed")
            if variant == "cpu":
                if repo != "komputed-cpu":
                    errors.append(f"{cname}: image {image!r} is not the CPU image komputed-cpu")
        if variant == "gpu":
            if (pod.get("nodeSelector") or {}).get("nvidia.com/gpu.present") != "true":
                errors.append(f"{wname}: nodeSelector lacks nvidia.com/gpu.present: \"true\"")
            if not any(t.get("key") == GPU_RESOURCE for t in pod.get("tolerations") or []):
                errors.append(f"{wname}: no toleration for the {GPU_RESOURCE} taint")
        if variant == "cpu" and "nvidia" in json.dumps(pod):
            errors.append(f"{wname}: the cpu variant mentions nvidia (GPU scheduling or env)")
        pod_ports.append((labels, ports))

    services = [o for o in objs if o.get("kind") == "Service"]
    if not any((s.get("spec") or {}).get("clusterIP") == "None" for s in services):
        errors.append("no headless Service (clusterIP: None)")
    for s in services:
        sname = where[id(s)]
        spec = s.get("spec") or {}
        selector = spec.get("selector") or {}
        if not selector:
            errors.append(f"{sname}: no selector")
            continue
        matched = [ports for labels, ports in pod_ports
                   if all(labels.get(k) == v for k, v in selector.items())]
        if not matched:
            errors.append(f"{sname}: selector {selector} matches no pod template")
            continue
        for p in spec.get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            if not any(target in ports for ports in matched):
                errors.append(f"{sname}: targetPort {target} is no container port of its pods")
    errors += security_errors(objs, flags_of, known_flags, security or SECURE)
    return errors


def mutations(variant):
    """(description, function that breaks a rendered copy[, text that an error must contain])
    tuples for the self-test."""

    def first(objs, kind):
        return next(o for o in objs if o.get("kind") == kind)

    def container(objs):
        return pod_spec_of(first(objs, "DaemonSet"))["containers"][0]

    def set_flag(objs, name, value):
        cm = first(objs, "ConfigMap")
        key = next(iter(cm["data"]))
        cm["data"][key] = re.sub(rf"(?m)^--{name}=.*$", f"--{name}={value}", cm["data"][key])

    def flags_text(objs):
        cm = first(objs, "ConfigMap")
        return cm["data"][next(iter(cm["data"]))]

    def remove_flag(objs, name):
        cm = first(objs, "ConfigMap")
        key = next(iter(cm["data"]))
        cm["data"][key] = re.sub(rf"(?m)^--{name}(=.*)?\n?", "", cm["data"][key])

    def add_flag(objs, line):
        cm = first(objs, "ConfigMap")
        key = next(iter(cm["data"]))
        cm["data"][key] = cm["data"][key].rstrip("\n") + f"\n{line}\n"

    def file_mount(objs, flag):
        path = re.search(rf"(?m)^--{flag}=(.*)$", flags_text(objs)).group(1)
        return next(m for m in container(objs)["volumeMounts"]
                    if m["mountPath"].rstrip("/") == os.path.dirname(path)), path

    def drop_volume(objs, flag):
        mount, _ = file_mount(objs, flag)
        pod = pod_spec_of(first(objs, "DaemonSet"))
        pod["volumes"] = [v for v in pod["volumes"] if v.get("name") != mount["name"]]
        container(objs)["volumeMounts"].remove(mount)

    def sub_path(objs, flag):
        mount, path = file_mount(objs, flag)
        mount.update(mountPath=path, subPath=os.path.basename(path))

    def probe_port(objs, probe, port):
        p = container(objs)[probe]
        (p.get("grpc") or p.get("tcpSocket")).update(port=port)

    def flag_port(objs, name):
        m = re.search(rf"(?m)^--{name}=(.*)$", flags_text(objs))
        return host_port(m.group(1))[1] if m else None

    def drop_port(objs, name):
        c = container(objs)
        c["ports"] = [p for p in c["ports"] if p.get("name") != name]

    def pod_and_container_sc(objs, key):
        pod_spec_of(first(objs, "DaemonSet")).get("securityContext", {}).pop(key, None)
        container(objs).get("securityContext", {}).pop(key, None)

    m = [
        ("livenessProbe removed", lambda o: container(o).pop("livenessProbe")),
        ("readinessProbe removed", lambda o: container(o).pop("readinessProbe")),
        ("livenessProbe made HTTP",
         lambda o: container(o).update(livenessProbe={"httpGet": {"path": "/", "port": 9464}})),
        ("startupProbe removed", lambda o: container(o).pop("startupProbe")),
        ("readinessProbe on another port", lambda o: probe_port(o, "readinessProbe", 8080)),
        ("a gRPC readiness probe on the TLS gRPC port",
         lambda o: probe_port(o, "readinessProbe", flag_port(o, "listen")),
         "readinessProbe gRPC port"),
        ("a gRPC startup probe on the TLS gRPC port",
         lambda o: container(o).update(startupProbe={"grpc": {"port": flag_port(o, "listen")}}),
         "startupProbe gRPC port"),
        ("a TCP liveness probe on the health port", lambda o: container(o).update(
            livenessProbe={"tcpSocket": {"port": flag_port(o, "health_listen")}}),
         "livenessProbe is not a native gRPC probe"),
        ("a TCP readiness probe on the TLS gRPC port", lambda o: container(o).update(
            readinessProbe={"tcpSocket": {"port": flag_port(o, "listen")}}),
         "readinessProbe is not a native gRPC probe"),
        ("a liveness probe of a named health service", lambda o: container(o)["livenessProbe"][
            "grpc"].update(service="komputed.v1.Devices"), "health service"),
        ("--health_listen removed", lambda o: remove_flag(o, "health_listen"),
         "no --health_listen"),
        ("--health_listen moved off the probes' port",
         lambda o: set_flag(o, "health_listen", "0.0.0.0:6001"),
         "is not the --health_listen port 6001"),
        ("--health_listen on loopback",
         lambda o: set_flag(o, "health_listen", f"127.0.0.1:{flag_port(o, 'health_listen')}"),
         "--health_listen=127.0.0.1"),
        ("--health_listen on the --metrics_listen port",
         lambda o: set_flag(o, "health_listen", f"0.0.0.0:{flag_port(o, 'metrics_listen')}"),
         "also the --listen or --metrics_listen port"),
        ("the health container port removed", lambda o: drop_port(o, "health"),
         "no declared container port"),
        ("resources.limits removed", lambda o: container(o)["resources"].pop("limits")),
        ("resources.requests removed", lambda o: container(o)["resources"].pop("requests")),
        ("readOnlyRootFilesystem false",
         lambda o: container(o)["securityContext"].update(readOnlyRootFilesystem=False)),
        ("allowPrivilegeEscalation true",
         lambda o: container(o)["securityContext"].update(allowPrivilegeEscalation=True)),
        ("capabilities drop ALL removed",
         lambda o: container(o)["securityContext"].pop("capabilities")),
        ("runAsNonRoot removed", lambda o: pod_and_container_sc(o, "runAsNonRoot")),
        ("seccompProfile removed", lambda o: pod_and_container_sc(o, "seccompProfile")),
        ("instance label removed from a Service",
         lambda o: first(o, "Service")["metadata"]["labels"].pop(INSTANCE_LABEL)),
        ("name label removed from the pod template",
         lambda o: first(o, "DaemonSet")["spec"]["template"]["metadata"]["labels"].pop(NAME_LABEL)),
        ("terminationGracePeriodSeconds equal to the drain",
         lambda o: pod_spec_of(first(o, "DaemonSet")).update(terminationGracePeriodSeconds=25)),
        ("--drain_timeout above the grace period", lambda o: set_flag(o, "drain_timeout", "60s")),
        ("--listen moved off the container port 'grpc'",
         lambda o: set_flag(o, "listen", "0.0.0.0:6000")),
        ("Service targetPort that no container has",
         lambda o: first(o, "Service")["spec"]["ports"][0].update(targetPort="nope")),
        ("--tls_cert removed (plaintext, --tls_key left alone)",
         lambda o: remove_flag(o, "tls_cert")),
        ("--tenants_file removed (no authentication)", lambda o: remove_flag(o, "tenants_file")),
        ("--insecure added", lambda o: add_flag(o, "--insecure")),
        ("a flag the daemon does not know", lambda o: add_flag(o, "--tls_certificate=/x.pem")),
        ("the TLS Secret volume removed", lambda o: drop_volume(o, "tls_cert")),
        ("the tenants Secret mounted through subPath", lambda o: sub_path(o, "tenants_file")),
        ("the TLS Secret mount writable",
         lambda o: file_mount(o, "tls_key")[0].update(readOnly=False)),
        ("NetworkPolicy removed", lambda o: o.remove(first(o, "NetworkPolicy"))),
        ("NetworkPolicy's gRPC rule open to every peer",
         lambda o: first(o, "NetworkPolicy")["spec"]["ingress"][0].pop("from")),
        ("NetworkPolicy rule on a port the pod lacks",
         lambda o: first(o, "NetworkPolicy")["spec"]["ingress"][0]["ports"][0].update(port=80)),
    ]
    if variant == "gpu":
        m.append(("GPU limit removed",
                  lambda o: container(o)["resources"]["limits"].pop(GPU_RESOURCE)))
        m.append(("GPU nodeSelector removed",
                  lambda o: pod_spec_of(first(o, "DaemonSet")).pop("nodeSelector")))
    else:
        m.append(("GPU limit added", lambda o: container(o)["resources"]["limits"].update(
            {GPU_RESOURCE: 1})))
    return m


def remove_yaml_block(text, key):
    """Deletes the first `key:` mapping entry with everything indented under it."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        m = re.match(rf"(\s*){re.escape(key)}:\s*$", line)
        if m:
            indent = len(m.group(1))
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or
                                      len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            return "".join(lines[:i] + lines[j:]), True
    return text, False


# ------------------------------------------------------------------------------------------------
# helm


TEMPLATE_ACTION = re.compile(r"{{-?(.*?)-?}}", re.S)
VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
SEMVER = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")


def template_block_errors(text):
    errors, stack = [], []
    for m in TEMPLATE_ACTION.finditer(text):
        action = m.group(1).strip()
        if action.startswith("/*"):
            continue
        word = action.split()[0] if action.split() else ""
        line = text.count("\n", 0, m.start()) + 1
        if word in ("if", "range", "with", "define", "block"):
            stack.append((word, line))
        elif word == "end":
            if not stack:
                errors.append(f"line {line}: {{{{ end }}}} without an opening block")
            else:
                stack.pop()
        elif word == "else" and not stack:
            errors.append(f"line {line}: {{{{ else }}}} outside a block")
    errors += [f"line {line}: {{{{ {word} }}}} is never closed" for word, line in stack]
    return errors


def define_body(text, name):
    """The text of a template definition, up to the next definition (or the end)."""
    m = re.search(r'{{-?\s*define\s+"' + re.escape(name) +
                  r'"\s*-?}}(.*?)(?={{-?\s*define\s|{{/\*|\Z)', text, re.S)
    return m.group(1) if m else ""


def values_path_exists(values, path):
    node = values
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def uncommented_keys(text):
    """Lines of values.yaml that start a mapping key with no comment line right above them.
    Keys inside list items are data, not values, and need none."""
    missing = []
    prev = ""
    list_indent = None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue  # A blank line between a comment and its key is allowed.
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            prev = line
            continue
        if list_indent is not None and (indent > list_indent or
                                        (indent == list_indent and stripped.startswith("- "))):
            prev = line
            continue
        list_indent = None
        if stripped.startswith("- "):
            list_indent = indent
            prev = line
            continue
        if re.match(r'^("[^"]*"|\'[^\']*\'|[^\s#:][^:#]*?):(\s|$)', stripped):
            if not prev.strip().startswith("#"):
                missing.append(f"values.yaml line {n}: {stripped.split(':')[0]} has no comment "
                               "line above it")
        prev = line
    return missing


def unknown_keys(scenario, values, prefix=""):
    """Keys of a ci/*-values.yaml that values.yaml does not define (free-form maps excepted)."""
    errors = []
    for k, v in (scenario or {}).items():
        path = f"{prefix}{k}"
        if not isinstance(values, dict) or k not in values:
            errors.append(f"{path} is not in values.yaml")
            continue
        default = values[k]
        if isinstance(v, dict) and isinstance(default, dict) and default:
            errors += unknown_keys(v, default, path + ".")
    return errors


def check_helm(src, report, base_flags, quotas, quotas_where):
    section = "helm"
    chart = os.path.join(src, "helm", "komputed")
    if not os.path.isdir(chart):
        report.result(section, "chart exists", [f"{chart} is missing"])
        return
    if yaml is None:
        report.skip(section, "chart", "PyYAML is missing: apt-get install python3-yaml")
        return
    errors = []
    meta = yaml.safe_load(read(os.path.join(chart, "Chart.yaml")))
    if meta.get("apiVersion") != "v2":
        errors.append("Chart.yaml: apiVersion is not v2")
    if meta.get("name") != "komputed":
        errors.append("Chart.yaml: name is not komputed")
    for key in ("version", "appVersion"):
        if not isinstance(meta.get(key), str) or not SEMVER.fullmatch(meta.get(key)):
            errors.append(f"Chart.yaml: {key} {meta.get(key)!r} is not a semantic version "
                          "string (quote appVersion)")
    if not meta.get("kubeVersion"):
        errors.append("Chart.yaml: no kubeVersion (native gRPC probes need 1.24)")
    report.result(section, "Chart.yaml: apiVersion v2, chart version and appVersion", errors)

    values_text = read(os.path.join(chart, "values.yaml"))
    values = yaml.safe_load(values_text) or {}
    report.result(section, "values.yaml: every key has a comment line above it",
                  uncommented_keys(values_text))

    tdir = os.path.join(chart, "templates")
    templates = sorted(glob.glob(os.path.join(tdir, "*")))
    texts = {os.path.basename(p): read(p) for p in templates if os.path.isfile(p)}
    errors = []
    kinds = {}
    for name, text in texts.items():
        if not name.endswith(".yaml"):
            continue
        found = re.findall(r"(?m)^kind:\s*(\S+)", text)
        if len(found) != 1:
            errors.append(f"{name}: {len(found)} resource kinds (want one per file)")
        else:
            kinds[name] = found[0]
        if re.search(r"(?m)^---", text):
            errors.append(f"{name}: a '---' separator (one resource per file)")
    for want in ("DaemonSet", "Service", "ConfigMap", "ServiceAccount", "ServiceMonitor",
                 "NetworkPolicy", "Secret"):
        if want not in kinds.values():
            errors.append(f"no template makes a {want}")
    if sorted(v for v in kinds.values() if v == "Service") != ["Service", "Service"]:
        errors.append("want two Services (ClusterIP and headless)")
    for f in ("_helpers.tpl", "NOTES.txt"):
        if f not in texts:
            errors.append(f"templates/{f} is missing")
    report.result(section, "templates: one resource per file, NOTES.txt and _helpers.tpl", errors)

    errors = []
    for name, text in texts.items():
        errors += [f"{name} {e}" for e in template_block_errors(text)]
    report.result(section, "templates: if/range/with/define blocks closed", errors)

    helpers = texts.get("_helpers.tpl", "")
    defines = dict(re.findall(r'{{-?\s*define\s+"([^"]+)"\s*-?}}(.*?){{-?\s*end\s*-?}}', helpers,
                              re.S))
    errors = []
    for d in ("komputed.name", "komputed.fullname", "komputed.labels", "komputed.selectorLabels"):
        if d not in defines:
            errors.append(f"_helpers.tpl does not define {d}")
    for d in ("komputed.name", "komputed.fullname"):
        if d in defines and "trunc 63" not in defines[d]:
            errors.append(f"{d} does not truncate to 63 characters")
    all_defines = set(re.findall(r'{{-?\s*define\s+"([^"]+)"', "".join(texts.values())))
    for name, text in texts.items():
        for used in re.findall(r'(?:include|template)\s+"([^"]+)"', text):
            if used not in all_defines:
                errors.append(f"{name}: include \"{used}\" is defined nowhere")
    labels = defines.get("komputed.selectorLabels", "")
    for label in (NAME_LABEL, INSTANCE_LABEL):
        if label not in labels:
            errors.append(f"komputed.selectorLabels lacks {label}")
    report.result(section, "_helpers.tpl: names (63-character truncation), labels, includes",
                  errors)

    errors = []
    referenced = set()
    for name, text in texts.items():
        for ref in VALUES_REF.findall(text):
            path = ref.strip(".").split(".")
            referenced.add(path[0])
            if not values_path_exists(values, path):
                errors.append(f"{name}: .Values{ref} is not in values.yaml")
    for key in values:
        if key not in referenced:
            errors.append(f"values.yaml: {key} is used by no template")
    report.result(section, "templates: every .Values path is in values.yaml, every value used",
                  errors)

    errors = []
    gated = {"servicemonitor.yaml": ".Values.serviceMonitor.enabled",
             "networkpolicy.yaml": ".Values.networkPolicy.enabled",
             "secret.yaml": ".Values.auth.tenants.create",
             "serviceaccount.yaml": ".Values.serviceAccount.create"}
    for name, flag in gated.items():
        first = next((ln for ln in texts.get(name, "").splitlines() if ln.strip()), "")
        if not (first.startswith("{{- if") and flag in first):
            errors.append(f"{name}: does not start with {{{{- if ... {flag} }}}}")
    if (values.get("serviceMonitor") or {}).get("enabled") is not False:
        errors.append("values.yaml: serviceMonitor.enabled is not false by default")
    report.result(section, "optional pieces behind their flags, the ServiceMonitor off by default",
                  errors)

    errors = []
    if (values.get("networkPolicy") or {}).get("enabled") is not True:
        errors.append("values.yaml: networkPolicy.enabled is not true by default")
    if (values.get("tls") or {}).get("enabled") is not True:
        errors.append("values.yaml: tls.enabled is not true by default")
    if values.get("insecure") is not False:
        errors.append("values.yaml: insecure is not false by default")
    validate = define_body(helpers, "komputed.validate")
    for want in ("tls.existingSecret", "auth.tenants.existingSecret", "tls.clientCA.enabled",
                 "insecure=true"):
        if not re.search(r'fail "[^"]*' + re.escape(want), validate):
            errors.append(f"komputed.validate has no fail message that names {want}")
    if 'include "komputed.validate"' not in texts.get("daemonset.yaml", ""):
        errors.append("daemonset.yaml does not include komputed.validate")
    chart_quotas = re.sub(r"{{.*?}}", "", define_body(helpers, "komputed.quotaNames")).split()
    if chart_quotas != quotas:
        errors.append(f"komputed.quotaNames is {chart_quotas}, {quotas_where} has {quotas}")
    for name in quotas:
        if name not in values_text:
            errors.append(f"values.yaml does not name the quota {name} (auth.defaultQuota's "
                          "comment lists them)")
    report.result(section, "secure defaults: TLS and the NetworkPolicy on, insecure off, a fail "
                  "naming the value to set, the quota names of the daemon", errors)

    errors = []
    ds = texts.get("daemonset.yaml", "")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        include = r'{{- include "komputed.probeAction" \. \| nindent 12 }}'
        if not re.search(rf"{probe}:\n\s+{include}", ds):
            errors.append(f"daemonset.yaml: {probe} does not come from komputed.probeAction")
    action = re.sub(r"{{/\*.*?\*/}}", "", defines.get("komputed.probeAction", ""), flags=re.S)
    if not re.fullmatch(r"\s*grpc:\n\s+port: {{ \.Values\.config\.healthPort \| int }}\s*",
                        action):
        errors.append("komputed.probeAction is not exactly a gRPC probe on config.healthPort "
                      "(whatever TLS says: the health port is plaintext)")
    for var, value in (("$grpcPort", "grpcPort"), ("$healthPort", "healthPort")):
        if f"{var} := .Values.config.{value}" not in ds:
            errors.append(f"daemonset.yaml: {var} does not come from .Values.config.{value}")
    if not re.search(r"- name: health\n\s+containerPort: {{ \$healthPort }}", ds):
        errors.append("daemonset.yaml: no container port 'health' on $healthPort")
    flags_body = define_body(helpers, "komputed.flags")
    health_line = "--health_listen=0.0.0.0:{{ .Values.config.healthPort | int }}"
    at = flags_body.find(health_line)
    if at < 0:
        errors.append(f"komputed.flags has no {health_line} line")
    else:
        before = flags_body[:at]
        depth = (len(re.findall(r"{{-?\s*(?:if|with|range)\b", before)) -
                 len(re.findall(r"{{-?\s*end\b", before)))
        if depth:
            errors.append(f"komputed.flags: {health_line} is inside an if, with or range block "
                          "(the probes need it always)")
    if not re.search(r'fail \(printf "[^"]*config\.healthPort', validate):
        errors.append("komputed.validate has no fail message that names config.healthPort")
    if not re.search(r"terminationGracePeriodSeconds: {{ add \.Values\.config\.drainTimeoutSeconds "
                     r"\.Values\.terminationGraceExtraSeconds }}", ds):
        errors.append("daemonset.yaml: terminationGracePeriodSeconds is not drainTimeoutSeconds "
                      "+ terminationGraceExtraSeconds")
    if not (isinstance(values.get("terminationGraceExtraSeconds"), int)
            and values["terminationGraceExtraSeconds"] > 0):
        errors.append("values.yaml: terminationGraceExtraSeconds is not a positive integer")
    for ref in ("toYaml .Values.securityContext", "toYaml .Values.podSecurityContext",
                "toYaml $resources", "checksum/config", "--flagfile="):
        if ref not in ds:
            errors.append(f"daemonset.yaml: no {ref}")
    sc, psc = values.get("securityContext") or {}, values.get("podSecurityContext") or {}
    want = {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "runAsUser": 10001}
    for k, v in want.items():
        if sc.get(k) != v:
            errors.append(f"values.yaml: securityContext.{k} is {sc.get(k)!r}, want {v!r}")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        errors.append("values.yaml: securityContext.capabilities.drop lacks ALL")
    for ctx, name in ((sc, "securityContext"), (psc, "podSecurityContext")):
        if (ctx.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            errors.append(f"values.yaml: {name}.seccompProfile.type is not RuntimeDefault")
    if psc.get("runAsNonRoot") is not True:
        errors.append("values.yaml: podSecurityContext.runAsNonRoot is not true")
    res = values.get("resources") or {}
    if not (res.get("requests") or {}).get("memory") or not (res.get("limits") or {}).get("memory"):
        errors.append("values.yaml: resources lack requests.memory or limits.memory")
    gpu = values.get("gpu") or {}
    if gpu.get("enabled") is not True or gpu.get("resourceName") != GPU_RESOURCE:
        errors.append("values.yaml: gpu.enabled is not true or gpu.resourceName is not "
                      f"{GPU_RESOURCE}")
    if (gpu.get("nodeSelector") or {}).get("nvidia.com/gpu.present") != "true":
        errors.append("values.yaml: gpu.nodeSelector lacks nvidia.com/gpu.present: \"true\"")
    if (values.get("serviceAccount") or {}).get("automountToken") is not False:
        errors.append("values.yaml: serviceAccount.automountToken is not false")
    report.result(section, "daemonset.yaml and values.yaml: gRPC probes on config.healthPort "
                  "(--health_listen, container port health), grace period, strict security "
                  "defaults", errors)

    errors = []
    cfg = values.get("config") or {}
    if base_flags is not None:
        pairs = (("listen", f"0.0.0.0:{cfg.get('grpcPort')}"),
                 ("metrics_listen", f"0.0.0.0:{cfg.get('metricsPort')}"),
                 ("health_listen", f"0.0.0.0:{cfg.get('healthPort')}"),
                 ("drain_timeout", f"{cfg.get('drainTimeoutSeconds')}s"),
                 ("session_idle_timeout", f"{cfg.get('sessionIdleTimeoutSeconds')}s"),
                 ("log_level", cfg.get("logLevel")))
        for flag, value in pairs:
            if base_flags.get(flag) != value:
                errors.append(f"values.yaml config gives --{flag}={value}, deploy/base/"
                              f"komputed.flags --{flag}={base_flags.get(flag)}")
    if (values.get("service") or {}).get("port") != cfg.get("grpcPort"):
        errors.append("values.yaml: service.port is not config.grpcPort")
    if not isinstance(cfg.get("healthPort"), int) or \
            cfg.get("healthPort") in (cfg.get("grpcPort"), cfg.get("metricsPort")):
        errors.append(f"values.yaml: config.healthPort {cfg.get('healthPort')!r} is not a port "
                      "apart from config.grpcPort and config.metricsPort")
    if values.get("startupProbe") is None:
        errors.append("values.yaml: no startupProbe settings")
    report.result(section, "values.yaml agrees with deploy/base/komputed.flags", errors)

    errors = []
    scenarios = sorted(glob.glob(os.path.join(chart, "ci", "*-values.yaml")))
    names = [os.path.basename(s) for s in scenarios]
    for want in ("default-values.yaml", "cpu-values.yaml"):
        if want not in names:
            errors.append(f"ci/{want} is missing")
    enables = {"serviceMonitor": False, "networkPolicy": False}
    for s in scenarios:
        data = yaml.safe_load(read(s)) or {}
        errors += [f"{os.path.basename(s)}: {e}" for e in unknown_keys(data, values)]
        for key in enables:
            if (data.get(key) or {}).get("enabled") is True:
                enables[key] = True
        if os.path.basename(s) == "cpu-values.yaml":
            if (data.get("gpu") or {}).get("enabled") is not False:
                errors.append("cpu-values.yaml: gpu.enabled is not false")
            if (data.get("image") or {}).get("repository") != "komputed-cpu":
                errors.append("cpu-values.yaml: image.repository is not komputed-cpu")
    for key, on in enables.items():
        if not on:
            errors.append(f"no ci scenario turns {key}.enabled on")
    report.result(section, f"ci scenarios ({', '.join(names)}) use only defined values", errors)


GOPATH_DEBIAN = "/usr/share/gocode"
RENDER_NEEDS = ("github.com/Masterminds/sprig", "github.com/ghodss/yaml")


def scenario_security(data):
    """What a ci scenario's values ask of the rendered objects (see SECURE)."""
    tls = data.get("tls") or {}
    return {"tls": tls.get("enabled", True) is not False and not data.get("insecure"),
            "insecure": data.get("insecure") is True,
            "network_policy": (data.get("networkPolicy") or {}).get("enabled", True) is not False}


def rendered_flags(objs):
    """The flag file of the first rendered ConfigMap that has one, parsed."""
    for o in objs or []:
        if o.get("kind") == "ConfigMap":
            for text in (o.get("data") or {}).values():
                return parse_flagfile(text)[0]
    return {}


def health_port_errors(objs, port):
    """The rendered chart's --health_listen, container port health and probes are all on port."""
    errors = []
    if rendered_flags(objs).get("health_listen") != f"0.0.0.0:{port}":
        errors.append(f"--health_listen={rendered_flags(objs).get('health_listen')}, want "
                      f"0.0.0.0:{port}")
    ds = next((o for o in objs if o.get("kind") == "DaemonSet"), {})
    c = (pod_spec_of(ds).get("containers") or [{}])[0]
    cports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if cports.get("health") != port:
        errors.append(f"container port health is {cports.get('health')}, want {port}")
    for probe in PROBES:
        if ((c.get(probe) or {}).get("grpc") or {}).get("port") != port:
            errors.append(f"{probe} is {c.get(probe)}, want grpc on port {port}")
    return errors


def check_helm_render(src, report, known_flags):
    """Renders the chart's ci scenarios with tests/deploy/helmrender (text/template + Sprig, as
    Helm does) and applies the same structural checks as to the kustomize overlays."""
    section = "helm-render"
    chart = os.path.join(src, "helm", "komputed")
    missing = [p for p in RENDER_NEEDS if not os.path.isdir(os.path.join(GOPATH_DEBIAN, "src", p))]
    if not shutil.which("go") or missing:
        report.skip(section, "render the chart's ci scenarios", "needs Debian's golang-go, "
                    "golang-github-masterminds-sprig-dev and golang-github-ghodss-yaml-dev")
        return
    if yaml is None:
        report.skip(section, "render the chart's ci scenarios", "PyYAML is missing")
        return
    with tempfile.TemporaryDirectory() as tmp:
        tool = os.path.join(tmp, "helmrender")
        env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH_DEBIAN, GOFLAGS="",
                   GOCACHE=os.path.join(tmp, "gocache"))
        p = subprocess.run(["go", "build", "-o", tool, "."], capture_output=True, text=True,
                           cwd=os.path.join(src, "tests", "deploy", "helmrender"), env=env)
        if p.returncode != 0:
            report.result(section, "build tests/deploy/helmrender", [p.stderr.strip()])
            return

        def render_chart(release, *value_files):
            rc, out, err = run([tool, chart, release, "komputed"] + list(value_files))
            if rc != 0:
                return None, [f"render failed: {err.strip()}"]
            try:
                objs = [o for o in yaml.safe_load_all(out) if o]
            except yaml.YAMLError as e:
                return None, [f"the rendered chart is not YAML: {e}"]
            return objs, []

        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "komputed", "labels": {NAME_LABEL: "komputed", INSTANCE_LABEL: "komputed"}}}
        for scenario in sorted(glob.glob(os.path.join(chart, "ci", "*-values.yaml"))):
            name = os.path.basename(scenario)
            data = yaml.safe_load(read(scenario)) or {}
            objs, errors = render_chart("komputed", scenario)
            if objs is not None:
                variant = "cpu" if (data.get("gpu") or {}).get("enabled") is False else "gpu"
                security = scenario_security(data)
                errors += check_objects(objs + [namespace], variant, known_flags, security)
                kinds = [o.get("kind") for o in objs]
                tenants = (data.get("auth") or {}).get("tenants") or {}
                monitor = (data.get("serviceMonitor") or {}).get("enabled") is True
                made = bool(tenants.get("create")) and not tenants.get("existingSecret")
                expect = {"ServiceMonitor": monitor, "NetworkPolicy": security["network_policy"],
                          "Secret": made}
                for kind, wanted in expect.items():
                    if wanted != (kind in kinds):
                        errors.append(f"{kind} {'missing' if wanted else 'rendered'} although "
                                      f"{name} {'asks for' if wanted else 'does not ask for'} it")
                flags = rendered_flags(objs)
                if ("insecure" in flags) != security["insecure"]:
                    asked = security["insecure"]
                    errors.append(f"--insecure {'missing' if asked else 'rendered'} although "
                                  f"{name} {'sets' if asked else 'does not set'} insecure")
                for q, v in ((data.get("auth") or {}).get("defaultQuota") or {}).items():
                    if flags.get(f"default_quota_{q}") != str(v):
                        errors.append(f"auth.defaultQuota.{q}={v} gives "
                                      f"--default_quota_{q}={flags.get(f'default_quota_{q}')}")
            report.result(section, f"ci/{name} renders and passes the object and security checks",
                          errors)

        def values_file(name, data):
            path = os.path.join(tmp, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f)
            return path

        # The defaults alone, and values short of authentication, must not render; each refusal
        # names the value to set.
        errors = []
        refusals = [
            ("the defaults", {}, "tls.existingSecret"),
            ("a TLS Secret and no authentication", {"tls": {"existingSecret": "t"}},
             "auth.tenants.existingSecret"),
            ("a tenants Secret, TLS on, no TLS Secret",
             {"auth": {"tenants": {"existingSecret": "a"}}}, "tls.existingSecret"),
            ("tls.enabled=false and no authentication", {"tls": {"enabled": False}},
             "auth.tenants.existingSecret"),
            ("mutual TLS without TLS", {"insecure": True, "tls": {"enabled": False,
                                                                  "clientCA": {"enabled": True}}},
             "tls.enabled"),
            ("auth.tenants.create with no list",
             {"tls": {"existingSecret": "t"}, "auth": {"tenants": {"create": True}}},
             "auth.tenants.list"),
            ("a token hash that is not 64 hex digits",
             {"tls": {"existingSecret": "t"}, "auth": {"tenants": {
                 "create": True, "list": [{"name": "a", "token_sha256": "abc"}]}}},
             "token_sha256"),
            ("an unknown quota", {"tls": {"existingSecret": "t"}, "auth": {
                "tenants": {"existingSecret": "a"}, "defaultQuota": {"gpus": 1}}},
             "auth.defaultQuota.gpus"),
            ("the health port on the gRPC port", {"tls": {"existingSecret": "t"}, "auth": {
                "tenants": {"existingSecret": "a"}}, "config": {"healthPort": 50051}},
             "config.healthPort"),
        ]
        for what, data, want in refusals:
            objs, errs = render_chart("komputed", values_file("refuse.yaml", data))
            if objs is not None:
                errors.append(f"{what}: rendered; want a refusal naming {want}")
            elif not any(want in e and "fail" in e for e in errs):
                errors.append(f"{what}: the refusal does not name {want}: {errs}")
        report.result(section, f"values without TLS or authentication, or with the health port "
                      f"on another port, are refused with a message naming the value to set "
                      f"({len(refusals)} cases)", errors)

        # Pure defaults plus the two Secrets: TLS and tenants flags, their Secrets mounted as
        # folders, gRPC probes on the plaintext health port, the NetworkPolicy, no --insecure.
        errors = []
        objs, errs = render_chart("komputed", values_file("secure.yaml", {
            "tls": {"existingSecret": "komputed-tls"},
            "auth": {"tenants": {"existingSecret": "komputed-tenants"}}}))
        errors += errs
        if objs is not None:
            errors += check_objects(objs + [namespace], "gpu", known_flags, SECURE)
            flags = rendered_flags(objs)
            want = {"tenants_file": "/etc/komputed/tenants/tenants.yaml",
                    "tls_cert": "/etc/komputed/tls/tls.crt", "tls_key": "/etc/komputed/tls/tls.key"}
            for k, v in want.items():
                if flags.get(k) != v:
                    errors.append(f"--{k}={flags.get(k)}, want {v}")
            for k in ("insecure", "tls_client_ca"):
                if k in flags:
                    errors.append(f"--{k} rendered by default")
            ds = next((o for o in objs if o.get("kind") == "DaemonSet"), {})
            names = {v.get("name"): (v.get("secret") or {}).get("secretName")
                     for v in pod_spec_of(ds).get("volumes") or []}
            if names.get("tls") != "komputed-tls" or names.get("tenants") != "komputed-tenants":
                errors.append(f"the Secret volumes are {names}")
            errors += health_port_errors(objs, 8081)
        # config.healthPort moves the flag, the container port and every probe.
        objs, errs = render_chart("komputed", values_file("health.yaml", {
            "tls": {"existingSecret": "komputed-tls"}, "config": {"healthPort": 9000},
            "auth": {"tenants": {"existingSecret": "komputed-tenants"}}}))
        errors += errs
        if objs is not None:
            errors += check_objects(objs + [namespace], "gpu", known_flags, SECURE)
            errors += [f"config.healthPort=9000: {e}" for e in health_port_errors(objs, 9000)]
        report.result(section, "the defaults with a TLS and a tenants Secret: TLS and tenants "
                      "flags, Secrets mounted read-only as folders, the NetworkPolicy, no "
                      "--insecure, gRPC probes on --health_listen=0.0.0.0:8081 (config.healthPort, "
                      "also moved)", errors)

        # insecure=true alone renders, plaintext and with --insecure; mutual TLS from the TLS
        # Secret's ca.crt.
        errors = []
        objs, errs = render_chart("komputed", values_file("insecure.yaml", {"insecure": True}))
        errors += errs
        if objs is not None:
            errors += check_objects(objs + [namespace], "gpu", known_flags,
                                    {"tls": False, "insecure": True, "network_policy": True})
            flags = rendered_flags(objs)
            if flags.get("insecure") != "true" or "tls_cert" in flags or "tenants_file" in flags:
                errors.append(f"insecure=true renders the flags {sorted(flags)}")
        objs, errs = render_chart("komputed", values_file("mtls.yaml", {
            "tls": {"existingSecret": "s", "clientCA": {"enabled": True}}}))
        errors += errs
        if objs is not None:
            errors += check_objects(objs + [namespace], "gpu", known_flags, SECURE)
            if rendered_flags(objs).get("tls_client_ca") != "/etc/komputed/tls/ca.crt":
                errors.append("tls.clientCA.enabled without its own Secret does not give "
                              "--tls_client_ca=/etc/komputed/tls/ca.crt")
        report.result(section, "insecure=true renders --insecure without TLS; tls.clientCA alone "
                      "gives --tls_client_ca from the TLS Secret", errors)

        errors = []
        long_name = "release-" + "x" * 70
        override = os.path.join(tmp, "override.yaml")
        with open(override, "w", encoding="utf-8") as f:
            json.dump({"tls": {"existingSecret": "t"},
                       "auth": {"tenants": {"create": True, "list": [
                           {"name": "a", "token_sha256": "0" * 64}]}},
                       "serviceMonitor": {"enabled": True},
                       "networkPolicy": {"enabled": True}}, f)
        objs, errs = render_chart(long_name, override)
        errors += errs
        for o in objs or []:
            md = o.get("metadata") or {}
            if len(md.get("name", "")) > 63:
                errors.append(f"{o.get('kind')} name {md.get('name')} is over 63 characters")
            for k, v in (md.get("labels") or {}).items():
                if len(str(v)) > 63:
                    errors.append(f"{o.get('kind')} label {k}={v} is over 63 characters")
        report.result(section, "a 78-character release name gives names and labels of at most 63",
                      errors)

        errors = []
        broken = os.path.join(tmp, "broken.yaml")
        with open(broken, "w", encoding="utf-8") as f:
            json.dump({"securityContext": {"readOnlyRootFilesystem": False},
                       "config": {"drainTimeoutSeconds": 40}, "terminationGraceExtraSeconds": -15,
                       "tls": {"existingSecret": "t"},
                       "auth": {"tenants": {"existingSecret": "a"}},
                       "networkPolicy": {"enabled": False}},
                      f)
        objs, errs = render_chart("komputed", broken)
        if objs is None:
            errors += errs
        else:
            found = check_objects(objs + [namespace], "gpu", known_flags, SECURE)
            for want in ("readOnlyRootFilesystem", "terminationGracePeriodSeconds",
                         "no NetworkPolicy"):
                if not any(want in e for e in found):
                    errors.append(f"no {want} error for values that break it: {found}")
        report.result(section, "self-test: values that break the rules fail the check", errors)


# ------------------------------------------------------------------------------------------------
# docker


def dockerfile_instructions(text):
    """[(instruction, arguments, stage index)] with continuation lines joined."""
    out, stage, buf = [], -1, ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        instr, _, args = buf.strip().partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            stage += 1
        out.append((instr, args.strip(), stage))
        buf = ""
    return out


ALLOWED_COMMANDS = {
    "apt-get": "Debian's packages",
    "cmake": "the build that `make build` runs",
    "rm": "base tool", "mkdir": "base tool", "chown": "base tool", "ln": "base tool",
    "test": "base tool", "useradd": "base tool", "groupadd": "base tool", "ldd": "base tool",
    "grep": "base tool", "uname": "base tool",
}
CHECKED_SCRIPTS = ("scripts/setup", "runtime-packages.sh")


def shell_commands(script):
    """Simple commands of a RUN line: $(...) bodies separately, split on && || ; | and newlines."""
    script = re.sub(r"--mount=\S+", "", script)
    bodies = []

    def lift(m):
        bodies.append(m.group(1))
        return "SUBST"

    while re.search(r"\$\(([^()]*)\)", script):
        script = re.sub(r"\$\(([^()]*)\)", lift, script)
    commands = []
    for body in [script] + bodies:
        for part in re.split(r"&&|\|\||;|\||\n", body):
            words = part.strip().split()
            while words and (words[0] == "!" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*",
                                                             words[0])):
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def check_docker(src, build_dir, report):
    section = "docker"
    ddir = os.path.join(src, "docker")
    files = {"gpu": os.path.join(ddir, "Dockerfile"), "cpu": os.path.join(ddir, "Dockerfile.cpu")}
    missing = [p for p in files.values() if not os.path.isfile(p)]
    if missing:
        report.result(section, "Dockerfiles exist", [f"{p} is missing" for p in missing])
        return
    cmake_text = read(os.path.join(src, "CMakeLists.txt"))
    subdirs = [d for d in re.findall(r"add_subdirectory\(\s*([\w./-]+)", cmake_text)
               if d.split("/")[0] != "tests"]  # tests and fuzz targets are off there
    icd_path = None
    for variant, path in files.items():
        name = os.path.relpath(path, src)
        text = read(path)
        instrs = dockerfile_instructions(text)
        stages = max(s for _, _, s in instrs) + 1
        final = stages - 1
        args = {}
        for instr, a, stage in instrs:
            if instr == "ARG" and "=" in a:
                k, v = a.split("=", 1)
                args[k] = v

        errors = []
        for instr, a, stage in instrs:
            if instr != "RUN":
                continue
            for words in shell_commands(a):
                cmd = words[0]
                if cmd in ("bash", "sh") and len(words) > 1 and words[1].endswith(CHECKED_SCRIPTS):
                    continue
                if cmd.endswith(CHECKED_SCRIPTS):
                    continue
                if cmd not in ALLOWED_COMMANDS:
                    errors.append(f"RUN calls {' '.join(words[:3])!r}: only scripts/setup, cmake, "
                                  "apt-get, docker/runtime-packages.sh and base tools "
                                  f"({', '.join(sorted(ALLOWED_COMMANDS))}) may run")
        report.result(section, f"{name}: RUN steps call only what CI exercises", errors)

        errors = []
        if stages < 2:
            errors.append("not a multi-stage build")
        for instr, a, stage in instrs:
            if instr == "FROM":
                image = a.split()[0]
                image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
                if image != "debian:bookworm-slim":
                    errors.append(f"FROM {a}: not debian:bookworm-slim")
        build_runs = " ".join(a for i, a, s in instrs if i == "RUN" and s < final)
        if not re.search(r"\bbash scripts/setup\b", build_runs):
            errors.append("the build stage does not run scripts/setup")
        for want in ("cmake -S . -B build -G Ninja", "-DCMAKE_BUILD_TYPE=Release",
                     "-DKOMPUTED_BUILD_TESTS=OFF", "cmake --build build",
                     "cmake --install build --prefix /opt/komputed"):
            if want not in build_runs:
                errors.append(f"the build stage lacks {want!r}")
        copied = set()
        for instr, a, stage in instrs:
            if instr in ("COPY", "ADD"):
                parts = [p for p in a.split() if not p.startswith("--")]
                if instr == "ADD":
                    errors.append(f"ADD {a}: use COPY")
                if "--from=" in a:
                    continue
                for s in parts[:-1]:
                    copied.add(s.rstrip("/"))
                    if not os.path.exists(os.path.join(src, s)):
                        errors.append(f"COPY {s}: no such file in the repository")
        for d in subdirs + ["CMakeLists.txt", "scripts/setup"]:
            if d not in copied:
                errors.append(f"{d} (read by the build) is not copied into the build stage")
        report.result(section, f"{name}: Debian 12 multi-stage build with scripts/setup and CMake, "
                      "COPY covers the build", errors)

        errors = []
        final_instrs = [(i, a) for i, a, s in instrs if s == final]
        final_runs = [a for i, a in final_instrs if i == "RUN"]
        installs = [a for a in final_runs if "apt-get install" in a]
        if not installs:
            errors.append("the final stage installs no runtime packages")
        for a in installs:
            if "--no-install-recommends" not in a:
                errors.append("apt-get install without --no-install-recommends")
            if re.search(r"\S+-dev\b", a):
                errors.append(f"the final stage installs a -dev package: {a}")
            if f"runtime-packages.sh {variant}" not in a:
                errors.append(f"the final stage does not install `runtime-packages.sh {variant}`")
            if "rm -rf /var/lib/apt/lists" not in a:
                errors.append("the apt lists are left in the image")
        users = [a for i, a in final_instrs if i == "USER"]
        if not users or users[-1].split(":")[0] != "10001":
            errors.append(f"final USER is {users[-1] if users else None!r}, want 10001 "
                          "(numeric, so that runAsNonRoot can verify it)")
        if not any(re.search(r"useradd .*--uid 10001", a) for a in final_runs):
            errors.append("no user with uid 10001 is created")
        exposed = " ".join(a for i, a in final_instrs if i == "EXPOSE").split()
        for port in ("50051", "9464"):
            if port not in exposed:
                errors.append(f"port {port} is not exposed")
        entry = [a for i, a in final_instrs if i == "ENTRYPOINT"]
        try:
            argv = json.loads(entry[-1]) if entry else None
        except json.JSONDecodeError:
            argv = None
        if not isinstance(argv, list) or not argv[0].endswith("/komputed"):
            errors.append("ENTRYPOINT is not an exec-form (JSON) komputed command")
        else:
            for flag in ("--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"):
                if flag not in argv:
                    errors.append(f"ENTRYPOINT lacks {flag}")
        env = {}
        for i, a in final_instrs:
            if i == "ENV":
                for k, v in re.findall(r"(\w+)=(\S+)", a):
                    env[k] = v
        if not any(i == "COPY" and "--from=build" in a and "/opt/komputed/bin/komputed" in a
                   for i, a in final_instrs):
            errors.append("the final stage does not copy /opt/komputed/bin/komputed from build")
        if not any("ldd /opt/komputed/bin/komputed" in a for a in final_runs):
            errors.append("the final stage does not check the daemon's libraries with ldd")
        if variant == "gpu":
            copies = [a.split()[-1] for i, a in final_instrs
                      if i == "COPY" and "docker/nvidia_icd.json" in a]
            if not copies:
                errors.append("docker/nvidia_icd.json is not copied into the image")
            else:
                icd_path = copies[0]
                for k in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
                    if env.get(k) != icd_path:
                        errors.append(f"ENV {k}={env.get(k)}, want {icd_path}")
            caps = set(env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(","))
            if not {"compute", "graphics", "utility"} <= caps:
                errors.append("NVIDIA_DRIVER_CAPABILITIES does not name compute,graphics,utility")
            if env.get("NVIDIA_VISIBLE_DEVICES") != "all":
                errors.append("NVIDIA_VISIBLE_DEVICES is not all")
        else:
            if any(k.startswith("NVIDIA_") for k in env):
                errors.append("the CPU image sets NVIDIA_* variables")
            if "lvp_icd" not in env.get("VK_DRIVER_FILES", ""):
                errors.append("VK_DRIVER_FILES does not pin lavapipe's ICD file")
        report.result(section, f"{name}: final stage: runtime packages only, uid 10001, ports "
                      "50051 and 9464, komputed entrypoint, Vulkan driver files", errors)

    errors = []
    try:
        icd = json.loads(read(os.path.join(ddir, "nvidia_icd.json")))
        info = icd.get("ICD") or {}
        if info.get("library_path") != "libEGL_nvidia.so.0":
            errors.append(f"ICD.library_path is {info.get('library_path')!r}, want "
                          "libEGL_nvidia.so.0 (the GLX library fails headless)")
        if not icd.get("file_format_version") or not info.get("api_version"):
            errors.append("file_format_version or ICD.api_version missing")
    except (OSError, json.JSONDecodeError) as e:
        errors.append(f"docker/nvidia_icd.json: {e}")
    rc, _, err = run([sys.executable, "-m", "json.tool", os.path.join(ddir, "nvidia_icd.json")])
    if rc != 0:
        errors.append(f"python3 -m json.tool fails: {err.strip()}")
    report.result(section, "nvidia_icd.json parses and names libEGL_nvidia.so.0", errors)

    script = os.path.join(ddir, "runtime-packages.sh")
    lists, errors = {}, []
    for variant in ("gpu", "cpu"):
        rc, out, err = run(["sh", script, variant])
        if rc != 0:
            errors.append(f"runtime-packages.sh {variant} exited {rc}: {err.strip()}")
        lists[variant] = out.split()
        if "libvulkan1" not in lists[variant]:
            errors.append(f"runtime-packages.sh {variant} lacks libvulkan1")
        errors += [f"runtime-packages.sh {variant} names a -dev package: {p}"
                   for p in lists[variant] if p.endswith("-dev")]
    if "mesa-vulkan-drivers" not in lists["cpu"]:
        errors.append("runtime-packages.sh cpu lacks mesa-vulkan-drivers (lavapipe)")
    if "mesa-vulkan-drivers" in lists["gpu"]:
        errors.append("runtime-packages.sh gpu names mesa-vulkan-drivers")
    rc, _, _ = run(["sh", script, "tpu"])
    if rc == 0:
        errors.append("runtime-packages.sh accepts an unknown image name")
    report.result(section, "runtime-packages.sh lists runtime libraries for gpu and cpu", errors)

    packages = sorted(set(lists["gpu"]) | set(lists["cpu"]))
    if not shutil.which("apt-cache"):
        report.skip(section, "runtime packages have Debian candidates", "no apt-cache here")
        return
    rc, out, _ = run(["apt-cache", "policy", "libc6"])
    if not re.search(r"Candidate: (?!\(none\))\S+", out):
        report.skip(section, "runtime packages have Debian candidates",
                    "the apt lists are empty: run apt-get update")
        return
    errors = []
    for p in packages:
        rc, out, _ = run(["apt-cache", "policy", p])
        if not re.search(r"Candidate: (?!\(none\))\S+", out):
            errors.append(f"{p} has no candidate in Debian's archive")
    report.result(section, f"runtime packages have Debian candidates ({len(packages)})", errors)

    daemon = os.path.join(build_dir, "server", "komputed") if build_dir else None
    if not daemon or not os.path.isfile(daemon):
        report.skip(section, "runtime packages cover the built daemon's libraries",
                    f"no built daemon at {daemon}")
        return
    rc, out, err = run(["ldd", daemon])
    if rc != 0:
        report.result(section, "runtime packages cover the built daemon's libraries",
                      [f"ldd {daemon}: {err.strip()}"])
        return
    for variant in ("gpu", "cpu"):
        errors = []
        rc, dep_out, _ = run(["apt-cache", "depends", "--recurse", "--no-recommends",
                              "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                              "--no-enhances"] + lists[variant])
        closure = {ln.strip("<> ") for ln in dep_out.splitlines() if ln and not ln[0].isspace()}
        closure |= {"libc6", "libgcc-s1", "libstdc++6"}  # In debian:bookworm-slim.
        for line in out.splitlines():
            m = re.match(r"\s*(\S+) => (/\S+)", line)
            if not m:
                continue
            lib, path = m.groups()
            if lib.startswith("libkomputed_"):
                continue  # komputed's own libraries: the image's cmake --install puts them in lib/
            owner = None
            for candidate in {path, os.path.realpath(path),
                              re.sub(r"^/lib/", "/usr/lib/", path),
                              re.sub(r"^/usr/lib/", "/lib/", path)}:
                rc, dout, _ = run(["dpkg", "-S", candidate])
                if rc == 0:
                    owner = dout.split(":")[0].strip()
                    break
            if owner is None:
                errors.append(f"{lib} ({path}) is in no Debian package: the image won't have it")
            elif owner not in closure:
                errors.append(f"{lib} comes from {owner}, which runtime-packages.sh {variant} "
                              "does not install")
        report.result(section, f"runtime-packages.sh {variant} covers every library of "
                      f"{os.path.relpath(daemon, build_dir)}", errors)


# ------------------------------------------------------------------------------------------------
# metrics


PROMQL_WORDS = {"sum", "by", "without", "rate", "increase", "irate", "histogram_quantile", "avg",
                "max", "min", "count", "topk", "bottomk", "on", "ignoring", "group_left",
                "group_right", "and", "or", "unless", "le", "label_values", "delta", "deriv",
                "clamp_min", "clamp_max", "abs", "vector", "scalar", "time", "offset", "bool"}


def metric_names(expr):
    expr = re.sub(r"label_values\((.*),\s*\w+\s*\)\s*$", r"\1", expr)  # its label argument
    expr = re.sub(r'"[^"]*"', '""', expr)        # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)         # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)        # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    return {w for w in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", expr)
            if w not in PROMQL_WORDS and not re.fullmatch(r"\d.*", w)}


def series_base(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and METRICS.get(name[: -len(suffix)]) == "histogram":
            return name[: -len(suffix)], suffix
    return name, ""


def dashboard_exprs(dash):
    """[(where, PromQL)] of the dashboard's panels and query variables."""
    exprs = []
    for v in (dash.get("templating") or {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            exprs.append((f"variable {v.get('name')}", q))
    for p in dash.get("panels") or []:
        for t in p.get("targets") or []:
            exprs.append((f"panel {p.get('title')!r}", t.get("expr", "")))
    return exprs


def promql_errors(exprs):
    """Parses each query with `promtool check rules` (Grafana's variables filled in)."""
    rules = []
    for i, (where, expr) in enumerate(exprs):
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr)
        if m:
            expr = m.group(1)
        expr = expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
        expr = re.sub(r"\$\{?\w+\}?", ".*", expr)
        rules.append({"record": f"komputed:check_{i}", "expr": expr})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    try:
        rc, out, err = run(["promtool", "check", "rules", f.name])
    finally:
        os.unlink(f.name)
    if rc == 0:
        return []
    errors = [(out + err).strip()]
    for n in re.findall(r"check_(\d+)", out + err):
        errors.append(f"{exprs[int(n)][0]}: {exprs[int(n)][1]}")
    return errors


def dashboard_errors(dash):
    errors = []
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in dash:
            errors.append(f"no {key}")
    variables = {v.get("name") for v in (dash.get("templating") or {}).get("list", [])}
    used_metrics, ids = set(), set()
    exprs = dashboard_exprs(dash)
    for p in dash.get("panels") or []:
        if p.get("id") in ids:
            errors.append(f"panel id {p.get('id')} used twice")
        ids.add(p.get("id"))
        if "gridPos" not in p:
            errors.append(f"panel {p.get('title')!r} has no gridPos")
        if p.get("type") == "row":
            continue
        if not p.get("targets"):
            errors.append(f"panel {p.get('title')!r} has no query")
    for where, expr in exprs:
        for var in re.findall(r"\$\{?(\w+)\}?", expr):
            if var.startswith("__"):
                continue
            if var not in variables:
                errors.append(f"{where}: ${var} is no dashboard variable")
        for name in metric_names(expr):
            base, _ = series_base(name)
            if base not in METRICS:
                errors.append(f"{where}: {name} is no komputed metric")
            used_metrics.add(base)
        for fn, arg in re.findall(r"\b(rate|increase|irate)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", expr):
            base, suffix = series_base(arg)
            if METRICS.get(base) == "gauge":
                errors.append(f"{where}: {fn}() of the gauge {arg}")
            if METRICS.get(base) == "histogram" and not suffix:
                errors.append(f"{where}: {fn}() of the histogram {arg} without _bucket/_sum/_count")
        if "_bucket" in expr and "histogram_quantile" in expr and "le)" not in expr and \
                "le," not in expr:
            errors.append(f"{where}: histogram_quantile without `by (le)`")
    for name in METRICS:
        if name not in used_metrics:
            errors.append(f"no panel shows {name}")
    for v in ("datasource",):
        if v not in variables:
            errors.append(f"no ${v} variable")
    return errors


def check_metrics(src, report):
    section = "metrics"
    path = os.path.join(src, "deploy", "grafana", "komputed-dashboard.json")
    try:
        dash = json.loads(read(path))
        report.result(section, "Grafana dashboard: every komputed metric and no other, rate() "
                      "only on counters", dashboard_errors(dash))
    except (OSError, json.JSONDecodeError) as e:
        report.result(section, "Grafana dashboard parses", [str(e)])
        dash = None

    scrape = os.path.join(src, "deploy", "prometheus", "scrape-config.yaml")
    errors = []
    if yaml is not None:
        try:
            cfg = yaml.safe_load(read(scrape)) or {}
            jobs = cfg.get("scrape_configs") or []
            if not jobs:
                errors.append("no scrape_configs")
            for job in jobs:
                if not job.get("job_name"):
                    errors.append("a job without job_name")
            k8s = [j for j in jobs if j.get("kubernetes_sd_configs")]
            if not k8s:
                errors.append("no job discovers pods through kubernetes_sd_configs")
            for j in k8s:
                text = json.dumps(j.get("relabel_configs") or [])
                for want in ("__meta_kubernetes_pod_label_app_kubernetes_io_name",
                             "__meta_kubernetes_pod_container_port_name"):
                    if want not in text:
                        errors.append(f"job {j.get('job_name')}: no relabel on {want}")
        except (OSError, yaml.YAMLError) as e:
            errors.append(str(e))
        report.result(section, "Prometheus scrape config: jobs keep komputed's metrics ports",
                      errors)
    else:
        report.skip(section, "Prometheus scrape config", "PyYAML is missing")
    if not shutil.which("promtool"):
        report.skip(section, "promtool check config and dashboard queries",
                    "promtool is not installed")
    else:
        rc, out, err = run(["promtool", "check", "config", "--syntax-only", scrape])
        if rc != 0 and "field kubernetes_sd_configs not found" in out + err:
            report.skip(section, "promtool check config", "this promtool is built without "
                        "Kubernetes discovery (Debian's is)")
        else:
            report.result(section, "promtool check config",
                          [] if rc == 0 else [(out + err).strip()])
        if dash is not None:
            report.result(section, "promtool parses every dashboard query",
                          promql_errors(dashboard_exprs(dash)))

    declared = set()
    for f in glob.glob(os.path.join(src, "server", "**", "*.*"), recursive=True):
        if f.endswith((".h", ".cc", ".hpp", ".cpp")):
            declared |= set(re.findall(r'"(komputed_[a-z0-9_]+)"', read(f)))
    if not declared:
        report.skip(section, "dashboard metrics are the server's",
                    "server/ names no komputed_* metric yet")
    else:
        missing = [m for m in METRICS if m not in declared]
        report.result(section, "dashboard metrics are declared in server/",
                      [f"{m} is not declared in server/ (dashboard and metrics table differ)"
                       for m in missing])


# ------------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source_dir")
    parser.add_argument("--build-dir", default=None,
                        help="the CMake build folder (default SOURCE_DIR/build)")
    a = parser.parse_args()
    src = os.path.abspath(a.source_dir)
    build_dir = os.path.abspath(a.build_dir or os.path.join(src, "build"))
    report = Report()
    if yaml is None:
        print("note: PyYAML is missing (Debian: python3-yaml): sections that parse YAML skip")

    # the daemon's flags ---------------------------------------------------------------------------
    quotas, quotas_where = quota_names(src)
    known_flags, flags_where, errors = daemon_flag_names(src, build_dir)
    if not quotas:
        errors.append(f"no quota names ({quotas_where})")
    report.result("flags", f"the daemon's flags, from {flags_where} "
                  f"({len(known_flags or ())} flags; quotas from {quotas_where})", errors)

    # kustomize + objects -------------------------------------------------------------------------
    major, why = kustomize_version()
    rendered = {}
    base_flags = None
    flags_path = os.path.join(src, "deploy", "base", "komputed.flags")
    if os.path.isfile(flags_path):
        base_flags, _ = parse_flagfile(read(flags_path))
    if major is None or major < 4:
        reason = why if major is None else f"{why}: need kustomize v4 or later"
        report.skip("kustomize", "render deploy/base and overlays", reason)
        report.skip("objects", "structural checks of the rendered overlays", reason)
    else:
        for target in ("base", "overlays/gpu", "overlays/cpu"):
            objs, errors = render(os.path.join(src, "deploy", target))
            report.result("kustomize", f"kubectl kustomize deploy/{target}", errors)
            rendered[target] = objs
        if yaml is None:
            report.skip("objects", "structural checks", "PyYAML is missing")
        else:
            for variant in ("gpu", "cpu"):
                objs = rendered.get(f"overlays/{variant}")
                if objs is None:
                    report.result("objects", f"overlays/{variant}", ["did not render"])
                    continue
                report.result("objects", f"overlays/{variant}: gRPC probes on the "
                              "--health_listen port, resources, security, "
                              "labels, grace period, Services, TLS, tenants, Secret mounts, flags, "
                              "NetworkPolicy", check_objects(objs, variant, known_flags))
                errors = []
                for what, breaker, *want in mutations(variant):
                    broken = copy.deepcopy(objs)
                    try:
                        breaker(broken)
                    except (KeyError, IndexError, StopIteration, AttributeError, TypeError) as e:
                        errors.append(f"could not make a copy with {what}: {e!r}")
                        continue
                    found = check_objects(broken, variant, known_flags)
                    if not found:
                        errors.append(f"the check passes a copy with {what}")
                    elif want and not any(want[0] in e for e in found):
                        errors.append(f"a copy with {what} fails, but with no {want[0]!r} error: "
                                      f"{found}")
                report.result("objects", f"self-test: overlays/{variant} copies with a rule broken "
                              f"fail ({len(mutations(variant))} cases)", errors)
            # Copies of deploy/ with a file broken: the check of the rendered copy must name it.
            def no_readiness(text):
                return remove_yaml_block(text, "readinessProbe")

            def no_health_listen(text):
                out = re.sub(r"(?m)^--health_listen=.*\n", "", text)
                return out, out != text

            copies = [("base/daemonset.yaml", "the readiness probe", no_readiness,
                       "readinessProbe"),
                      ("base/komputed.flags", "--health_listen", no_health_listen,
                       "no --health_listen")]
            for rel, what, breaker, want in copies:
                errors = []
                with tempfile.TemporaryDirectory() as tmp:
                    copy_dir = os.path.join(tmp, "deploy")
                    shutil.copytree(os.path.join(src, "deploy"), copy_dir)
                    path = os.path.join(copy_dir, rel)
                    text, removed = breaker(read(path))
                    if not removed:
                        errors.append(f"deploy/{rel} has no {what} to remove")
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(text)
                    objs, rerrs = render(os.path.join(copy_dir, "overlays", "gpu"))
                    if objs is None:
                        errors.append(f"the broken copy did not render: {rerrs}")
                    else:
                        found = check_objects(objs, "gpu", known_flags)
                        if not any(want in e for e in found):
                            errors.append(f"no {want!r} error for the broken copy: {found}")
                report.result("objects", f"self-test: a copy of deploy/ without {what} in "
                              f"{rel} fails", errors)

    # yamllint ------------------------------------------------------------------------------------
    config = os.path.join(src, "tests", "deploy", "yamllint.yaml")
    files = [os.path.join(src, "helm", "komputed", f) for f in ("Chart.yaml", "values.yaml")]
    files += sorted(glob.glob(os.path.join(src, "helm", "komputed", "ci", "*.yaml")))
    for d in ("deploy", "docker"):
        for ext in ("yaml", "yml"):
            files += sorted(glob.glob(os.path.join(src, d, "**", f"*.{ext}"), recursive=True))
    files.append(config)
    if not shutil.which("yamllint"):
        report.skip("yamllint", "plain YAML files", "yamllint is not installed: apt-get install "
                    "yamllint")
    else:
        rc, out, err = run(["yamllint", "-s", "-f", "parsable", "-c", config] + files, cwd=src)
        report.result("yamllint", f"{len(files)} plain YAML files (helm Chart/values/ci, deploy/, "
                      "docker/)", [ln for ln in (out + err).splitlines() if ln.strip()]
                      if rc != 0 else [])

    # helm, docker, metrics ----------------------------------------------------------------------
    check_helm(src, report, base_flags, quotas, quotas_where)
    check_helm_render(src, report, known_flags)
    check_docker(src, build_dir, report)
    check_metrics(src, report)

    print(f"deploy: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

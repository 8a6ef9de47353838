#!/usr/bin/env python3
"""Checks that deploy/ fits together: Dockerfiles, kustomize overlays, the Helm chart and
the server binary they run, also with TLS, mTLS and tokens turned on.

Renders every overlay with `kubectl kustomize` (offline), parses the YAML and asserts what
docs in deploy/README.md promise: the sidecar is a native sidecar with a startup probe on
the unix socket the worker dials, through a shared emptyDir; the pool's probes use the
ports the server listens on; images, ports and flags match the Dockerfiles and the
server's --help; resources are set; the HPA scales the pool's Deployment on the queue
depth metric the server really exports (read from a live /metrics scrape); grace periods
exceed the drain timeout; the headless Service selects the Deployment's pods. The Helm
chart's values referenced by its templates must exist, and its defaults must agree with
the kustomize manifests; it is rendered and checked like them only when `helm` exists.
Security on (the chart with TLS, mTLS and tokens; deploy/k8s/examples/security): the file
flags point into whole read-only secret volumes at the secrets' key names, the probes are
TCP connects, Prometheus is told /metrics is HTTPS, the cert-manager Certificates name the
Service and chain, the chart equals the example where they overlap, and the real server
started with the rendered args (the secret folders mapped to an openssl-made PKI) serves
the certificate on gRPC and /metrics over HTTPS only.

Run by ctest (tests/CMakeLists.txt). Without kubectl it checks the kustomize bases as
written instead of the rendered overlays and exits 77 (ctest: skipped) unless a check failed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import yaml

SKIP = 77
failures = []
passes = 0


def check(condition, what):
    global passes
    if condition:
        passes += 1
    else:
        failures.append(what)
        print(f"FAIL: {what}")
    return condition


# ---------------------------------------------------------------------------------------
# Dockerfiles.

def parse_dockerfile(path):
    """The runtime (last) stage's image label, EXPOSEd ports, ENTRYPOINT and CMD, and the
    build stage's RUN lines, COPY destinations of binaries. A stage FROM an earlier stage
    starts with what that one set ("from" stays the base image)."""
    text = open(path).read()
    # Join continuation lines.
    text = re.sub(r"\\\n", " ", text)
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    stages = []
    named = {}
    for line in lines:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            words = rest.split()
            parent = named.get(words[0])
            # FROM an earlier stage: start from what that stage set (runtime-base).
            stage = ({"from": words[0], "run": [], "expose": [], "labels": {}, "copy": []}
                     if parent is None else json.loads(json.dumps(parent)))
            if len(words) == 3 and words[1].upper() == "AS":
                named[words[2]] = stage
            stages.append(stage)
        elif not stages:
            continue
        elif word == "RUN":
            stages[-1]["run"].append(rest)
        elif word == "EXPOSE":
            stages[-1]["expose"] += [int(p.split("/")[0]) for p in rest.split()]
        elif word == "LABEL":
            for key, value in re.findall(r'([\w.\-]+)="([^"]*)"', rest):
                stages[-1]["labels"][key] = value
        elif word in ("ENTRYPOINT", "CMD"):
            stages[-1][word.lower()] = json.loads(rest)
        elif word == "COPY":
            stages[-1]["copy"].append(rest.split())
    return stages


def check_dockerfile(path, repo):
    stages = parse_dockerfile(path)
    name = os.path.basename(path)
    check(len(stages) >= 2, f"{name}: multi-stage (build + runtime)")
    build, runtime = stages[0], stages[-1]
    # CI runs scripts/test.sh = setup.sh + build.sh; the build stage must run the same two.
    ci = open(os.path.join(repo, "scripts/test.sh")).read()
    for script in ("scripts/setup.sh", "scripts/build.sh"):
        check(script in ci, f"scripts/test.sh (CI) runs {script}")
        check(any(r.startswith(f"bash {script}") for r in build["run"]),
              f"{name}: build stage runs `bash {script}` as CI does")
    targets = [r.split()[2:] for r in build["run"] if r.startswith("bash scripts/build.sh")]
    targets = targets[0] if targets else []
    cmake_text = ""
    for root, _, files in os.walk(repo):
        if "/build" in root or "/.git" in root:
            continue
        for f in files:
            if f == "CMakeLists.txt":
                cmake_text += open(os.path.join(root, f)).read()
    for target in targets:
        check(re.search(rf"add_executable\(\s*{re.escape(target)}\b", cmake_text) is not None,
              f"{name}: build target {target} is a CMake executable")
    image = runtime["labels"].get("io.centroidkv.image")
    check(image is not None, f"{name}: runtime stage has LABEL io.centroidkv.image")
    binaries = {}
    for args in runtime["copy"]:
        if any(a.startswith("--from=") for a in args):
            for src in args[1:-1]:
                binaries[os.path.basename(src)] = os.path.join(args[-1], os.path.basename(src))
    check("centroidkv-server" in binaries and "centroidkv" in binaries,
          f"{name}: runtime stage has centroidkv-server and the centroidkv CLI (exec probe)")
    entry = runtime.get("entrypoint", [])
    check(entry[:1] == [binaries.get("centroidkv-server")],
          f"{name}: ENTRYPOINT is the server binary ({entry})")
    return {"image": image, "expose": runtime["expose"], "cmd": runtime.get("cmd", []),
            "binaries": binaries, "user": any("useradd" in r for r in runtime["run"]),
            "from": runtime["from"]}


# Packages debian:12-slim already has (Priority: required), which the runtime stage's
# apt-get line need not name.
SLIM_BASE = {"libc6", "libstdc++6", "libgcc-s1", "zlib1g"}


def check_runtime_packages(dockerfile, binaries):
    """Every shared library the binaries load here (Debian 12, as in the build stage) comes
    from a package the CPU runtime stage installs, one of their dependencies, or the base."""
    if shutil.which("dpkg") is None or shutil.which("ldd") is None:
        print("NOTE: no dpkg/ldd: the runtime packages of Dockerfile.cpu were not checked")
        return
    text = re.sub(r"\\\n", " ", open(dockerfile).read())
    installs = re.findall(r"apt-get install -y --no-install-recommends ([^&]+)", text)
    listed = set(installs[-1].split()) if installs else set()
    allowed = listed | SLIM_BASE
    for package in listed:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", package],
                             capture_output=True, text=True).stdout
        allowed |= {d.strip().split()[0].split(":")[0] for d in re.split(r"[,|]", out) if d.strip()}
    libraries = set()
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        libraries |= set(re.findall(r"=> (/\S+)", out))
    for library in sorted(libraries):
        real = os.path.realpath(library)
        candidates = {library, real}
        for path in list(candidates):
            candidates.add(path[4:] if path.startswith("/usr/") else "/usr" + path)
        owner = None
        for path in candidates:
            out = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
            if out.returncode == 0:
                owner = out.stdout.split(":")[0]
                break
        check(owner is not None and owner in allowed,
              f"Dockerfile.cpu runtime provides {os.path.basename(library)} (package {owner})")


# ---------------------------------------------------------------------------------------
# The server binary: flags from --help, metric names from a live scrape.

def server_flags(server_bin):
    out = subprocess.run([server_bin, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


# The server's own defaults (from --help) of the flags its memory bound is made of, set by
# main().
MEMORY_FLAGS = ("--max-total-bytes", "--max-pooled-input-bytes", "--max-pooled-result-bytes",
                "--max-transport-bytes")
MEMORY_FLAG_DEFAULTS = {}
# The terms of the server's stated RSS bound that no flag sets (--max-transport-bytes' help,
# docs/reliability.md "The memory bound"): the idle process and the tested fixed overhead
# (gRPC's per-connection and per-stream state, thread stacks, heap slack).
IDLE_PROCESS_BYTES = 20 * 2**20
FIXED_OVERHEAD_BYTES = 64 * 2**20
# The cpu engine's reusable scratch (per-thread chunk buffers, pooled float64 head rows) is
# not budgeted by any flag; a pod's limit leaves this much per --threads above the bound.
ENGINE_SCRATCH_BYTES_PER_THREAD = 64 * 2**20


def memory_bound(args):
    """The server's stated RSS bound for these flags (docs/reliability.md): the idle process
    + --max-total-bytes (jobs in flight) + the idle input pool (--max-pooled-input-bytes, at
    most --max-total-bytes) + --max-pooled-result-bytes + --max-transport-bytes + the fixed
    overhead. Returns (bytes, {flag: the value used}); None where a flag has no value."""
    values = {flag: arg_value(args, flag) or MEMORY_FLAG_DEFAULTS.get(flag)
              for flag in MEMORY_FLAGS}
    if any(v is None for v in values.values()):
        return None, values
    size = {flag: quantity(v) for flag, v in values.items()}
    total = size["--max-total-bytes"]
    bound = (IDLE_PROCESS_BYTES + total + min(size["--max-pooled-input-bytes"], total) +
             size["--max-pooled-result-bytes"] + size["--max-transport-bytes"] +
             FIXED_OVERHEAD_BYTES)
    return bound, values


def server_default(server_bin, flag):
    """The default CLI11 prints for `flag` (the last `=VALUE` of its --help line), or None."""
    out = subprocess.run([server_bin, "--help"], capture_output=True, text=True, check=True).stdout
    match = re.search(re.escape(flag) + r" [^\n]*=([^ \n=]+)$", out, re.M)
    return match.group(1) if match else None


def read_log_until(proc, patterns, seconds=30):
    """Reads a started server's log lines until every regex in `patterns` has matched, the
    log ends or `seconds` pass. Returns ({pattern: its first match}, the log read)."""
    matches = {}
    lines = []
    deadline = time.time() + seconds
    while time.time() < deadline and len(matches) < len(patterns):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        for pattern in patterns:
            match = re.search(pattern, line)
            if match and pattern not in matches:
                matches[pattern] = match
    return matches, "".join(lines)


def stop_server(proc, seconds=20):
    """SIGTERM, then the exit status (None when it had to be killed)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


METRICS_LOG = r"metrics: (https?)://\S+ \(port (\d+)\)"
GRPC_LOG = r"this host dials [^ ]*:(\d+)\)"


def live_metric_types(server_bin):
    """Starts the server on loopback with metrics on a free port, scrapes /metrics, sends
    SIGTERM and checks it drains and exits 0. Returns {metric name: type}."""
    proc = subprocess.Popen([server_bin, "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                             "--threads=1", "--grace-period=5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    matches, log = read_log_until(proc, [METRICS_LOG])
    port = int(matches[METRICS_LOG].group(2)) if METRICS_LOG in matches else None
    types = {}
    try:
        if check(port is not None, "server logs its metrics port: " + log[-300:]):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
                types[m.group(1)] = m.group(2)
    finally:
        rc = stop_server(proc)
    check(rc == 0, f"server drains and exits 0 on SIGTERM (rc {rc})")
    return types


def check_socket_mode(server_bin):
    """The sidecar's worker may run as another user: the socket must be group-writable."""
    import stat
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckv.sock")
        proc = subprocess.Popen([server_bin, f"--listen=unix://{path}", "--metrics-listen=off",
                                 "--threads=1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                if os.path.exists(path):
                    break
                time.sleep(0.05)
            mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else None
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    check(mode is not None and mode & 0o060 == 0o060 and mode & 0o007 == 0,
          f"the server's unix socket is group read/write, closed to others ({oct(mode or 0)})")


# ---------------------------------------------------------------------------------------
# Manifests.

def quantity(text):
    """Kubernetes quantities (6Gi, 1536Mi, 500m) and CLI11 sizes (4GiB) -> number."""
    text = str(text)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "KiB": 2**10, "MiB": 2**20,
             "GiB": 2**30, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3, "": 1}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if not match or match.group(2) not in units:
        raise ValueError(f"bad quantity {text}")
    return float(match.group(1)) * units[match.group(2)]


def arg_value(args, flag):
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def check_container_common(where, container, docker, flags, pod_spec, metric_types):
    """Checks shared by the pool and the sidecar: image, flags, ports, grace, resources."""
    args = container.get("args", [])
    check("command" not in container, f"{where}: keeps the image's ENTRYPOINT (no command)")
    check(container.get("image") == docker["image"],
          f"{where}: image {container.get('image')} == Dockerfile's {docker['image']}")
    for a in args:
        check(a.split("=", 1)[0] in flags, f"{where}: flag {a} is one of the server's flags")
    check(all(a.split("=", 1)[0] in flags for a in docker["cmd"]),
          f"{where}: the Dockerfile's CMD flags are the server's flags")
    grace = float(arg_value(args, "--grace-period") or 20)
    tgp = pod_spec.get("terminationGracePeriodSeconds", 30)
    check(tgp > grace, f"{where}: terminationGracePeriodSeconds {tgp} > --grace-period {grace}")
    metrics = arg_value(args, "--metrics-listen")
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if check(metrics is not None, f"{where}: metrics are on"):
        check(ports.get("metrics") == port_of(metrics),
              f"{where}: metrics containerPort == --metrics-listen port {port_of(metrics)}")
        check(port_of(metrics) in docker["expose"],
              f"{where}: metrics port {port_of(metrics)} is EXPOSEd by the Dockerfile")
    resources = container.get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    check("cpu" in requests and "memory" in requests and "memory" in limits,
          f"{where}: cpu and memory requests, memory limit")
    # The memory limit holds the server's stated bound for the flags it runs with, plus room
    # for the engine's unbudgeted scratch; the request equals the limit (the bound is what
    # the server may really use, so the scheduler must reserve it).
    threads = arg_value(args, "--threads")
    bound, values = memory_bound(args)
    if check(bound is not None, f"{where}: every term of the memory bound has a value {values}") \
            and "memory" in limits:
        scratch = ENGINE_SCRATCH_BYTES_PER_THREAD * int(threads or 1)
        mib = 2**20
        terms = ", ".join(f"{flag} {value}" for flag, value in values.items())
        check(quantity(limits["memory"]) >= bound + scratch,
              f"{where}: memory limit {limits['memory']} ({quantity(limits['memory']) / mib:.0f} "
              f"MiB) >= the server's bound {bound / mib:.0f} MiB ({terms}, idle process and "
              f"fixed overhead {(IDLE_PROCESS_BYTES + FIXED_OVERHEAD_BYTES) / mib:.0f} MiB) + "
              f"engine scratch {scratch / mib:.0f} MiB ({threads or 1} threads)")
        if "memory" in requests:
            check(quantity(requests["memory"]) == quantity(limits["memory"]),
                  f"{where}: memory request {requests['memory']} == limit {limits['memory']}")
    if threads and "cpu" in requests:
        check(quantity(requests["cpu"]) >= int(threads),
              f"{where}: cpu request {requests['cpu']} covers --threads {threads}")
    return args, ports, grace


def by_kind(docs, kind):
    return [d for d in docs if d and d.get("kind") == kind]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_sidecar(where, docs, docker, flags, metric_types):
    deployments = by_kind(docs, "Deployment")
    if not check(len(deployments) == 1, f"{where}: one Deployment (the worker)"):
        return
    spec = deployments[0]["spec"]["template"]["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("image") == docker["image"]]
    if not check(len(sidecars) == 1, f"{where}: the server is an initContainer"):
        return
    sidecar = sidecars[0]
    check(sidecar.get("restartPolicy") == "Always",
          f"{where}: restartPolicy Always (a native sidecar)")
    args, ports, _ = check_container_common(where + "/sidecar", sidecar, docker, flags, spec,
                                            metric_types)
    listen = arg_value(args, "--listen") or ""
    check(listen.startswith("unix:///"), f"{where}: listens on a unix socket ({listen})")
    socket_dir = os.path.dirname(listen[len("unix://"):])
    volumes = {v["name"]: v for v in spec.get("volumes", [])}

    def mount_of(container):
        for m in container.get("volumeMounts", []):
            if m["mountPath"] == socket_dir:
                return m["name"]
        return None

    volume = mount_of(sidecar)
    check(volume is not None and "emptyDir" in volumes.get(volume, {}),
          f"{where}: the socket's folder {socket_dir} is an emptyDir mounted by the sidecar")
    # The server creates its socket srwxrwx--- (server_main.cc); the pod's fsGroup owns the
    # emptyDir (so the socket) and is a supplementary group of every container.
    group = sidecar.get("securityContext", {}).get("runAsGroup")
    check(group is not None and spec.get("securityContext", {}).get("fsGroup") == group,
          f"{where}: pod fsGroup == the sidecar's runAsGroup {group} (workers may dial the socket)")
    probe = sidecar.get("startupProbe", {})
    command = probe.get("exec", {}).get("command", [])
    check(bool(command), f"{where}: the sidecar has an exec startupProbe")
    check(command[:1] == [docker["binaries"].get("centroidkv")] and listen in command,
          f"{where}: the startup probe runs the image's CLI on {listen} ({command})")
    check(sidecar.get("livenessProbe", {}).get("exec", {}).get("command") == command,
          f"{where}: the liveness probe is the same check")
    workers = spec.get("containers", [])
    check(len(workers) >= 1, f"{where}: a worker container")
    for worker in workers:
        env = {e["name"]: e.get("value") for e in worker.get("env", [])}
        check(listen in env.values() or listen in worker.get("args", []),
              f"{where}/{worker['name']}: dials the sidecar's socket {listen}")
        check(mount_of(worker) == volume,
              f"{where}/{worker['name']}: mounts the same emptyDir at {socket_dir}")
        check("requests" in worker.get("resources", {}), f"{where}/{worker['name']}: resources")
    check("nvidia.com/gpu" not in str(sidecar.get("resources")),
          f"{where}: the sidecar is the CPU variant (a GPU would be its own, not the worker's)")


def check_pool(where, docs, docker, flags, metric_types, gpu, queue_metric, tls=False):
    """tls: rendered with TLS on, where the probes must be TCP connects (kubelet's gRPC
    probes speak plaintext only)."""
    deployments = by_kind(docs, "Deployment")
    services = by_kind(docs, "Service")
    pdbs = by_kind(docs, "PodDisruptionBudget")
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    if not check(len(deployments) == 1 and len(services) == 1 and len(pdbs) == 1 and
                 len(hpas) == 1, f"{where}: one Deployment, Service, PDB and HPA"):
        return
    deployment, service, pdb, hpa = deployments[0], services[0], pdbs[0], hpas[0]
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    spec = template["spec"]
    containers = [c for c in spec["containers"] if c.get("image") == docker["image"]]
    if not check(len(containers) == 1, f"{where}: the server container runs {docker['image']}"):
        return
    container = containers[0]
    args, ports, grace = check_container_common(where, container, docker, flags, spec,
                                                metric_types)
    listen = arg_value(args, "--listen") or ""
    grpc_port = port_of(listen) if re.search(r":\d+$", listen) else None
    check(grpc_port is not None and ports.get("grpc") == grpc_port,
          f"{where}: grpc containerPort == --listen port ({listen})")
    check(grpc_port in docker["expose"], f"{where}: gRPC port {grpc_port} is EXPOSEd")
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(name, {})
        if tls:
            check("grpc" not in probe and
                  probe.get("tcpSocket", {}).get("port") in (grpc_port, "grpc"),
                  f"{where}: under TLS {name} is a tcpSocket probe of the gRPC port "
                  f"{grpc_port}, not a (plaintext) gRPC probe ({probe})")
        else:
            check(probe.get("grpc", {}).get("port") == grpc_port,
                  f"{where}: {name} is a gRPC health probe on port {grpc_port}")
    live = container.get("livenessProbe", {})
    check(live.get("periodSeconds", 10) * live.get("failureThreshold", 3) > grace,
          f"{where}: liveness tolerates NOT_SERVING for longer than the drain ({grace} s)")
    annotations = template["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/port") == str(ports.get("metrics")),
          f"{where}: prometheus.io/port annotation == metrics port")
    gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    check((gpus is not None and int(gpus) >= 1) if gpu else gpus is None,
          f"{where}: nvidia.com/gpu limit {'set' if gpu else 'absent'} ({gpus})")
    # Selection: Deployment -> its pods; headless Service and PDB -> the same pods.
    check(selects(deployment["spec"]["selector"]["matchLabels"], labels),
          f"{where}: the Deployment's selector matches its pod labels")
    check(service["spec"].get("clusterIP") == "None", f"{where}: the Service is headless")
    check(selects(service["spec"].get("selector"), labels),
          f"{where}: the Service selects the Deployment's pods")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    grpc_sp = service_ports.get("grpc", {})
    check(grpc_sp.get("port") == grpc_port and grpc_sp.get("targetPort") in ("grpc", grpc_port),
          f"{where}: the Service's grpc port reaches the container's gRPC port")
    check(selects(pdb["spec"]["selector"]["matchLabels"], labels),
          f"{where}: the PodDisruptionBudget selects the Deployment's pods")
    check(hpa["apiVersion"] == "autoscaling/v2", f"{where}: HPA is autoscaling/v2")
    target = hpa["spec"]["scaleTargetRef"]
    check(target.get("kind") == "Deployment" and target.get("name") ==
          deployment["metadata"]["name"], f"{where}: the HPA scales the pool's Deployment")
    metrics = hpa["spec"].get("metrics", [])
    names = [m.get("pods", {}).get("metric", {}).get("name") for m in metrics
             if m.get("type") == "Pods"]
    check(names == [queue_metric], f"{where}: the HPA's Pods metric is {queue_metric} ({names})")
    check(metric_types.get(queue_metric) == "gauge",
          f"{where}: the server exports {queue_metric} as a gauge (live scrape)")


def load_base(path):
    """The resources a kustomization lists, as written (no kustomize transformations)."""
    kustomization = yaml.safe_load(open(os.path.join(path, "kustomization.yaml")))
    docs = []
    for resource in kustomization.get("resources", []):
        docs += list(yaml.safe_load_all(open(os.path.join(path, resource))))
    return docs


def render(kubectl, path):
    out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
    if not check(out.returncode == 0, f"kubectl kustomize {path}: {out.stderr.strip()}"):
        return []
    return list(yaml.safe_load_all(out.stdout))


# ---------------------------------------------------------------------------------------
# Security turned on: TLS, mTLS and bearer tokens (docs/security.md).

# The values the chart is rendered with, and what the kustomize example
# (deploy/k8s/examples/security) sets: mTLS, tokens and a per-caller stream limit.
TLS_SECRET = "centroidkv-tls"
TOKENS_SECRET = "centroidkv-tokens"
HELM_SECURITY_VALUES = ["security.tls.enabled=true", "security.tls.mtls=true",
                        f"security.tls.secretName={TLS_SECRET}",
                        f"security.tokens.secretName={TOKENS_SECRET}",
                        "security.maxCallerStreams=64"]

# The server's file flags: the secret each file must come from and the key it is named
# after there (cert-manager's kubernetes.io/tls secret: tls.crt, tls.key, ca.crt).
SECURITY_FILES = {"--tls-cert": ("tls", "tls.crt"), "--tls-key": ("tls", "tls.key"),
                  "--tls-client-ca": ("tls", "ca.crt"),
                  "--auth-tokens-file": ("tokens", "tokens")}


def server_container(docs):
    deployments = by_kind(docs, "Deployment")
    if not deployments:
        return None, None
    template = deployments[0]["spec"]["template"]
    containers = [c for c in template["spec"]["containers"] if c["name"] == "centroidkv"]
    return template, (containers[0] if containers else None)


def check_security(where, docs, secrets, mtls):
    """The pool rendered with TLS (+ mTLS when `mtls`, + tokens when secrets has a
    "tokens" secret). Every file flag points
    into a read-only volume of the whole right secret (no subPath: the kubelet swaps such
    files when the secret changes, which the server's reloading relies on), at the name of
    the key that secret holds; Prometheus is told /metrics is HTTPS. Returns
    {mountPath: secret role} for the live check."""
    template, container = server_container(docs)
    if not check(container is not None, f"{where}: the server container"):
        return {}
    pod = template["spec"]
    args = container.get("args", [])
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    folders = {}
    for flag, (role, key) in SECURITY_FILES.items():
        path = arg_value(args, flag)
        if (flag == "--tls-client-ca" and not mtls) or role not in secrets:
            check(path is None, f"{where}: no {flag} when that feature is off")
            continue
        if not check(path is not None, f"{where}: the args carry {flag}"):
            continue
        check(os.path.basename(path) == key,
              f"{where}: {flag} {path} is the secret's key {key}")
        mount = [m for m in mounts if m["mountPath"].rstrip("/") == os.path.dirname(path)]
        if not check(len(mount) == 1, f"{where}: {flag} {path} lies in a mounted volume"):
            continue
        mount = mount[0]
        check(mount.get("readOnly") is True and "subPath" not in mount,
              f"{where}: {flag}'s volume is mounted read-only and whole (no subPath)")
        secret = volumes.get(mount["name"], {}).get("secret", {}).get("secretName")
        check(secret == secrets[role],
              f"{where}: {flag} comes from secret {secrets[role]} (volume {mount['name']}: "
              f"{secret})")
        folders[mount["mountPath"].rstrip("/")] = role
    refresh = arg_value(args, "--tls-refresh-seconds")
    check(refresh is not None and int(refresh) >= 1,
          f"{where}: --tls-refresh-seconds set (rotated secrets are re-read)")
    annotations = template["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/scheme") == "https",
          f"{where}: prometheus.io/scheme is https (/metrics is served over TLS)")
    return folders


def check_certificates(where, docs, tls_secret, service_name, namespace, issuers_rendered):
    """cert-manager: a server Certificate writes the secret the pool mounts, for the
    Service's names; with the issuers rendered too (the kustomize example), they chain:
    the server's and the workers' client certificates come from one CA Issuer, so the
    server's ca.crt (its --tls-client-ca) verifies the workers."""
    certificates = by_kind(docs, "Certificate")
    servers = [c for c in certificates if c["spec"].get("secretName") == tls_secret]
    if not check(len(servers) == 1, f"{where}: one Certificate writes secret {tls_secret}"):
        return
    spec = servers[0]["spec"]
    check(servers[0]["apiVersion"] == "cert-manager.io/v1", f"{where}: cert-manager.io/v1")
    check("server auth" in spec.get("usages", []), f"{where}: the server certificate is for "
          "server auth")
    names = spec.get("dnsNames", [])
    for name in (service_name, f"{service_name}.{namespace}.svc",
                 f"{service_name}.{namespace}.svc.cluster.local"):
        check(name in names, f"{where}: the server certificate names {name} ({names})")
    check(quantity_hours(spec.get("renewBefore", "0h")) <
          quantity_hours(spec.get("duration", "0h")),
          f"{where}: renewBefore < duration")
    if not issuers_rendered:
        return
    issuers = {d["metadata"]["name"]: d for d in by_kind(docs, "Issuer")}
    issuer = issuers.get(spec["issuerRef"]["name"])
    if not check(issuer is not None and "ca" in issuer["spec"],
                 f"{where}: the server certificate's issuer is a CA Issuer in the example"):
        return
    ca_secret = issuer["spec"]["ca"]["secretName"]
    check(any(c["spec"].get("isCA") and c["spec"].get("secretName") == ca_secret
              for c in certificates),
          f"{where}: a CA Certificate makes the CA Issuer's secret {ca_secret}")
    clients = [c for c in certificates if "client auth" in c["spec"].get("usages", [])]
    check(len(clients) >= 1 and all(c["spec"]["issuerRef"] == spec["issuerRef"] for c in clients),
          f"{where}: client certificates come from the server certificate's issuer")


def quantity_hours(text):
    match = re.fullmatch(r"(\d+)h", str(text))
    return int(match.group(1)) if match else 0


def make_pki(folder):
    """A CA and a server certificate for localhost / 127.0.0.1 made with openssl; returns
    (ca.crt, tls.crt, tls.key) paths."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=check-manifests-ca", "-days", "2")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=localhost")
    with open(os.path.join(folder, "san.ext"), "w") as ext:
        ext.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "san.ext")
    return tuple(os.path.join(folder, name) for name in ("ca.crt", "tls.crt", "tls.key"))


def live_security(where, server_bin, docs, folders):
    """Runs the real server with the rendered args, each secret folder mapped to files made
    here (openssl's CA and server certificate; a tokens file), listening on loopback: it
    must start, present a certificate chaining to the CA on the gRPC port, serve /metrics
    over HTTPS to a scraper trusting the CA, answer nothing over plain HTTP, and drain on
    SIGTERM."""
    import socket
    import ssl
    import tempfile
    _, container = server_container(docs)
    if container is None or shutil.which("openssl") is None:
        print(f"NOTE: {where}: no server container or no openssl: not started")
        return
    with tempfile.TemporaryDirectory() as root:
        pki = os.path.join(root, "pki")
        os.makedirs(pki)
        ca, cert, key = make_pki(pki)
        mapped = {}
        for mount_path, role in folders.items():
            local = os.path.join(root, "mount" + mount_path.replace("/", "_"))
            os.makedirs(local)
            if role == "tls":
                for source, name in ((ca, "ca.crt"), (cert, "tls.crt"), (key, "tls.key")):
                    shutil.copy(source, os.path.join(local, name))
            else:
                with open(os.path.join(local, "tokens"), "w") as tokens:
                    tokens.write("check-manifests-token worker-a\n")
            mapped[mount_path] = local
        args = []
        for a in container.get("args", []):
            flag, _, value = a.partition("=")
            if flag == "--listen":
                value = "127.0.0.1:0"
            elif flag == "--metrics-listen":
                value = "127.0.0.1:0"
            elif flag == "--threads":
                value = "1"
            elif os.path.dirname(value) in mapped:
                value = os.path.join(mapped[os.path.dirname(value)], os.path.basename(value))
            args.append(f"{flag}={value}")
        proc = subprocess.Popen([server_bin, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        matches, log = read_log_until(proc, [GRPC_LOG, METRICS_LOG])
        try:
            if not check(len(matches) == 2,
                         f"{where}: the server starts with the rendered args: {log[-600:]}"):
                return
            grpc_port = int(matches[GRPC_LOG].group(1))
            metrics_port = int(matches[METRICS_LOG].group(2))
            check(matches[METRICS_LOG].group(1) == "https",
                  f"{where}: the server says /metrics is https")
            context = ssl.create_default_context(cafile=ca)
            try:
                with socket.create_connection(("127.0.0.1", grpc_port), timeout=10) as raw:
                    context.set_alpn_protocols(["h2"])
                    with context.wrap_socket(raw, server_hostname="localhost") as tls:
                        subject = dict(x[0] for x in tls.getpeercert()["subject"])
                served = subject.get("commonName")
            except (OSError, ssl.SSLError) as error:
                served = f"handshake failed: {error}"
            check(served == "localhost",
                  f"{where}: the gRPC port presents the mounted certificate ({served})")
            metrics_context = ssl.create_default_context(cafile=ca)
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{metrics_port}/metrics",
                                            timeout=10, context=metrics_context) as r:
                    body = r.read().decode()
            except OSError as error:
                body = f"failed: {error}"
            check("# TYPE centroidkv_" in body,
                  f"{where}: /metrics answers over HTTPS to a scraper trusting the CA "
                  f"({body[:120]})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                            timeout=10) as r:
                    plain = f"HTTP {r.status}"
            except OSError as error:
                plain = None
            check(plain is None, f"{where}: /metrics answers nothing over plain HTTP ({plain})")
        finally:
            rc = stop_server(proc, 30)
        check(rc == 0, f"{where}: the server with TLS drains and exits 0 on SIGTERM (rc {rc})")


# ---------------------------------------------------------------------------------------
# Helm chart.

# Sizing a chart user sets through values (threads, memory budgets) differs from the
# kustomize examples by design; everything else both express must be equal.
SIZING_FLAGS = ("--threads=", "--max-total-bytes=", "--max-pooled-input-bytes=",
                "--max-pooled-result-bytes=", "--max-transport-bytes=")


def overlap(docs):
    """What a helm rendering and a kustomize rendering of the same mode must share: per kind,
    the fields neither release names nor sizing values change."""
    out = {}
    for doc in docs:
        if not doc:
            continue
        kind, spec = doc["kind"], doc["spec"]
        if kind == "Deployment":
            pod = spec["template"]["spec"]
            pod_security = dict(pod.get("securityContext", {}))
            containers = {}
            for c in pod.get("initContainers", []) + pod["containers"]:
                containers[c["name"]] = {
                    "image": c["image"], "restartPolicy": c.get("restartPolicy"),
                    "args": [a for a in c.get("args", []) if not a.startswith(SIZING_FLAGS)],
                    "env": c.get("env"), "ports": c.get("ports"),
                    "volumeMounts": c.get("volumeMounts"),
                    "probes": {k: c.get(k) for k in ("startupProbe", "readinessProbe",
                                                     "livenessProbe")},
                    # Pod-level settings apply to every container; where a field is set
                    # does not matter, what each container runs with does.
                    "securityContext": {**{k: v for k, v in pod_security.items()
                                           if k != "fsGroup"}, **c.get("securityContext", {})},
                    "gpus": c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")}
            out[kind] = {"strategy": spec.get("strategy"),
                         "annotations": spec["template"]["metadata"].get("annotations"),
                         "terminationGracePeriodSeconds": pod.get("terminationGracePeriodSeconds"),
                         "fsGroup": pod_security.get("fsGroup"), "volumes": pod.get("volumes"),
                         "tolerations": pod.get("tolerations"), "containers": containers}
        elif kind == "Service":
            out[kind] = {"clusterIP": spec.get("clusterIP"), "ports": spec.get("ports")}
        elif kind == "PodDisruptionBudget":
            out[kind] = {"maxUnavailable": spec.get("maxUnavailable")}
        elif kind == "HorizontalPodAutoscaler":
            out[kind] = {k: spec.get(k) for k in ("minReplicas", "maxReplicas", "metrics")}
    return out


def check_helm_equals_kustomize(where, helm_docs, kustomize_docs):
    helm_view, kustomize_view = overlap(helm_docs), overlap(kustomize_docs)
    check(sorted(helm_view) == sorted(kustomize_view),
          f"{where}: helm renders the kinds kustomize does ({sorted(helm_view)} vs "
          f"{sorted(kustomize_view)})")
    for kind in sorted(set(helm_view) & set(kustomize_view)):
        for field in sorted(set(helm_view[kind]) | set(kustomize_view[kind])):
            a, b = helm_view[kind].get(field), kustomize_view[kind].get(field)
            if field != "containers" or not (a and b) or sorted(a) != sorted(b):
                check(a == b, f"{where}: {kind} {field}: helm {a} != kustomize {b}")
                continue
            for name in sorted(a):
                for key in sorted(a[name]):
                    check(a[name][key] == b[name].get(key),
                          f"{where}: container {name} {key}: helm {a[name][key]} != "
                          f"kustomize {b[name].get(key)}")


def helm_template(helm, chart, where, values, namespace=None):
    command = [helm, "template", "ckv", chart]
    for value in values:
        command += ["--set", value]
    if namespace:
        command += ["--namespace", namespace]
    out = subprocess.run(command, capture_output=True, text=True)
    if not check(out.returncode == 0, f"{where}: helm template {' '.join(values)}: {out.stderr}"):
        return None
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def check_helm_security(chart, helm, dockers, flags, metric_types, queue_metric, server_bin,
                        security_example):
    """The chart's security values turned on: with mTLS and tokens (compared with the
    kustomize example where they overlap, and started for real), with TLS alone, and with
    the cert-manager Certificate."""
    secrets = {"tls": TLS_SECRET, "tokens": TOKENS_SECRET}
    where = "helm/pool-security"
    docs = helm_template(helm, chart, where, HELM_SECURITY_VALUES)
    if docs is not None:
        check_pool(where, docs, dockers["cpu"], flags, metric_types, False, queue_metric, tls=True)
        folders = check_security(where, docs, secrets, mtls=True)
        check(not by_kind(docs, "Certificate"), f"{where}: no Certificate unless asked for")
        live_security(where, server_bin, docs, folders)
        if security_example:
            check_helm_equals_kustomize(f"{where} vs kustomize examples/security", docs,
                                        security_example)
    where = "helm/pool-tls-only"
    docs = helm_template(helm, chart, where, ["security.tls.enabled=true"])
    if docs is not None:
        check_pool(where, docs, dockers["cpu"], flags, metric_types, False, queue_metric, tls=True)
        check_security(where, docs, {"tls": TLS_SECRET}, mtls=False)
    where = "helm/pool-cert-manager"
    docs = helm_template(helm, chart, where,
                         HELM_SECURITY_VALUES + ["security.tls.certManager.enabled=true"],
                         namespace="inference")
    if docs is not None:
        services = by_kind(docs, "Service")
        if check(len(services) == 1, f"{where}: one Service"):
            check_certificates(where, docs, TLS_SECRET, services[0]["metadata"]["name"],
                               "inference", issuers_rendered=False)


def check_helm(chart, kustomize, dockers, flags, metric_types, queue_metric, helm,
               server_bin=None, security_example=None):
    """kustomize: {(mode, gpu): rendered docs} to compare helm's output with;
    security_example: the rendered deploy/k8s/examples/security (or None)."""
    meta = yaml.safe_load(open(os.path.join(chart, "Chart.yaml")))
    check(meta.get("apiVersion") == "v2", "Chart.yaml: apiVersion v2")
    for field in ("name", "version", "appVersion", "description"):
        check(bool(meta.get(field)), f"Chart.yaml: {field}")
    check(re.fullmatch(r"\d+\.\d+\.\d+", str(meta.get("version"))) is not None,
          "Chart.yaml: version is SemVer")
    version_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "VERSION")
    version = open(version_file).read().strip()
    check(str(meta.get("appVersion")) == version,
          f"Chart.yaml: appVersion {meta.get('appVersion')!r} is VERSION's {version!r}")
    values = yaml.safe_load(open(os.path.join(chart, "values.yaml")))
    templates = os.path.join(chart, "templates")
    used = set()
    for name in os.listdir(templates):
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", open(os.path.join(templates, name)).read()))
    for key in sorted(used):
        node = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        check(node is not None, f"helm: .Values.{key} used by a template exists in values.yaml")
    server = values["server"]
    check(f"{values['image']['repository']}:{values['image']['tag']}" == dockers["cpu"]["image"],
          "helm: default image == Dockerfile.cpu's")
    check(f"{values['image']['repository']}:{values['gpu']['imageTag']}" == dockers["cuda"]["image"],
          "helm: gpu image == Dockerfile.cuda's")
    check(server["grpcPort"] in dockers["cpu"]["expose"] and
          server["metricsPort"] in dockers["cpu"]["expose"], "helm: ports are EXPOSEd")
    check(values["terminationGracePeriodSeconds"] > server["gracePeriodSeconds"],
          "helm: terminationGracePeriodSeconds > server.gracePeriodSeconds")
    hpa_text = open(os.path.join(templates, "hpa.yaml")).read()
    check(f"name: {queue_metric}" in hpa_text, f"helm: the HPA names {queue_metric}")
    if helm is None:
        print("NOTE: helm is not installed: the chart's values and structure were checked, "
              "its rendered output was not")
        return
    check(subprocess.run([helm, "lint", chart]).returncode == 0, "helm lint")
    for mode, gpu in (("pool", False), ("pool", True), ("sidecar", False)):
        out = subprocess.run([helm, "template", "ckv", chart, "--set", f"mode={mode}",
                              "--set", f"gpu.enabled={str(gpu).lower()}"],
                             capture_output=True, text=True)
        if not check(out.returncode == 0, f"helm template mode={mode} gpu={gpu}: {out.stderr}"):
            continue
        docs = list(yaml.safe_load_all(out.stdout))
        docker = dockers["cuda" if gpu else "cpu"]
        if mode == "pool":
            check_pool(f"helm/{mode}{'-gpu' if gpu else ''}", docs, docker, flags, metric_types,
                       gpu, queue_metric)
        else:
            check_sidecar("helm/sidecar", docs, docker, flags, metric_types)
        if (mode, gpu) in kustomize:
            check_helm_equals_kustomize(f"helm/{mode}{'-gpu' if gpu else ''} vs kustomize",
                                        docs, kustomize[(mode, gpu)])
    check_helm_security(chart, helm, dockers, flags, metric_types, queue_metric, server_bin,
                        security_example)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--server-bin", required=True)
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--helm", default="helm")
    options = parser.parse_args()
    kubectl = shutil.which(options.kubectl)
    helm = shutil.which(options.helm)
    repo = options.repo
    deploy = os.path.join(repo, "deploy")
    dockers = {v: check_dockerfile(os.path.join(deploy, "docker", f"Dockerfile.{v}"), repo)
               for v in ("cpu", "cuda")}
    check(dockers["cpu"]["from"].startswith("debian:12"), "Dockerfile.cpu runs on Debian 12")
    check(dockers["cuda"]["from"].startswith("nvidia/cuda:13."), "Dockerfile.cuda on nvidia/cuda 13")
    for variant, docker in dockers.items():
        check(docker["user"], f"Dockerfile.{variant}: creates a non-root user")
    flags = server_flags(options.server_bin)
    for flag in MEMORY_FLAGS:
        default = server_default(options.server_bin, flag)
        if check(default is not None, f"--help prints the {flag} default"):
            MEMORY_FLAG_DEFAULTS[flag] = default
    cli_bin = os.path.join(os.path.dirname(options.server_bin), "centroidkv")
    check_runtime_packages(os.path.join(deploy, "docker", "Dockerfile.cpu"),
                           [options.server_bin] + ([cli_bin] if os.path.exists(cli_bin) else []))
    metric_types = live_metric_types(options.server_bin)
    check_socket_mode(options.server_bin)
    header = open(os.path.join(repo, "service/service_metrics.h")).read()
    match = re.search(r'kQueueDepthMetric\[\] = "([^"]+)"', header)
    queue_metric = match.group(1) if match else None
    check(queue_metric is not None, "service_metrics.h names the queue depth metric")
    rules = yaml.safe_load(open(os.path.join(deploy, "k8s/prometheus-adapter-rules.yaml")))
    check([r["name"]["as"] for r in rules["rules"]["custom"]] == [queue_metric],
          "Prometheus Adapter rule exposes the queue depth metric under its name")

    # Without kubectl (not a Debian 12 package), check the bases as written and skip the
    # overlays; the test then reports skipped unless something failed.
    if kubectl is None:
        base = os.path.join(deploy, "k8s/base")
        check_sidecar("base/sidecar", load_base(os.path.join(base, "sidecar")), dockers["cpu"],
                      flags, metric_types)
        pool_docs = load_base(os.path.join(base, "pool"))
        check_pool("base/pool", pool_docs, dockers["cpu"], flags, metric_types, False,
                   queue_metric)
        check_helm(os.path.join(deploy, "helm/centroidkv"), {}, dockers, flags,
                   metric_types, queue_metric, helm, options.server_bin)
        print(f"{passes} checks passed, {len(failures)} failed")
        if failures:
            return 1
        print("SKIPPED: kubectl not found: the Dockerfiles, the server, the kustomize bases and "
              "the Helm chart were checked, but no overlay was rendered (kubectl is not a "
              "Debian 12 package; install it to check deploy/k8s/overlays)")
        return SKIP

    overlays = os.path.join(deploy, "k8s/overlays")
    check(sorted(os.listdir(overlays)) == ["pool", "pool-gpu", "sidecar"],
          "overlays: sidecar, pool, pool-gpu")
    rendered = {key: render(kubectl, os.path.join(overlays, overlay))
                for key, overlay in ((("sidecar", False), "sidecar"), (("pool", False), "pool"),
                                     (("pool", True), "pool-gpu"))}
    check_sidecar("sidecar", rendered[("sidecar", False)], dockers["cpu"], flags, metric_types)
    check_pool("pool", rendered[("pool", False)], dockers["cpu"], flags, metric_types, False,
               queue_metric)
    check_pool("pool-gpu", rendered[("pool", True)], dockers["cuda"], flags, metric_types, True,
               queue_metric)
    # The security example: the pool with mTLS, tokens and cert-manager Certificates.
    where = "examples/security"
    security = render(kubectl, os.path.join(deploy, "k8s/examples/security"))
    security = [d for d in security if d]
    if security:
        check_pool(where, security, dockers["cpu"], flags, metric_types, False, queue_metric,
                   tls=True)
        folders = check_security(where, security, {"tls": TLS_SECRET, "tokens": TOKENS_SECRET},
                                 mtls=True)
        services = by_kind(security, "Service")
        if check(len(services) == 1, f"{where}: one Service"):
            check_certificates(where, security, TLS_SECRET, services[0]["metadata"]["name"],
                               "default", issuers_rendered=True)
        live_security(where, options.server_bin, security, folders)
    check_helm(os.path.join(deploy, "helm/centroidkv"), rendered, dockers, flags, metric_types,
               queue_metric, helm, options.server_bin, security or None)

    print(f"{passes} checks passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

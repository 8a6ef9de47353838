#!/usr/bin/env python3
"""The smoke test's containers (run by deploy/smoke.sh, which builds the image first): plays
the rendered sidecar and pool overlays with `podman kube play` and checks that they work.

sidecar: the server (the native sidecar) and a worker container share the socket volume
  and the tmpfs at /dev/shm as the manifest says; the manifest's startup probe runs until it
  passes, then the worker compresses the stories260K golden case through the unix socket,
  once over slabs and once by reference to a shared memory region in /dev/shm (`--shm`),
  and both results must equal ../shared/golden bit for bit; the liveness probe runs once;
  /metrics is scraped from the pod and counts both jobs; the server runs as uid 10001;
  `podman pod stop` drains it (exit 0).
pool: three pods from the pool Deployment's template; a ReplicaPool client
  (centroidkv-bench with the replica list) runs jobs while one server is killed
  (`podman kill`) and another stopped (`podman stop`, a drain): every job must come back
  exactly once and OK; then a client container compresses the golden case through the
  same list (two replicas gone) bit for bit; /metrics and the uid are checked as above.
Everything it made (pods, containers, volumes) is removed on the way out, failure or not;
pods a killed earlier run left behind are removed at the start.
"""
import argparse
import atexit
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifests  # noqa: E402

GOLDEN_OUTPUTS = ("out_keys", "out_values", "out_counts", "out_offsets", "assignment")


class SmokeFailure(Exception):
    pass


def log(message):
    print(f"[smoke {time.strftime('%H:%M:%S')}] {message}", flush=True)


def podman(*args, check=True, timeout=120, quiet=False):
    out = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise SmokeFailure(f"podman {' '.join(args)}: exit {out.returncode}: "
                           f"{out.stderr.strip()[-2000:]}")
    if not quiet and out.stderr.strip() and out.returncode != 0:
        log(out.stderr.strip())
    return out


class Run:
    """Names everything this run makes after `self.id` and removes all of it at the end."""

    def __init__(self):
        self.id = f"ckvsmoke-{os.getpid()}-{int(time.time()) % 100000}"
        self.pods = []
        self.volumes = []
        self.tmp = tempfile.mkdtemp(prefix=self.id + "-")
        self.shm = None  # the sidecar's tmpfs stand-in (manifests.sidecar_pod says why)

    def cleanup(self):
        for pod in self.pods:
            podman("pod", "rm", "--force", "--time", "2", pod, check=False, quiet=True)
        for volume in self.volumes:
            podman("volume", "rm", "--force", volume, check=False, quiet=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.shm is not None:
            shutil.rmtree(self.shm, ignore_errors=True)
        left = podman("ps", "--all", "--filter", f"name=^{self.id}", "--format", "{{.Names}}",
                      check=False).stdout.split()
        left += podman("pod", "ps", "--filter", f"name=^{self.id}", "--format", "{{.Name}}",
                       check=False).stdout.split()
        left += [v for v in self.volumes
                 if podman("volume", "exists", v, check=False).returncode == 0]
        self.pods, self.volumes = [], []
        return left


def reap_stale_runs():
    """Removes pods of earlier runs whose process is gone (a run killed with SIGKILL)."""
    out = podman("pod", "ps", "--format", "{{.Name}} {{.Labels}}", check=False).stdout
    for line in out.splitlines():
        match = re.match(r"(ckvsmoke-(\d+)-\d+-\S+)", line)
        if match and not os.path.exists(f"/proc/{match.group(2)}"):
            log(f"removing a stale pod of a killed run: {match.group(1)}")
            podman("pod", "rm", "--force", "--time", "2", match.group(1), check=False)
    for path in glob.glob("/dev/shm/ckvsmoke-*"):
        match = re.match(r"/dev/shm/ckvsmoke-(\d+)-", path)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            shutil.rmtree(path, ignore_errors=True)
    for volume in podman("volume", "ls", "--format", "{{.Name}}", check=False).stdout.split():
        match = re.match(r"ckvsmoke-(\d+)-", volume)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            podman("volume", "rm", "--force", volume, check=False)


def render(kubectl, overlay):
    out = subprocess.run([kubectl, "kustomize", overlay], capture_output=True, text=True)
    if out.returncode != 0:
        raise SmokeFailure(f"kubectl kustomize {overlay}: {out.stderr.strip()}")
    return manifests.load_all(out.stdout)


def play(run, docs, name, start=True):
    path = os.path.join(run.tmp, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(manifests.dump(docs))
    for doc in docs:
        run.pods.append(doc["metadata"]["name"])
        run.volumes += manifests.volume_names(doc)
    out = podman("kube", "play", f"--start={str(start).lower()}", path, check=False)
    if out.returncode != 0:
        raise SmokeFailure(f"podman kube play {name}: {out.stderr.strip()}")
    for line in out.stderr.strip().splitlines():
        log(f"kube play {name}: {line}")


def ctr(pod, container):
    return f"{pod}-{container}"  # podman kube play's container names


def pod_network(pod):
    """(network name, IP address) of a pod's infra container."""
    infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", pod).stdout.strip()
    nets = json.loads(podman("inspect", "--format", "{{json .NetworkSettings.Networks}}",
                             infra).stdout)
    for name, net in nets.items():
        if net.get("IPAddress"):
            return name, net["IPAddress"]
    raise SmokeFailure(f"pod {pod} has no IP address ({nets})")


def pod_ip(pod):
    return pod_network(pod)[1]


def state(container):
    return json.loads(podman("inspect", "--format", "{{json .State}}", container).stdout)


def container_log(container, lines=30):
    out = podman("logs", "--tail", str(lines), container, check=False)
    return (out.stdout + out.stderr).strip()


def run_exec_probe(container, probe, what):
    """Runs an exec probe as the kubelet would: every periodSeconds until it passes, at most
    failureThreshold times. Returns the attempts it took."""
    command = probe["exec"]["command"]
    period = probe.get("periodSeconds", 10)
    threshold = probe.get("failureThreshold", 3)
    timeout = probe.get("timeoutSeconds", 1)
    last = ""
    for attempt in range(1, threshold + 1):
        tick = time.time() + period  # the kubelet probes every period, or at once if late
        try:
            out = podman("exec", container, *command, check=False, timeout=timeout + 5)
            if out.returncode == 0:
                return attempt
            last = (out.stdout + out.stderr).strip()
        except subprocess.TimeoutExpired:
            last = "timed out"
        if not state(container).get("Running"):
            break
        time.sleep(max(0.0, tick - time.time()))
    raise SmokeFailure(f"{what} of {container} failed {threshold} times ({command}): {last}\n"
                       f"server log:\n{container_log(container)}")


def check_uid(container, uid=10001):
    status = podman("exec", container, "cat", "/proc/1/status").stdout
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
    if not uids or {int(uids.group(1)), int(uids.group(2))} != {uid}:
        raise SmokeFailure(f"{container}: the server runs as uid {uids and uids.groups()}, "
                           f"not {uid}")
    log(f"{container}: server process uid {uid} (non-root)")


def scrape(ip, port, metric):
    """The sum of `metric`'s samples on http://ip:port/metrics."""
    with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    if not re.search(rf"^# TYPE {metric} ", text, re.M):
        raise SmokeFailure(f"http://{ip}:{port}/metrics has no {metric}")
    # A labelled counter has no samples before its first event.
    return sum(float(v) for v in re.findall(rf"^{metric}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def compare_golden(out_dir, golden):
    for name in GOLDEN_OUTPUTS:
        got = np.load(os.path.join(out_dir, f"{name}.npy"))
        want = np.load(os.path.join(golden, f"{name}.npy"))
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            raise SmokeFailure(f"{name}.npy differs from the golden case "
                               f"({got.dtype}{got.shape} vs {want.dtype}{want.shape})")


def compress_args(golden):
    config = json.load(open(os.path.join(golden, "case.json")))["config"]
    return [f"--target-ratio={config['target_ratio']}", f"--chunk-size={config['chunk_size']}",
            f"--sink-tokens={config['sink_tokens']}",
            f"--recent-tokens={config['recent_tokens']}", "--quiet"]


def out_dir(run, name):
    path = os.path.join(run.tmp, name)
    os.mkdir(path)
    os.chmod(path, 0o777)  # the worker runs as uid 10001
    return path


# ---------------------------------------------------------------------------------------

def smoke_sidecar(run, options):
    docs = render(options.kubectl, os.path.join(options.k8s, "overlays/sidecar"))
    out = out_dir(run, "sidecar-out")
    for leg in ("slabs", "shm"):
        os.mkdir(os.path.join(out, leg))
        os.chmod(os.path.join(out, leg), 0o777)  # the worker runs as uid 10001
    run.shm = tempfile.mkdtemp(prefix=run.id + "-shm-", dir="/dev/shm")
    os.chmod(run.shm, 0o1777)  # as Kubernetes makes the emptyDir: any uid may create files
    info = manifests.sidecar_pod(docs, run.id, options.image, options.smoke_image,
                                 options.golden, out, compress_args(options.golden), run.shm)
    pod = info["pod"]["metadata"]["name"]
    server, worker = ctr(pod, info["server"]), ctr(pod, info["worker"])
    log(f"sidecar: playing pod {pod} (server socket {info['socket']})")
    play(run, [info["pod"]], "sidecar", start=False)
    health = json.loads(podman("inspect", "--format", "{{json .Config.Healthcheck}}",
                               server).stdout)
    log(f"sidecar: podman's healthcheck from the manifest's probes: {health}")
    podman("start", server)
    attempts = run_exec_probe(server, info["startup_probe"], "startup probe")
    log(f"sidecar: startup probe passed (attempt {attempts}); starting the worker")
    podman("start", worker)
    code = podman("wait", worker, timeout=180).stdout.strip()
    if code != "0":
        raise SmokeFailure(f"sidecar: the worker exited {code}:\n{container_log(worker)}\n"
                           f"server log:\n{container_log(server)}")
    compare_golden(os.path.join(out, "slabs"), options.golden)
    compare_golden(os.path.join(out, "shm"), options.golden)
    log("sidecar: the worker's results through the unix socket, over slabs and by reference "
        "to shared memory in the pod's /dev/shm, equal the golden case bit for bit")
    run_exec_probe(server, info["liveness_probe"], "liveness probe")
    # podman turned the liveness probe into the container's healthcheck: run it as podman does.
    podman("healthcheck", "run", server)
    log("sidecar: liveness probe passed, run by the test and as podman's healthcheck")
    ip = pod_ip(pod)
    jobs = scrape(ip, info["metrics_port"], "centroidkv_jobs_total")
    if jobs < 2:
        raise SmokeFailure(f"sidecar: /metrics counts {jobs} jobs after the worker's two")
    log(f"sidecar: /metrics scraped from http://{ip}:{info['metrics_port']}: "
        f"centroidkv_jobs_total {jobs:g}")
    check_uid(server)
    podman("pod", "stop", "--time", "30", pod, timeout=60)
    exit_code = state(server).get("ExitCode")
    if exit_code != 0:
        raise SmokeFailure(f"sidecar: the server exited {exit_code} on stop, not 0 (drain):\n"
                           f"{container_log(server)}")
    log("sidecar: pod stop drained the server (exit 0)")


def wait_ready(cli, address, seconds=60):
    deadline = time.time() + seconds
    while True:
        out = subprocess.run([cli, "info", "--timeout", "2", "--server", address],
                             capture_output=True, text=True)
        if out.returncode == 0:
            return
        if time.time() > deadline:
            raise SmokeFailure(f"pool: {address} not ready after {seconds} s: "
                               f"{(out.stdout + out.stderr).strip()}")
        time.sleep(0.5)


def smoke_pool(run, options):
    docs = render(options.kubectl, os.path.join(options.k8s, "overlays/pool"))
    info = manifests.pool_pods(docs, run.id, options.image, options.smoke_image, 3)
    pods = [p["metadata"]["name"] for p in info["pods"]]
    servers = [ctr(p, info["server"]) for p in pods]
    log(f"pool: playing {', '.join(pods)} (gRPC port {info['grpc_port']}, "
        f"probes {sorted(info['probes'])})")
    play(run, info["pods"], "pool")
    ips = [pod_ip(p) for p in pods]
    replicas = [f"{ip}:{info['grpc_port']}" for ip in ips]
    cli = os.path.join(options.bin_dir, "centroidkv")
    for server, address in zip(servers, replicas):
        try:
            wait_ready(cli, address, seconds=30)
        except SmokeFailure as e:
            raise SmokeFailure(f"{e}\nserver log:\n{container_log(server)}")
    for server in servers:
        check_uid(server)
    log(f"pool: replicas {','.join(replicas)} ready")

    jobs = options.pool_jobs
    bench = subprocess.Popen(
        [os.path.join(options.bin_dir, "centroidkv-bench"), "--server", ",".join(replicas),
         "--jobs", str(jobs), "--rate", str(options.pool_rate), "--concurrency", "3",
         # 4k context: a job holds its replica long enough (tens of ms) for the 0.1 s
         # /metrics polls below to catch one in flight; at 1k, jobs of ~6 ms were missed.
         "--context", "4096", "--preset", "llama3-8b", "--format", "json", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = info["metrics_port"]
    killed_jobs = 0.0  # jobs the killed replica had received: its /metrics is gone

    def done_jobs():
        total = killed_jobs
        for server, ip in zip(servers, ips):
            if state(server).get("Running"):
                total += scrape(ip, metrics, "centroidkv_jobs_total")
        return total

    def wait_for(what, condition, seconds=90, poll=0.1):
        deadline = time.time() + seconds
        while not condition():
            if bench.poll() is not None:
                out, err = bench.communicate()
                raise SmokeFailure(f"pool: the client ended (exit {bench.returncode}) before "
                                   f"{what}: {out.strip()} {err.strip()}")
            if time.time() > deadline:
                raise SmokeFailure(f"pool: the client stalled {seconds} s before {what}")
            time.sleep(poll)

    def in_flight(i):
        return scrape(ips[i], metrics, "centroidkv_jobs_in_flight") > 0

    try:
        # Each replica is hit while it holds jobs, so that they must be resent (kill) or
        # finished or handed back (drain), with the client still sending.
        wait_for(f"{jobs // 5} jobs", lambda: done_jobs() >= jobs // 5)
        # A job is in a replica's pool for tens of ms of every 200 (rate 10 over two or
        # three replicas): poll one gauge every 10 ms so the window is not missed.
        wait_for("a job in flight on replica 0", lambda: in_flight(0), poll=0.01)
        killed_jobs = scrape(ips[0], metrics, "centroidkv_jobs_total")
        podman("kill", servers[0])
        log(f"pool: killed {servers[0]} with jobs in flight, after {killed_jobs:g} jobs")
        wait_for(f"{jobs // 2} jobs", lambda: done_jobs() >= jobs // 2)
        wait_for("a job in flight on replica 1", lambda: in_flight(1), poll=0.01)
        stopper = threading.Thread(target=lambda: podman("stop", "--time", "30", servers[1],
                                                         timeout=60))
        stopper.start()
        log(f"pool: stopping (draining) {servers[1]} with jobs in flight, after "
            f"{done_jobs():g} of {jobs} jobs")
        stdout, stderr = bench.communicate(timeout=300)
        stopper.join()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    if bench.returncode != 0:
        raise SmokeFailure(f"pool: the client exited {bench.returncode}: {stderr.strip()}")
    result = json.loads(stdout)
    log(f"pool: client result {stdout.strip()}")
    if result["jobs"] != jobs or result["jobs_failed"] != 0 or result["errors"]:
        raise SmokeFailure(f"pool: {jobs} jobs sent, {result['jobs']} OK and "
                           f"{result['jobs_failed']} failed ({result['errors']})")
    codes = [state(s).get("ExitCode") for s in servers[:2]]
    if codes[0] != 137 or codes[1] != 0:
        raise SmokeFailure(f"pool: exit codes {codes}: want 137 (killed) and 0 (drained)")
    log(f"pool: all {jobs} jobs came back exactly once and OK; killed replica exited 137, "
        "stopped replica drained and exited 0")

    # The golden case through the same replica list (two gone), from a client container.
    out = out_dir(run, "pool-out")
    client = f"{run.id}-pool-client"
    code = subprocess.run(
        ["podman", "run", "--rm", "--name", client, "--label", f"{manifests.RUN_LABEL}={run.id}",
         "--network", pod_network(pods[2])[0], "-v", f"{options.golden}:/smoke/in:ro", "-v", f"{out}:/smoke/out",
         "--entrypoint", "/usr/local/bin/centroidkv", options.smoke_image, "compress",
         "--server", ",".join(replicas), *compress_args(options.golden),
         "--in", "/smoke/in", "--out", "/smoke/out"], capture_output=True, text=True, timeout=120)
    if code.returncode != 0:
        raise SmokeFailure(f"pool: the client container failed: {code.stderr.strip()}")
    compare_golden(out, options.golden)
    survivor = scrape(ips[2], metrics, "centroidkv_jobs_total")
    log(f"pool: a client container compressed the golden case through {','.join(replicas)} "
        f"bit for bit; /metrics of {servers[2]}: centroidkv_jobs_total {survivor:g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s", required=True, help="the deploy/k8s folder to play")
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--bin-dir", required=True, help="centroidkv and centroidkv-bench")
    parser.add_argument("--golden", required=True, help="../shared/golden/stories260K_layer2")
    parser.add_argument("--image", default="centroidkv:cpu", help="the manifests' image")
    parser.add_argument("--smoke-image", required=True, help="the image to run instead")
    parser.add_argument("--only", choices=("sidecar", "pool"))
    parser.add_argument("--pool-jobs", type=int, default=150)
    parser.add_argument("--pool-rate", type=float, default=10.0)
    options = parser.parse_args()
    options.golden = os.path.abspath(options.golden)

    reap_stale_runs()
    run = Run()
    atexit.register(run.cleanup)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(128 + 15))
    try:
        if options.only in (None, "sidecar"):
            smoke_sidecar(run, options)
        if options.only in (None, "pool"):
            smoke_pool(run, options)
    except (SmokeFailure, subprocess.TimeoutExpired) as e:
        print(f"SMOKE FAILED: {e}", flush=True)
        return 1
    finally:
        left = run.cleanup()
        if left:
            print(f"SMOKE FAILED: left behind after cleanup: {left}", flush=True)
    if left:
        return 1
    log(f"PASSED; removed every pod, container and volume of {run.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

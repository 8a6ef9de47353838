#!/usr/bin/env python3
"""deploy/smoke.sh must fail, for the right reason, when a manifest is broken: each case
copies deploy/k8s, breaks one thing in the copy's kustomize base, runs the smoke test on it
and expects exit 1 with a message naming the symptom. Run by ctest (ckv_deploy_smoke_faults).

The cases run at once (each smoke run names its pods apart); the longest, socket-listen,
waits out the manifest's startup probe (30 tries), 1.5-2.5 minutes here.
Cases:
  socket-listen the sidecar server listens on another socket than the one the probes and
                the worker dial: its startup probe never passes;
  socket-env    the worker dials another socket than the server's: its job fails;
  port          the pool server listens on another port than its containerPort: the
                client's replicas never answer;
  volume-mount  the worker does not mount the socket volume: it cannot reach the server;
  volume        the pod lacks the volume the containers mount: podman refuses the pod.
"""
import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

SIDECAR = "base/sidecar/worker-deployment.yaml"
POOL = "base/pool/deployment.yaml"


def spec_of(docs):
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def replace_arg(container, prefix, value):
    args = container["args"]
    hits = [i for i, a in enumerate(args) if a.startswith(prefix)]
    assert len(hits) == 1, f"no single {prefix} arg in {container['name']}: {args}"
    args[hits[0]] = value


def wrong_socket(spec):
    replace_arg(spec["initContainers"][0], "--listen=",
                "--listen=unix:///var/run/centroidkv/elsewhere.sock")


def wrong_worker_socket(spec):
    env = [e for e in spec["containers"][0]["env"] if e["name"] == "CENTROIDKV_SERVER"]
    assert len(env) == 1, "the worker has no CENTROIDKV_SERVER"
    env[0]["value"] = "unix:///var/run/centroidkv/elsewhere.sock"


def wrong_port(spec):
    replace_arg(spec["containers"][0], "--listen=", "--listen=0.0.0.0:50052")


def no_worker_mount(spec):
    worker = spec["containers"][0]
    before = len(worker["volumeMounts"])
    worker["volumeMounts"] = [m for m in worker["volumeMounts"] if m["name"] != "centroidkv-socket"]
    assert len(worker["volumeMounts"]) == before - 1, "the worker mounts no centroidkv-socket"


def no_volume(spec):
    before = len(spec["volumes"])
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "centroidkv-socket"]
    assert len(spec["volumes"]) == before - 1, "the pod has no centroidkv-socket volume"


# name, file, mutation, --only, text the failure must contain
CASES = [
    ("socket-listen", SIDECAR, wrong_socket, "sidecar", "startup probe of"),
    ("socket-env", SIDECAR, wrong_worker_socket, "sidecar", "the worker exited"),
    ("port", POOL, wrong_port, "pool", "not ready after"),
    ("volume-mount", SIDECAR, no_worker_mount, "sidecar", "the worker exited"),
    ("volume", SIDECAR, no_volume, "sidecar", "podman kube play sidecar"),
]


def run_case(options, name, path, mutate, only, expect):
    with tempfile.TemporaryDirectory(prefix=f"ckv-smoke-fault-{name}-") as tmp:
        k8s = os.path.join(tmp, "k8s")
        shutil.copytree(os.path.join(options.repo, "deploy/k8s"), k8s)
        target = os.path.join(k8s, path)
        docs = list(yaml.safe_load_all(open(target)))
        mutate(spec_of(docs))
        with open(target, "w") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)
        start = time.time()
        out = subprocess.run(
            ["bash", os.path.join(options.repo, "deploy/smoke.sh"), "--k8s", k8s, "--only", only,
             "--bin-dir", options.bin_dir, "--golden", options.golden],
            capture_output=True, text=True, timeout=400)
        text = out.stdout + out.stderr
        seconds = time.time() - start
    if out.returncode == 77:
        print(text)
        return None
    failure = [l for l in text.splitlines() if l.startswith("SMOKE FAILED")]
    ok = out.returncode == 1 and failure and expect in text
    print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {out.returncode} in {seconds:.0f} s: "
          f"{failure[0][:300] if failure else '(no SMOKE FAILED line)'}")
    if not ok:
        print(f"  expected exit 1 and {expect!r}; output:\n{text[-3000:]}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--golden", required=True)
    parser.add_argument("--case", action="append", help="run only these cases")
    options = parser.parse_args()
    cases = [case for case in CASES if not options.case or case[0] in options.case]
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda case: run_case(options, *case), cases))
    if None in results:
        return 77  # containers cannot run here; smoke.sh said why
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

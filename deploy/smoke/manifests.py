"""Turns the rendered kustomize overlays into what `podman kube play` runs in the smoke test
(deploy/smoke.sh), changing only what a single machine without a cluster needs, and reads
back from them what the smoke test must obey (socket, ports, the probe commands).

What changes, and why:
- A Deployment becomes Pods named RUN-NAME[-i] from its pod template (podman 4.3 plays one
  replica of a Deployment; the pool needs three, each with its own name and address).
- podman 4.3 has no native sidecars: an init container with `restartPolicy: Always` would
  be run to completion before the worker starts. It moves to the front of `containers`
  (podman starts containers in order), without the field. Its startup probe is run by the
  smoke test itself before the worker starts, as the kubelet would.
- The pods restart Never, so the worker runs its job once and the test reads its exit code.
- Images named like the Dockerfile's image (centroidkv:cpu) become the smoke image, and the
  example worker (a placeholder image) becomes that image running the `centroidkv` CLI,
  which compresses a golden case from a read-only hostPath to a writable one. The worker
  keeps its env, volumes and mounts from the manifest, and dials $CENTROIDKV_SERVER.
- Pod volumes are renamed RUN-NAME: podman 4.3 makes an emptyDir a named volume of the
  same name, shared by every pod that names it (in Kubernetes each pod has its own).
- containerPorts are read (the test dials them on the pod's address), then dropped: podman
  4.3 publishes each on the host's port of the same number, which would put fixed ports on
  a shared host and make three replicas collide. In Kubernetes they are informational.
Everything else (args, volumes, securityContext, resources) is played as rendered.
"""
import copy

import yaml

RUN_LABEL = "io.centroidkv.smoke-run"


def load_all(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs, kind, name=None):
    for doc in docs:
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name):
            return doc
    raise ValueError(f"no {kind}{' ' + name if name else ''} in the rendered manifests")


def pod_from_template(deployment, name, run):
    """A Pod with the Deployment's pod template, named `name`, labelled with the run."""
    template = copy.deepcopy(deployment["spec"]["template"])
    metadata = template.get("metadata", {})
    labels = dict(metadata.get("labels", {}))
    labels[RUN_LABEL] = run
    spec = template["spec"]
    spec["restartPolicy"] = "Never"
    renamed = {}
    for volume in spec.get("volumes", []):
        renamed[volume["name"]] = volume["name"] = f"{name}-{volume['name']}"
    for c in spec.get("initContainers", []) + spec["containers"]:
        for mount in c.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels,
                         "annotations": dict(metadata.get("annotations", {}))},
            "spec": spec}


def hoist_native_sidecars(spec):
    """Moves `restartPolicy: Always` init containers to the front of `containers`."""
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    rest = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") != "Always"]
    for c in sidecars:
        del c["restartPolicy"]
    if rest:
        spec["initContainers"] = rest
    else:
        spec.pop("initContainers", None)
    spec["containers"] = sidecars + spec["containers"]
    return [c["name"] for c in sidecars]


def retag(spec, image, smoke_image):
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c.get("image") == image:
            c["image"] = smoke_image


def take_ports(c):
    """The container's {port name: containerPort}, removed from it (see the file comment)."""
    return {p.get("name"): p["containerPort"] for p in c.pop("ports", [])}


def container(spec, name):
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["name"] == name:
            return c
    raise ValueError(f"no container {name}")


def flag(args, name):
    """The value of --name=VALUE in a container's args, or None."""
    for a in args or []:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def volume_names(pod):
    """The podman volumes playing `pod` makes (its emptyDirs)."""
    return [v["name"] for v in pod["spec"].get("volumes", []) if "emptyDir" in v]


def sidecar_pod(docs, run, image, smoke_image, golden_dir, out_dir, compress_args, shm_dir):
    """The sidecar overlay's worker Deployment as one Pod, plus what the test needs to know:
    {"pod", "server", "worker", "socket", "metrics_port", "startup_probe", "liveness_probe"}.

    The shared memory emptyDir (`medium: Memory`) becomes a hostPath to `shm_dir`, a 1777
    directory on the host's tmpfs: Kubernetes makes that emptyDir a tmpfs any container of
    the pod may write (0777, group fsGroup), but podman 4.3's `kube play` makes it a
    root-owned 0755 directory on disk, where the worker (uid 10001) gets EACCES."""
    deployment = find(docs, "Deployment")
    pod = pod_from_template(deployment, f"{run}-{deployment['metadata']['name']}", run)
    spec = pod["spec"]
    sidecars = hoist_native_sidecars(spec)
    if len(sidecars) != 1:
        raise ValueError(f"expected one native sidecar init container, got {sidecars}")
    server = container(spec, sidecars[0])
    workers = [c for c in spec["containers"] if c["name"] != server["name"]]
    if len(workers) != 1:
        raise ValueError("expected one worker container beside the sidecar")
    worker = workers[0]
    retag(spec, image, smoke_image)
    memory = [v for v in spec.get("volumes", [])
              if (v.get("emptyDir") or {}).get("medium") == "Memory"]
    if len(memory) != 1:
        raise ValueError(f"expected one shared memory emptyDir (medium: Memory), got {memory}")
    memory[0].pop("emptyDir")
    memory[0]["hostPath"] = {"path": shm_dir, "type": "Directory"}
    worker["image"] = smoke_image
    # The CLI, not the server, and $CENTROIDKV_SERVER from the manifest's env: once over
    # slabs, once by reference to a region in the pod's shared /dev/shm.
    compress = ('/usr/local/bin/centroidkv compress --server "$CENTROIDKV_SERVER" '
                + " ".join(compress_args) + " --in /smoke/in")
    worker["command"] = ["/bin/sh", "-c",
                         f"{compress} --out /smoke/out/slabs && "
                         f"exec {compress} --shm --out /smoke/out/shm"]
    worker.pop("args", None)
    spec.setdefault("volumes", []).extend([
        {"name": "smoke-in", "hostPath": {"path": golden_dir, "type": "Directory"}},
        {"name": "smoke-out", "hostPath": {"path": out_dir, "type": "Directory"}}])
    worker.setdefault("volumeMounts", []).extend([
        {"name": "smoke-in", "mountPath": "/smoke/in", "readOnly": True},
        {"name": "smoke-out", "mountPath": "/smoke/out"}])
    ports = take_ports(server)
    for c in spec["containers"]:
        take_ports(c)
    return {"pod": pod, "server": server["name"], "worker": worker["name"],
            "socket": flag(server.get("args"), "listen"),
            "metrics_port": ports.get("metrics"),
            "startup_probe": server.get("startupProbe"),
            "liveness_probe": server.get("livenessProbe")}


def pool_pods(docs, run, image, smoke_image, replicas):
    """`replicas` Pods from the pool overlay's Deployment, and what the test needs to know:
    {"pods", "server", "grpc_port", "metrics_port", "probes"}."""
    deployment = find(docs, "Deployment")
    name = deployment["metadata"]["name"]
    pods = []
    for i in range(replicas):
        pod = pod_from_template(deployment, f"{run}-{name}-{i}", run)
        retag(pod["spec"], image, smoke_image)
        pods.append(pod)
    server = copy.deepcopy(pods[0]["spec"]["containers"][0])
    ports = take_ports(server)
    for pod in pods:
        for c in pod["spec"]["containers"]:
            take_ports(c)
    return {"pods": pods, "server": server["name"], "grpc_port": ports.get("grpc"),
            "metrics_port": ports.get("metrics"),
            "probes": {k: server[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")
                       if k in server}}


def dump(docs):
    return yaml.safe_dump_all(docs, sort_keys=False)

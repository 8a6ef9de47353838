#!/usr/bin/env bash
# Builds the CPU image from deploy/docker/Dockerfile.cpu with podman exactly as a user's CI
# would (the whole build stage: scripts/setup.sh and scripts/build.sh in a debian:12
# container, then the runtime stage), tags it centroidkv:cpu and centroidkv:cpu-COMMIT, and
# checks that its server answers `centroidkv info` and /metrics, runs as uid 10001, and
# drains and exits 0 on `podman stop`. Installs what it needs first (deploy/setup.sh) and
# makes the local debian base images when they are missing (deploy/base-image.sh).
# About 12-25 minutes on 2 cores (deploy/README.md has a measured run): a command, never a
# test. Usage: deploy/build-images.sh [cpu|cuda]
# cuda: Dockerfile.cuda starts from nvidia/cuda:13.0.0-*-ubuntu24.04, which no registry
# here can serve; the build runs only where those base images are in podman's storage.
set -euo pipefail
source "$(dirname "$0")/podman/env.sh"
repo=$(cd "$deploy_dir/.." && pwd)
variant=${1:-cpu}
case $variant in
  cpu) bases=("${CKV_BASE_IMAGES[@]}") ;;
  cuda) bases=(nvidia/cuda:13.0.0-devel-ubuntu24.04 nvidia/cuda:13.0.0-runtime-ubuntu24.04) ;;
  *) echo "usage: $0 [cpu|cuda]" >&2; exit 2 ;;
esac

bash "$deploy_dir/setup.sh"
if [ "$variant" = cpu ]; then bash "$deploy_dir/base-image.sh"; fi
for base in "${bases[@]}"; do
  if ! podman image exists "$base"; then
    echo "build-images: base image $base is not in podman's storage and no registry is" \
         "reachable from here: load it first (podman load -i ...)" >&2
    exit 1
  fi
done

commit=$(git -C "$repo" rev-parse --short=12 HEAD)
# The context is the working tree: say so when it is not the commit.
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then commit=$commit-dirty; fi
image=localhost/centroidkv:$variant
start=$(date +%s)
podman build --pull=never -f "$deploy_dir/docker/Dockerfile.$variant" \
  --build-arg CKV_GIT_COMMIT="$commit" -t "$image" -t "$image-$commit" "$repo"
seconds=$(( $(date +%s) - start ))
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "build-images: $image ($image-$commit) built in $((seconds / 60)) min $((seconds % 60)) s," \
     "$((size / 1000000)) MB"

# The image's server answers, exports metrics, is not root, and drains on stop.
name=ckv-build-check-$$
trap 'podman rm --force --time 2 "$name" > /dev/null 2>&1 || true' EXIT
podman run -d --name "$name" "$image" > /dev/null
for _ in $(seq 60); do
  if podman exec "$name" /usr/local/bin/centroidkv info --timeout 2 \
       --server 127.0.0.1:50051 > /tmp/"$name".info 2>&1; then break; fi
  sleep 1
done
cat /tmp/"$name".info && rm -f /tmp/"$name".info
ip=$(podman inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$name")
/usr/bin/python3 - "$ip" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}:9464/metrics", timeout=10).read().decode()
line = next(l for l in text.splitlines() if l.startswith("centroidkv_build_info"))
print(f"build-images: /metrics answers: {line}")
PY
uid=$(podman exec "$name" awk '/^Uid:/ {print $2}' /proc/1/status)
[ "$uid" = 10001 ] || { echo "build-images: the server runs as uid $uid, not 10001" >&2; exit 1; }
podman stop --time 30 "$name" > /dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { echo "build-images: the server exited $code on stop, not 0" >&2; exit 1; }
echo "build-images: $image answers info and /metrics, runs as uid $uid, drains and exits 0"

# Sourced by deploy/*.sh: the podman configuration and the tools deploy/setup.sh installs.
#   CKV_TOOLS_DIR  where kubectl and helm are (default /usr/local/lib/centroidkv/tools)
#   CKV_KUBECTL, CKV_HELM  the binaries themselves, if elsewhere
deploy_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CONTAINERS_CONF="$deploy_dir/podman/containers.conf"
CKV_TOOLS_DIR=${CKV_TOOLS_DIR:-/usr/local/lib/centroidkv/tools}
CKV_KUBECTL=${CKV_KUBECTL:-$CKV_TOOLS_DIR/kubectl}
CKV_HELM=${CKV_HELM:-$CKV_TOOLS_DIR/helm}
# The base images the Dockerfiles start from, made locally (deploy/base-image.sh).
CKV_BASE_IMAGES=(docker.io/library/debian:12 docker.io/library/debian:12-slim)

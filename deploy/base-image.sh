#!/usr/bin/env bash
# Makes the base images the Dockerfiles start from, debian:12 and debian:12-slim, in local
# podman storage when they are missing (no image registry is reachable here; Debian's
# mirror is). Both come from one `debootstrap --variant=minbase bookworm`, the variant
# Docker's official debian images are built from; -slim drops docs, man pages and locales
# and tells dpkg to keep them out, as Docker's slim variant does. They persist in podman's
# storage, so this runs once per machine (about 2-4 minutes, mostly downloads).
#   CKV_DEBIAN_MIRROR  (default http://deb.debian.org/debian)
set -euo pipefail
source "$(dirname "$0")/podman/env.sh"

# One maker at a time (the smoke tests may start together on a fresh machine).
exec 9> /var/tmp/centroidkv-base-image.lock
flock 9
missing=0
for image in "${CKV_BASE_IMAGES[@]}"; do
  podman image exists "$image" || missing=1
done
if [ $missing -eq 0 ]; then exit 0; fi

mirror=${CKV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/ckv-debootstrap.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap --variant=minbase bookworm ($mirror)"
start=$(date +%s)
debootstrap --variant=minbase bookworm "$root/fs" "$mirror" > "$root/log" 2>&1 \
  || { tail -20 "$root/log" >&2; exit 1; }
cat > "$root/fs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
SOURCES
rm -rf "$root/fs/var/cache/apt/archives/"*.deb "$root/fs/var/lib/apt/lists/"* \
       "$root/fs/var/log/"*.log "$root/fs/var/log/apt/"* "$root/fs/etc/hostname"
: > "$root/fs/etc/resolv.conf"
tar -C "$root/fs" --numeric-owner -c . | podman import --quiet \
  --change 'CMD ["bash"]' - docker.io/library/debian:12 > /dev/null

# -slim: what Docker's slim images leave out, and the dpkg rule that keeps it out.
cat > "$root/fs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
SLIM
find "$root/fs/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
find "$root/fs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root/fs/usr/share/man/"* "$root/fs/usr/share/info/"* "$root/fs/usr/share/locale/"*
tar -C "$root/fs" --numeric-owner -c . | podman import --quiet \
  --change 'CMD ["bash"]' - docker.io/library/debian:12-slim > /dev/null
echo "base-image: debian:12 and debian:12-slim made in $(( $(date +%s) - start )) s"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep 'library/debian:12'

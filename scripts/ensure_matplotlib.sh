#!/usr/bin/env bash
# Installs Debian's python3-matplotlib for the report plots when /usr/bin/python3 lacks it.
# Usage: scripts/ensure_matplotlib.sh CALLER (the name in the message)
set -euo pipefail
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null && exit 0
echo "${1:-plot}: installing python3-matplotlib for the plot" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  python3-matplotlib >&2

#!/usr/bin/env bash
# Installs Mesa lavapipe (software Vulkan) from bookworm-backports (Mesa 25: 5-8x faster compute
# than bookworm's Mesa 22.3), plus the Vulkan loader. Non-interactive; run as root (or via sudo).
# The backports mirror is the one already configured for the main archive (no host name here).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

main_sources=/etc/apt/sources.list.d/debian.sources
bp_sources=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -f "$bp_sources" ]; then
  uri=$(awk '/^URIs:/{print $2; exit}' "$main_sources")
  if [ -z "$uri" ]; then
    echo "install-lavapipe: no URIs: line in $main_sources" >&2
    exit 1
  fi
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" | $SUDO tee "$bp_sources" >/dev/null
fi
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends libvulkan1
$SUDO apt-get install -y -q --no-install-recommends -t bookworm-backports mesa-vulkan-drivers
dpkg-query -W -f='${Package} ${Version}\n' mesa-vulkan-drivers libvulkan1

#!/usr/bin/env bash
# Installs the current nats-server (Debian sid's package) into a folder of its own, beside the
# system's 2.9.10, which stays on the PATH: the shared server on 4222 runs that one.
# Prints the folder holding the binary. Usage: .ci/install-current-nats.sh [DIR]
set -euo pipefail
dir=${1:-/opt/nats-server-current}
if [ -x "$dir/usr/sbin/nats-server" ]; then
  echo "$dir/usr/sbin"
  exit 0
fi
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if [ ! -f /etc/apt/sources.list.d/toolmesh-sid.sources ]; then
  as_root tee /etc/apt/sources.list.d/toolmesh-sid.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  as_root tee /etc/apt/preferences.d/toolmesh-sid >/dev/null <<'PIN'
Package: *
Pin: release n=sid
Pin-Priority: 100
PIN
fi
as_root apt-get update -qq >&2
work=$(mktemp -d)
(cd "$work" && apt-get download nats-server/sid >&2)
as_root mkdir -p "$dir"
as_root dpkg -x "$work"/nats-server_*.deb "$dir"
rm -rf "$work"
"$dir/usr/sbin/nats-server" --version >&2
echo "$dir/usr/sbin"

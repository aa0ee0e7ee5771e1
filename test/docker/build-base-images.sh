#!/usr/bin/env bash
# Builds the two base images the Docker tests use where no image registry is reachable, from
# what this machine has installed, with `docker import` of a root filesystem tarball:
#
#   toolmesh-local/node:20   this machine's Node 20 + npm, a POSIX shell and a few coreutils,
#                            with their shared libraries; stands in for the public node:20 image
#                            as the Dockerfile's NODE_IMAGE. It trusts the certificate
#                            authorities this machine trusts (its CA bundle and
#                            NODE_EXTRA_CA_CERTS), so `npm ci` in a build reaches the registry
#                            through the same egress as the host.
#   toolmesh-local/nats:2.9  the Debian nats-server binary, libc and the loader, and wget for
#                            healthchecks; entrypoint `nats-server`, like the public `nats`
#                            image (whose -alpine variant has wget too).
#
# Usage: test/docker/build-base-images.sh   (idempotent; needs docker, node, nats-server, wget)
set -euo pipefail

NODE_TAG=${TOOLMESH_LOCAL_NODE_IMAGE:-toolmesh-local/node:20}
NATS_TAG=${TOOLMESH_LOCAL_NATS_IMAGE:-toolmesh-local/nats:2.9}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Copies each file (following symlinks) and the shared libraries it needs into root dir $1.
copy_with_libs() {
  local root=$1
  shift
  local file lib
  for file in "$@"; do
    mkdir -p "$root$(dirname "$file")"
    cp -L "$file" "$root$file"
    for lib in $(ldd "$file" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
}

skeleton() {
  local root=$1
  mkdir -p "$root"/{etc,tmp,root} "$root"/usr/{bin,lib}
  chmod 1777 "$root/tmp"
  # usrmerge layout, as in Debian 12
  ln -s usr/bin "$root/bin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
  mkdir -p "$root/usr/lib64"
  printf 'root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000:node:/home/node:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnode:x:1000:\n' >"$root/etc/group"
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
}

# --- Node ---------------------------------------------------------------------------------
node_root=$work/node
skeleton "$node_root"
tools=(node sh env cat cp ln ls mkdir rm chmod)
paths=()
for tool in "${tools[@]}"; do paths+=("$(readlink -f "$(command -v "$tool")")"); done
copy_with_libs "$node_root" "${paths[@]}"
for tool in "${tools[@]}"; do
  target=$(readlink -f "$(command -v "$tool")")
  [ "$target" = "/usr/bin/$tool" ] || ln -sf "$target" "$node_root/usr/bin/$tool"
done
npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
mkdir -p "$node_root/usr/lib/node_modules"
cp -a "$npm_dir" "$node_root/usr/lib/node_modules/npm"
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$node_root/usr/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$node_root/usr/bin/npx"
ca_bundle=${NODE_EXTRA_CA_CERTS:-/etc/ssl/certs/ca-certificates.crt}
ca_env=()
if [ -f "$ca_bundle" ]; then
  mkdir -p "$node_root/etc/ssl/certs"
  cp -L "$ca_bundle" "$node_root/etc/ssl/certs/ca-certificates.crt"
  ca_env=(--change 'ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt')
fi
tar -C "$node_root" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'ENV HOME=/root' \
  --change 'CMD ["node"]' \
  "${ca_env[@]}" \
  - "$NODE_TAG" >/dev/null
echo "built $NODE_TAG ($(docker run --rm "$NODE_TAG" node --version))"

# --- NATS ---------------------------------------------------------------------------------
nats_root=$work/nats
skeleton "$nats_root"
nats_bin=$(readlink -f "$(command -v nats-server)")
wget_bin=$(readlink -f "$(command -v wget)")
copy_with_libs "$nats_root" "$nats_bin" "$wget_bin"
[ "$nats_bin" = /usr/bin/nats-server ] || ln -s "$nats_bin" "$nats_root/usr/bin/nats-server"
tar -C "$nats_root" -c . | docker import \
  --change 'ENTRYPOINT ["nats-server"]' \
  --change 'ENV PATH=/usr/sbin:/usr/bin' \
  --change 'EXPOSE 4222 6222 8222' \
  - "$NATS_TAG" >/dev/null
echo "built $NATS_TAG ($(docker run --rm "$NATS_TAG" --version))"

#!/usr/bin/env bash
# Builds the two base images the Docker tests use where no image registry is reachable, from
# what this machine has installed, with `docker import` of a root filesystem tarball:
#
#   toolmesh-local/node:<major>  this machine's Node + npm (tagged with its major version, 20 on
#                            CI's Node 20.20), a POSIX shell and a few coreutils, with their
#                            shared libraries; stands in for the public node image as the
#                            Dockerfile's NODE_IMAGE (whose default is node:24-bookworm-slim: the
#                            build works on any Node the root package.json's engines accept). It trusts the certificate
#                            authorities this machine trusts (its CA bundle and
#                            NODE_EXTRA_CA_CERTS), so `npm ci` in a build reaches the registry
#                            through the same egress as the host.
#   toolmesh-local/nats:<major.minor>  the nats-server binary on the PATH (Debian's 2.9.10), libc
#                            and the loader, and wget for healthchecks; entrypoint `nats-server`,
#                            like the public `nats` image (whose -alpine variant has wget too).
#                            With the current server installed (.ci/install-current-nats.sh, at
#                            TOOLMESH_CURRENT_NATS_DIR, default /opt/nats-server-current/usr/sbin)
#                            its image is built too (toolmesh-local/nats:2.15): the version the
#                            compose file and the README's NATS chart run.
#
# Usage: test/docker/build-base-images.sh   (idempotent; needs docker, node, nats-server, wget)
set -euo pipefail

node_major=$(node -p 'process.versions.node.split(".")[0]')
NODE_TAG=${TOOLMESH_LOCAL_NODE_IMAGE:-toolmesh-local/node:$node_major}
# major.minor of a nats-server binary, for its image's tag
nats_minor() { "$1" --version | grep -o 'v[0-9]*\.[0-9]*' | head -1 | tr -d v; }
NATS_TAG=${TOOLMESH_LOCAL_NATS_IMAGE:-toolmesh-local/nats:$(nats_minor "$(command -v nats-server)")}
current_dir=${TOOLMESH_CURRENT_NATS_DIR:-/opt/nats-server-current/usr/sbin}

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
# nats_image BINARY TAG: an image whose entrypoint is that nats-server binary.
nats_image() {
  local nats_root=$work/nats-$RANDOM nats_bin wget_bin
  skeleton "$nats_root"
  nats_bin=$(readlink -f "$1")
  wget_bin=$(readlink -f "$(command -v wget)")
  copy_with_libs "$nats_root" "$nats_bin" "$wget_bin"
  [ "$nats_bin" = /usr/bin/nats-server ] || ln -s "$nats_bin" "$nats_root/usr/bin/nats-server"
  tar -C "$nats_root" -c . | docker import \
    --change 'ENTRYPOINT ["nats-server"]' \
    --change 'ENV PATH=/usr/sbin:/usr/bin' \
    --change 'EXPOSE 4222 6222 8222' \
    - "$2" >/dev/null
  echo "built $2 ($(docker run --rm "$2" --version))"
}
nats_image "$(command -v nats-server)" "$NATS_TAG"
if [ -x "$current_dir/nats-server" ]; then
  nats_image "$current_dir/nats-server" "toolmesh-local/nats:$(nats_minor "$current_dir/nats-server")"
fi

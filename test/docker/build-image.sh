#!/usr/bin/env bash
# Builds the project's image as the Docker tests use it, from deploy/Dockerfile: its build stage
# as ${TOOLMESH_TEST_IMAGE}-build (the compose stack's MCP example server runs from it), then the
# image as ${TOOLMESH_TEST_IMAGE} (default toolmesh:test), with NODE_IMAGE from
# TOOLMESH_TEST_NODE_IMAGE when set. The tests run it in their setup; CI runs it earlier, beside
# other tests, so that theirs finds every layer cached.
#
# Usage: test/docker/build-image.sh   (from anywhere; needs docker)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

image=${TOOLMESH_TEST_IMAGE:-toolmesh:test}
build_args=()
if [ -n "${TOOLMESH_TEST_NODE_IMAGE:-}" ]; then
  build_args=(--build-arg "NODE_IMAGE=$TOOLMESH_TEST_NODE_IMAGE")
fi
docker build -f deploy/Dockerfile "${build_args[@]}" --target build -t "$image-build" .
docker build -f deploy/Dockerfile "${build_args[@]}" -t "$image" .

#!/bin/sh
# One image per architecture (deploy/image/build.sh) and a manifest list
# naming them all, so that a node pulls the image of its own architecture.
#
#   deploy/image/manifest.sh <name> <staging-dir> <arch>=<dist-dir>...
#
# e.g. `x86_64=target/dist aarch64=target/dist-aarch64` (what
# `cargo xtask image --arch x86_64 --arch aarch64` passes). The images are
# <name>-<amd64|arm64>, the list is <name>; push it with
# `buildah manifest push --all <name> docker://<registry>/<name>`.
set -eu
name=$1
stage=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)

# A list, or a single-architecture image, left by an earlier build.
buildah manifest rm "$name" >/dev/null 2>&1 || buildah rmi "$name" >/dev/null 2>&1 || true
buildah manifest create "$name" >/dev/null
for pair in "$@"; do
    arch=${pair%%=*}
    dist=${pair#*=}
    case $arch in
        x86_64) oci=amd64 ;;
        aarch64) oci=arm64 ;;
        *) echo "unsupported architecture $arch (x86_64 or aarch64)" >&2; exit 1 ;;
    esac
    sh "$here/build.sh" "$dist" "$name-$oci" "$stage/$arch" "$arch"
    buildah manifest add "$name" "containers-storage:$name-$oci" >/dev/null
done
echo "manifest list $name: $*"

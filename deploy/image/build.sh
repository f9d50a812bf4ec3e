#!/bin/sh
# Builds the vgpu image from scratch: the release binaries of <dist> (what
# `cargo xtask build` leaves in target/dist) and the shared libraries they
# load, found with ldd on the build machine, so the image is of the build
# machine's architecture. No base image and no registry: buildah, as root.
#
#   deploy/image/build.sh <dist-dir> <image-name> [<staging-dir>]
#
# `cargo xtask image` runs it. Layout: /usr/local/bin/vgpu, /opt/vgpu/libvgpu.so
# (what the install-hook containers copy to the node), the completions and
# man pages under /usr/local/share (from <dist>/share), the loader's
# libraries under their usual paths, an empty /etc and /tmp.
set -eu
dist=$1
name=$2
stage=${3:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)

rm -rf "$stage/rootfs"
root=$stage/rootfs
mkdir -p "$root/usr/local/bin" "$root/opt/vgpu" "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"
cp "$dist/vgpu" "$root/usr/local/bin/vgpu"
cp "$dist/libvgpu.so" "$root/opt/vgpu/libvgpu.so"
# `cargo xtask build` writes them; an image without them is a broken build.
[ -d "$dist/share/man/man1" ] || { echo "$dist/share is missing: run cargo xtask build" >&2; exit 1; }
mkdir -p "$root/usr/local/share"
cp -R "$dist/share/." "$root/usr/local/share/"

# Every library the loader needs, and the dynamic loader itself, at the
# paths the binary names them by (ldd prints "name => path (addr)" or,
# for the loader, "path (addr)").
ldd "$dist/vgpu" | awk '/=>/ { print $3; next } /^[[:space:]]*\// { print $1 }' |
while read -r lib; do
    [ -e "$lib" ] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done

cp "$here/Containerfile" "$stage/Containerfile"
buildah build --quiet --layers=false -f "$stage/Containerfile" -t "$name" "$stage" >/dev/null
echo "built $name from $stage/rootfs"

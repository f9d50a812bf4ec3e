#!/bin/sh
# Builds the vgpu image from scratch: the release binaries of <dist> (what
# `cargo xtask build` leaves in target/dist, or target/dist-aarch64 with
# `--arch aarch64`) and the shared libraries they load. No base image and
# no registry: buildah, as root.
#
#   deploy/image/build.sh <dist-dir> <image-name> [<staging-dir>] [<arch>]
#
# <arch> (x86_64 or aarch64) is the architecture of <dist>, by default the
# build machine's. For the build machine's own, the libraries are found
# with ldd; for the other one, they are the binary's needed libraries and
# dynamic loader (readelf) taken from Debian's cross C library
# /usr/<arch>-linux-gnu (libc6-arm64-cross), and the image is labelled with
# that architecture (nothing runs during the build, so no emulation).
#
# `cargo xtask image` runs it. Layout: /usr/local/bin/vgpu, /opt/vgpu/libvgpu.so
# (what the install-hook containers copy to the node), the completions and
# man pages under /usr/local/share (from <dist>/share), the loader's
# libraries under their usual paths, an empty /etc and /tmp.
set -eu
dist=$1
name=$2
stage=${3:-$(mktemp -d)}
arch=${4:-$(uname -m)}
here=$(cd "$(dirname "$0")" && pwd)
case $arch in
    x86_64) oci=amd64 ;;
    aarch64) oci=arm64 ;;
    *) echo "unsupported architecture $arch (x86_64 or aarch64)" >&2; exit 1 ;;
esac

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

if [ "$arch" = "$(uname -m)" ]; then
    # Every library the loader needs, and the dynamic loader itself, at the
    # paths the binary names them by (ldd prints "name => path (addr)" or,
    # for the loader, "path (addr)").
    ldd "$dist/vgpu" | awk '/=>/ { print $3; next } /^[[:space:]]*\// { print $1 }' |
    while read -r lib; do
        [ -e "$lib" ] || continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
else
    # The dynamic loader at the path the binary names, the libraries in the
    # architecture's multiarch directory, where that loader looks first.
    sysroot=/usr/$arch-linux-gnu
    [ -d "$sysroot/lib" ] || { echo "$sysroot is missing: cargo xtask setup installs it" >&2; exit 1; }
    interp=$(readelf -l "$dist/vgpu" | sed -n 's/.*program interpreter: \(.*\)]$/\1/p')
    [ -n "$interp" ] || { echo "$dist/vgpu names no program interpreter" >&2; exit 1; }
    mkdir -p "$root$(dirname "$interp")" "$root/lib/$arch-linux-gnu"
    cp -L "$sysroot/lib/$(basename "$interp")" "$root$interp"
    readelf -d "$dist/vgpu" | sed -n 's/.*Shared library: \[\(.*\)\]$/\1/p' |
    while read -r lib; do
        cp -L "$sysroot/lib/$lib" "$root/lib/$arch-linux-gnu/$lib"
    done
fi

cp "$here/Containerfile" "$stage/Containerfile"
buildah build --quiet --layers=false --arch "$oci" -f "$stage/Containerfile" -t "$name" "$stage" >/dev/null
echo "built $name ($oci) from $stage/rootfs"

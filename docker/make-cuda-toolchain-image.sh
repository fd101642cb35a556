#!/bin/sh
# Make the CUDA 12 compiler image that builds Transformer Engine's PyTorch extension:
# mmdebstrap a Debian trixie root with the non-free nvidia-cuda-toolkit (CUDA 12.4.131) and
# `docker import` it as rlk-kit/cuda-toolchain:trixie-12.4.
#
# Why trixie: torch's extension builder refuses an nvcc whose CUDA major differs from torch's
# (cu128 -> 12). The index's nvidia-cuda-nvcc-cu12 wheels carry ptxas but no nvcc, the CUDA 13
# wheels carry the wrong major, bookworm's toolkit is 11.8; trixie's non-free 12.4.131 is the
# one CUDA 12 nvcc a Debian mirror serves. The image is referenced by its id; the package list
# (name, version, .deb sha256) is written next to the cache so a later site sees what it holds.
#
# Usage: docker/make-cuda-toolchain-image.sh [TAG]   (CACHE=/work/cache/apt-trixie by default)
set -eu

TAG="${1:-rlk-kit/cuda-toolchain:trixie-12.4}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
CACHE="${CACHE:-/work/cache/apt-trixie}"
SUITE=trixie
PACKAGES="nvidia-cuda-toolkit,ca-certificates"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"
export SOURCE_DATE_EPOCH

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT INT TERM
mkdir -p "$CACHE"

echo "make-cuda-toolchain-image: mmdebstrap $SUITE ($PACKAGES) from $MIRROR, debs cached in $CACHE" >&2
mmdebstrap --mode=root --variant=minbase --include="$PACKAGES" \
    --components="main contrib non-free" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in $CACHE /var/cache/apt/archives/" \
    --customize-hook="sync-out /var/cache/apt/archives $CACHE" \
    --customize-hook='chroot "$1" dpkg-query -W -f "\${Package}\t\${Version}\t\${Architecture}\n" > "$1"/packages.tsv' \
    --customize-hook="copy-out /packages.tsv $tmp" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/packages.tsv "$1"/var/log/* "$1"/etc/machine-id' \
    "$SUITE" "$tmp/rootfs.tar" "$MIRROR"

nvcc_version="$(awk -F'\t' '$1=="nvidia-cuda-toolkit"{print $2}' "$tmp/packages.tsv")"
# name, version, sha256 of the .deb that was installed (from the cache the hook synced out)
while IFS="$(printf '\t')" read -r name version arch; do
    deb="$(ls "$CACHE"/"${name}_"*"_${arch}.deb" 2>/dev/null | head -n1 || true)"
    sum="$( [ -n "$deb" ] && sha256sum "$deb" | cut -d' ' -f1 || echo unknown)"
    printf '%s\t%s\t%s\n' "$name" "$version" "$sum"
done < "$tmp/packages.tsv" > "$CACHE/../cuda-toolchain-packages.tsv"

docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "LABEL dev.rlk-kit.base.debian-suite=$SUITE dev.rlk-kit.toolchain.nvidia-cuda-toolkit=$nvcc_version" \
    "$tmp/rootfs.tar" "$TAG" >/dev/null
echo "make-cuda-toolchain-image: $TAG $(docker image inspect --format '{{.Id}}' "$TAG") (nvidia-cuda-toolkit $nvcc_version)" >&2

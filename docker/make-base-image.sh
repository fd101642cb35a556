#!/bin/sh
# Make the smoke stack's base image locally: mmdebstrap a minimal Debian bookworm root
# file system and `docker import` it as rlk-kit/debian-base:bookworm.
#
# Why: hosts that build the smoke image have no container registry. The base therefore has
# no registry digest; the smoke stack names it by tag with "unresolved": true, and the
# image labels record the local image id instead (dev.rlk-kit.base.id).
#
# Contents: python3 (Debian's 3.11.2), python3-venv (ensurepip), git, ca-certificates.
# Everything else the smoke image needs comes from the host wheelhouse at build time, so
# `docker build` itself never touches the network.
#
# Usage: docker/make-base-image.sh [TAG]          (default rlk-kit/debian-base:bookworm)
#        MIRROR=http://deb.debian.org/debian docker/make-base-image.sh
set -eu

TAG="${1:-rlk-kit/debian-base:bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
PACKAGES="python3,python3-venv,git,ca-certificates"

command -v mmdebstrap >/dev/null 2>&1 || {
    echo "make-base-image: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2
    exit 2
}
command -v docker >/dev/null 2>&1 || {
    echo "make-base-image: docker CLI is not installed (apt-get install docker.io)" >&2
    exit 2
}

# A fixed epoch makes the tarball's mtimes independent of when it is made; the package
# versions still follow the mirror, which is why the base stays "unresolved".
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"
export SOURCE_DATE_EPOCH

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "make-base-image: mmdebstrap $SUITE ($PACKAGES) from $MIRROR" >&2
# --mode=root: the test hosts and CI run as root without user namespaces.
# dpkg excludes drop docs and man pages to keep the image small.
mmdebstrap --quiet --mode=root --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$SUITE" "$tmp/rootfs.tar" "$MIRROR"

python_version="$(tar -xOf "$tmp/rootfs.tar" ./var/lib/dpkg/status 2>/dev/null \
    | awk '/^Package: python3.11-minimal$/{p=1} p&&/^Version:/{print $2; exit}')"

docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL dev.rlk-kit.base.debian-suite=$SUITE dev.rlk-kit.base.python-deb=$python_version" \
    "$tmp/rootfs.tar" "$TAG" >/dev/null

echo "make-base-image: $TAG $(docker image inspect --format '{{.Id}}' "$TAG") (python3.11 $python_version)" >&2

#!/bin/sh
# Make the image that compiles Transformer Engine's PyTorch extension (docker/build-te-wheel.sh):
# an mmdebstrap of Debian bookworm, the CUDA image's own OS (CPython 3.11, glibc 2.36), with
# python3-dev, python3-venv and g++ (Debian's g++ 12), loaded as rlk-kit/debian-builder:bookworm.
#
# Made exactly like the base image (docker/make-base-image.sh, which this calls with another
# package set): SOURCE_DATE_EPOCH for the root file system, the image config written with that
# epoch and loaded with `docker load`, so two runs against the same mirror state give the same
# image id. The mirror moves, so the builder is pinned by that id (build-te-wheel.sh records it in
# te-build.json) and its package list (name, version, .deb sha256) is in the image at
# /etc/rlk-kit/base-packages.tsv.
#
# No CUDA here: nvcc comes from the trixie toolchain image (docker/make-cuda-toolchain-image.sh),
# torch and the CUDA headers from the locked wheels; the compile runs with no network.
#
# Usage: docker/make-builder-image.sh [TAG]        (default rlk-kit/debian-builder:bookworm)
#        MIRROR=http://deb.debian.org/debian docker/make-builder-image.sh
set -eu
TAG="${1:-rlk-kit/debian-builder:bookworm}"
PACKAGES="python3,python3-dev,python3-venv,g++,ca-certificates" CREATED_BY=docker/make-builder-image.sh \
    exec sh "$(dirname "$0")/make-base-image.sh" "$TAG"

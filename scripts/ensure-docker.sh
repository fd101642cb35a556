#!/bin/sh
# Make sure a Docker engine answers and the smoke base image exists (tests and CI call this).
#   1. install docker.io and mmdebstrap with apt when missing;
#   2. start dockerd when no engine answers (no systemd here) and wait for it (up to 60 s);
#   3. make rlk-kit/debian-base:bookworm with docker/make-base-image.sh when it is missing.
set -eu
here="$(cd "$(dirname "$0")/.." && pwd)"
BASE_TAG="${RLK_BASE_IMAGE:-rlk-kit/debian-base:bookworm}"

. "$here/scripts/lib/install-missing.sh"
install_missing ensure-docker dockerd:docker.io mmdebstrap:mmdebstrap

if ! docker info >/dev/null 2>&1; then
    echo "ensure-docker: starting dockerd (log: /tmp/dockerd.log)" >&2
    nohup dockerd >/tmp/dockerd.log 2>&1 &
    i=0
    until docker info >/dev/null 2>&1; do
        i=$((i + 1))
        if [ "$i" -ge 60 ]; then
            echo "ensure-docker: dockerd did not answer within 60 s; see /tmp/dockerd.log" >&2
            exit 1
        fi
        sleep 1
    done
fi

if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    "$here/docker/make-base-image.sh" "$BASE_TAG"
fi
echo "ensure-docker: engine $(docker version --format '{{.Server.Version}}'), base $BASE_TAG present" >&2

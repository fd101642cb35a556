#!/bin/sh
# Make the smoke stack's base image locally: mmdebstrap a minimal Debian bookworm root
# file system and load it as rlk-kit/debian-base:bookworm, byte-reproducibly.
#
# Why: hosts that build the smoke image have no container registry. The base therefore has
# no registry digest; the smoke stack names it by tag with "unresolved": true, and the
# image labels record the local image id instead (dev.rlk-kit.base.id).
#
# Reproducible: mmdebstrap honours SOURCE_DATE_EPOCH (sorted tar, clamped mtimes), and the image
# config is written here with that epoch as its creation time and loaded with `docker load`
# (`docker import` would stamp the clock into the config, and so into the id). Two runs against
# the same mirror state give the same image id; the mirror moves, so the base is pinned by that id
# and its package list (name, version, .deb sha256) is written into the image at
# /etc/rlk-kit/base-packages.tsv, which the kit's build provenance copies.
#
# Contents: python3 (Debian's 3.11.2), python3-venv (ensurepip), git, ca-certificates.
# Everything else the smoke image needs comes from the host wheelhouse at build time, so
# `docker build` itself never touches the network.
#
# Usage: docker/make-base-image.sh [TAG]          (default rlk-kit/debian-base:bookworm)
#        PACKAGES=a,b CREATED_BY=NAME docker/make-base-image.sh TAG   (another package set; see
#        docker/make-builder-image.sh)
#        MIRROR=http://deb.debian.org/debian docker/make-base-image.sh
set -eu

TAG="${1:-rlk-kit/debian-base:bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
PACKAGES="${PACKAGES:-python3,python3-venv,git,ca-certificates}"
CREATED_BY="${CREATED_BY:-docker/make-base-image.sh}"

for tool in mmdebstrap docker python3; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "make-base-image: $tool is not installed (apt-get install mmdebstrap docker.io python3)" >&2
        exit 2
    }
done

SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}"
export SOURCE_DATE_EPOCH

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "$CREATED_BY: mmdebstrap $SUITE ($PACKAGES) from $MIRROR" >&2
# --mode=root: the test hosts and CI run as root without user namespaces.
# dpkg excludes drop docs and man pages to keep the image small. The package list is written
# before apt's cache is emptied (the .debs are still there to hash).
mmdebstrap --quiet --mode=root --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --skip=essential/unlink \
    --customize-hook='mkdir -p "$1"/etc/rlk-kit && chroot "$1" dpkg-query -W -f "\${Package}\t\${Version}\t\${Architecture}\n" | LC_ALL=C sort | while IFS="$(printf "\t")" read -r n v a; do f="$(ls "$1"/var/cache/apt/archives/"${n}_"*"_${a}.deb" 2>/dev/null | head -n1)"; s=""; [ -n "$f" ] && s="$(sha256sum "$f" | cut -d" " -f1)"; printf "%s\t%s\t%s\n" "$n" "$v" "$s"; done > "$1"/etc/rlk-kit/base-packages.tsv' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log "$1"/var/cache/ldconfig/aux-cache; : > "$1"/etc/machine-id' \
    "$SUITE" "$tmp/rootfs.tar" "$MIRROR"

python_version="$(tar -xOf "$tmp/rootfs.tar" ./var/lib/dpkg/status 2>/dev/null \
    | awk '/^Package: python3.11-minimal$/{p=1} p&&/^Version:/{print $2; exit}')"

# The image config, written with the epoch as its time, and `docker load` of config + layer.
python3 - "$tmp" "$TAG" "$SUITE" "$python_version" "$SOURCE_DATE_EPOCH" "$CREATED_BY" <<'PY'
import hashlib, json, os, sys, tarfile, time
tmp, tag, suite, python_deb, epoch, created_by = sys.argv[1:]
rootfs = os.path.join(tmp, "rootfs.tar")
sha = hashlib.sha256()
with open(rootfs, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        sha.update(chunk)
diff_id = "sha256:" + sha.hexdigest()
created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
config = {
    "architecture": "amd64", "os": "linux", "created": created,
    "config": {"Env": ["LANG=C.UTF-8", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
               "Cmd": ["/bin/bash"],
               "Labels": {"dev.rlk-kit.base.debian-suite": suite, "dev.rlk-kit.base.python-deb": python_deb,
                          "dev.rlk-kit.base.source-date-epoch": epoch}},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": created, "created_by": created_by + " (mmdebstrap " + suite + ")"}],
}
data = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
name = hashlib.sha256(data).hexdigest()
with open(os.path.join(tmp, "config.json"), "wb") as f:
    f.write(data)
with tarfile.open(os.path.join(tmp, "image.tar"), "w") as out:
    for arcname, path in ((name + ".json", "config.json"), (diff_id[7:] + "/layer.tar", "rootfs.tar")):
        out.add(os.path.join(tmp, path), arcname)
    manifest = json.dumps([{"Config": name + ".json", "RepoTags": [tag], "Layers": [diff_id[7:] + "/layer.tar"]}]).encode()
    info = tarfile.TarInfo("manifest.json")
    info.size = len(manifest)
    import io
    out.addfile(info, io.BytesIO(manifest))
print("sha256:" + name)
PY
docker load -q -i "$tmp/image.tar" >/dev/null
echo "$CREATED_BY: $TAG $(docker image inspect --format '{{.Id}}' "$TAG") (python3.11 $python_version)" >&2

# Sourced by scripts/ensure-*.sh: install the Debian packages whose command is missing, in one apt call.
#   install_missing WHO COMMAND:PACKAGE ...      e.g. install_missing ensure-docker dockerd:docker.io
install_missing() {
    who="$1"
    shift
    need=""
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || need="$need ${pair#*:}"
    done
    [ -n "$need" ] || return 0
    echo "$who: installing$need" >&2
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
}

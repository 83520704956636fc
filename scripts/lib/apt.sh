# shellcheck shell=bash
# Sourced by the install-*-deps.sh scripts: apt_install PACKAGE...
# Installs with apt (--no-install-recommends, after apt-get update), as root or with sudo.
apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        { echo "${0##*/}: error: apt-get not found; install $* by hand" >&2; exit 1; }
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 ||
            { echo "${0##*/}: error: must run as root (or have sudo)" >&2; exit 1; }
        sudo=(sudo)
    fi
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update
    "${sudo[@]}" apt-get install -y --no-install-recommends "$@"
}

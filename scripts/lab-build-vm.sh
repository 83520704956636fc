#!/usr/bin/env bash
# Build the soft-RoCE lab guest: Debian bookworm with its own kernel
# (CONFIG_RDMA_RXE=m), rdma-core, perftest and python3-pyverbs.
#
# Three stages, each skipped when its inputs have not changed (a stamp file
# holds the hash of the inputs):
#   rootfs  mmdebstrap into $LAB_DIR/rootfs; kernel and initrd copied out of /boot
#   site    the guest's Python packages, pip --target $LAB_DIR/site
#   image   $LAB_DIR/rootfs.ext4 = rootfs + site + the PID-1 stub (mkfs.ext4 -d)
set -euo pipefail

# shellcheck source=scripts/lab/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab/common.sh"

# The lab notes' list: `apt` variant has no mount(8), so it is named; the
# initrd (from linux-image-amd64 via initramfs-tools) carries virtio, ext4, 9p.
GUEST_PACKAGES=(
    linux-image-amd64 kmod mount procps iproute2 iputils-ping ethtool netbase tcpdump iperf3
    rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
    python3 python3-pyverbs
)
IMAGE_SIZE="${RDMAKIT_LAB_IMAGE_SIZE:-3G}"
GUEST_SITE=/opt/rdmakit/site
REQUIREMENTS="$LAB_SCRIPTS/lab/requirements.txt"
STUB="$LAB_SCRIPTS/lab/guest-boot"

usage() {
    cat <<USAGE
Usage: $PROG [-h] [--force] [--check] [--print-mirror]

Build the lab guest image into \$RDMAKIT_LAB_DIR (default: build/lab in the
checkout, now: $LAB_DIR). Idempotent: stages whose inputs did not change
are skipped. Needs root, network access to the Debian archive and PyPI.

  --force         rebuild every stage
  --check         exit 0 if the image is built and up to date, 1 if not
  --print-mirror  print the Debian mirror that would be used, and exit

Environment:
  RDMAKIT_LAB_DIR         cache folder (default build/lab in the checkout)
  RDMAKIT_LAB_MIRROR      Debian mirror URL (default: from /etc/apt/sources.list*)
  RDMAKIT_LAB_IMAGE_SIZE  size of the sparse ext4 image (default 3G)
USAGE
}

# Print the URI of the first enabled "deb" source for $LAB_SUITE found in the
# apt sources (one-line .list and deb822 .sources formats, apt's order). When
# no entry names the suite, fall back to a Debian archive (URI ending /debian).
find_mirror() {
    local files=() f
    [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] && files+=("$f")
    done
    ((${#files[@]})) || return 1
    awk -v suite="$LAB_SUITE" '
        function emit(types, uris, suites, enabled,    n, i, t, u, s, nt, ns) {
            if (enabled ~ /^(no|false|0)$/) return
            nt = split(types, t, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
            n = split(uris, u, /[ \t]+/)
            for (i = 1; i <= nt; i++) if (t[i] == "deb") break
            if (i > nt || n < 1) return
            for (i = 1; i <= ns; i++)
                if (s[i] == suite && exact == "") exact = u[1]
            if (fallback == "" && u[1] ~ /\/debian\/?$/) fallback = u[1]
        }
        function flush() {
            if (uris != "") emit(types, uris, suites, enabled)
            types = uris = suites = enabled = ""
        }
        FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
        /^[ \t]*#/ { next }
        deb822 {
            if ($0 ~ /^[ \t]*$/) { flush(); next }
            if (match($0, /^[A-Za-z-]+:/)) {
                key = tolower(substr($0, 1, RLENGTH - 1)); val = substr($0, RLENGTH + 1)
                gsub(/^[ \t]+|[ \t]+$/, "", val)
                if (key == "types") types = val
                else if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "enabled") enabled = tolower(val)
            }
            next
        }
        $1 == "deb" {
            line = $0; sub(/^[ \t]*deb[ \t]+/, "", line)
            if (line ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "", line)
            split(line, w, /[ \t]+/)
            emit("deb", w[1], w[2], "")
        }
        END {
            flush()
            if (exact != "") print exact; else if (fallback != "") print fallback
            else exit 1
        }
    ' "${files[@]}"
}

mirror() {
    if [[ -n "${RDMAKIT_LAB_MIRROR:-}" ]]; then
        printf '%s\n' "${RDMAKIT_LAB_MIRROR%/}"
        return
    fi
    local m
    m="$(find_mirror)" ||
        die "no Debian mirror for $LAB_SUITE in /etc/apt/sources.list*; set RDMAKIT_LAB_MIRROR"
    printf '%s\n' "${m%/}"
}

# A Python 3.11 on the host installs the guest's wheels natively; with another
# version pip is told the guest's interpreter and platform instead.
host_python311() {
    local py
    for py in python3.11 python3; do
        if command -v "$py" >/dev/null 2>&1 &&
            [[ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" == 3.11 ]]; then
            command -v "$py"
            return 0
        fi
    done
    return 1
}

hash_of() {
    sha256sum | cut -d' ' -f1
}

rootfs_inputs() {
    printf 'suite=%s\nmirror=%s\npackages=%s\nformat=2\n' \
        "$LAB_SUITE" "$1" "${GUEST_PACKAGES[*]}"
}

site_inputs() {
    printf 'python=3.11\nformat=1\n'
    cat "$REQUIREMENTS"
}

image_inputs() {
    printf 'size=%s\nformat=2\n' "$IMAGE_SIZE"
    cat "$LAB_DIR/rootfs.stamp" "$LAB_DIR/site.stamp" 2>/dev/null || true
    cat "$STUB"
}

stamp_ok() {
    # stamp_ok NAME HASH: the stage's stamp holds HASH
    [[ -f "$LAB_DIR/$1.stamp" && "$(cat "$LAB_DIR/$1.stamp")" == "$2" ]]
}

build_rootfs() {
    local mirror_url="$1" want="$2" t0
    t0="$(now)"
    info "rootfs: mmdebstrap $LAB_SUITE from $mirror_url (about 2 minutes)"
    rm -rf "$LAB_DIR/rootfs.new" "$LAB_DIR/rootfs.stamp"
    local include
    include="$(IFS=,; printf '%s' "${GUEST_PACKAGES[*]}")"
    mmdebstrap --mode=root --variant=apt --components=main \
        --include="$include" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$LAB_SUITE" "$LAB_DIR/rootfs.new" "deb $mirror_url $LAB_SUITE main"
    local kernel initrd
    kernel="$(find "$LAB_DIR/rootfs.new/boot" -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n1)"
    initrd="$(find "$LAB_DIR/rootfs.new/boot" -maxdepth 1 -name 'initrd.img-*' | sort -V | tail -n1)"
    [[ -n "$kernel" ]] || die "no kernel in the rootfs's /boot"
    [[ -n "$initrd" ]] || die "no initrd in the rootfs's /boot (initramfs-tools missing?)"
    find "$LAB_DIR/rootfs.new/lib/modules" -name 'rdma_rxe.ko*' | grep -q . ||
        die "the guest kernel has no rdma_rxe module"
    rm -rf "$LAB_DIR/rootfs"
    mv "$LAB_DIR/rootfs.new" "$LAB_DIR/rootfs"
    cp "$LAB_DIR/rootfs/boot/${kernel##*/}" "$LAB_DIR/vmlinuz"
    cp "$LAB_DIR/rootfs/boot/${initrd##*/}" "$LAB_DIR/initrd.img"
    printf '%s\n' "${kernel##*/vmlinuz-}" >"$LAB_DIR/kernel-version"
    printf '%s\n' "$want" >"$LAB_DIR/rootfs.stamp"
    info "rootfs: done in $(elapsed "$t0") s (kernel $(cat "$LAB_DIR/kernel-version"))"
}

build_site() {
    local want="$1" t0 py
    t0="$(now)"
    rm -rf "$LAB_DIR/site.new" "$LAB_DIR/site.stamp"
    local pip_args=(install --quiet --no-warn-script-location --root-user-action=ignore --target "$LAB_DIR/site.new"
        -r "$REQUIREMENTS")
    if py="$(host_python311)"; then
        info "site: pip install --target with $py"
    else
        py="$(command -v python3)" || die "python3 not found"
        info "site: pip install --target with $py for CPython 3.11 manylinux (wheels only)"
        pip_args+=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311
            --platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
            --platform linux_x86_64 --platform any)
    fi
    "$py" -m pip "${pip_args[@]}"
    rm -rf "$LAB_DIR/site"
    mv "$LAB_DIR/site.new" "$LAB_DIR/site"
    printf '%s\n' "$want" >"$LAB_DIR/site.stamp"
    info "site: done in $(elapsed "$t0") s"
}

build_image() {
    local want="$1" t0 root="$LAB_DIR/rootfs"
    t0="$(now)"
    rm -f "$LAB_DIR/image.stamp"
    rm -rf "$root$GUEST_SITE"
    mkdir -p "$root$GUEST_SITE" "$root/mnt/rdmakit" "$root/mnt/labrun"
    cp -a "$LAB_DIR/site/." "$root$GUEST_SITE/"
    # pip wrote the host interpreter into the console scripts' #! lines.
    local script
    for script in "$root$GUEST_SITE"/bin/*; do
        [[ -f "$script" ]] && sed -i '1s|^#!.*python.*$|#!/usr/bin/python3|' "$script"
    done
    install -m 0755 "$STUB" "$root/sbin/rdmakit-lab-init"
    printf 'rdmakit-lab\n' >"$root/etc/hostname"
    rm -f "$LAB_DIR/rootfs.ext4.new"
    truncate -s "$IMAGE_SIZE" "$LAB_DIR/rootfs.ext4.new"
    mkfs.ext4 -q -F -L rdmakit-lab -d "$root" "$LAB_DIR/rootfs.ext4.new"
    mv "$LAB_DIR/rootfs.ext4.new" "$LAB_DIR/rootfs.ext4"
    printf '%s\n' "$want" >"$LAB_DIR/image.stamp"
    info "image: $LAB_DIR/rootfs.ext4 ($(du -h "$LAB_DIR/rootfs.ext4" | cut -f1) used) in $(elapsed "$t0") s"
}

FORCE=0
CHECK=0
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --force) FORCE=1 ;;
        --check) CHECK=1 ;;
        --print-mirror) mirror; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
    shift
done

MIRROR_URL="$(mirror)"
ROOTFS_WANT="$(rootfs_inputs "$MIRROR_URL" | hash_of)"
SITE_WANT="$(site_inputs | hash_of)"

if ((CHECK)); then
    if ! { stamp_ok rootfs "$ROOTFS_WANT" && stamp_ok site "$SITE_WANT" &&
        stamp_ok image "$(image_inputs | hash_of)" &&
        [[ -f "$LAB_DIR/rootfs.ext4" && -f "$LAB_DIR/vmlinuz" && -f "$LAB_DIR/initrd.img" ]]; }; then
        info "image in $LAB_DIR is missing or out of date"
        exit 1
    fi
    info "image in $LAB_DIR is up to date"
    exit 0
fi

need_root "mmdebstrap --mode=root, mkfs of a root-owned tree"
need_cmd mmdebstrap mkfs.ext4 truncate sha256sum flock
mkdir -p "$LAB_DIR"
exec 9>"$LAB_DIR/build.lock"
flock -n 9 || { info "another build holds $LAB_DIR/build.lock; waiting"; flock 9; }

T0="$(now)"
if ((FORCE)) || ! stamp_ok rootfs "$ROOTFS_WANT" || [[ ! -d "$LAB_DIR/rootfs" ]]; then
    build_rootfs "$MIRROR_URL" "$ROOTFS_WANT"
else
    info "rootfs: up to date"
fi
if ((FORCE)) || ! stamp_ok site "$SITE_WANT" || [[ ! -d "$LAB_DIR/site" ]]; then
    build_site "$SITE_WANT"
else
    info "site: up to date"
fi
IMAGE_WANT="$(image_inputs | hash_of)"
if ((FORCE)) || ! stamp_ok image "$IMAGE_WANT" || [[ ! -f "$LAB_DIR/rootfs.ext4" ]]; then
    build_image "$IMAGE_WANT"
else
    info "image: up to date"
fi
info "lab image ready in $LAB_DIR ($(elapsed "$T0") s); run: scripts/lab-run.sh -- ibv_devinfo"

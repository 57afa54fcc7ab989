#!/bin/sh
# warren initContainer: make sure the host kernel has the modules sandboxes need, or fail clearly.
#
# The server's start-up probe would otherwise fail later with a less direct error (an overlay
# mount or an nft rule refused). Modules are loaded into the *host* kernel, so modprobe must
# resolve them against the host's /lib/modules, not this image's: by default it runs as
# `chroot $HOST_ROOT modprobe` (the host's own kmod, which knows the host's module
# compression), falling back to this image's kmod with `modprobe -d $HOST_ROOT` on hosts
# without a modprobe binary. The host root is mounted read-only; modprobe only reads it.
#
# A module counts as present if it is loaded (/proc/modules, kernel-global), built in
# (modules.builtin of the running kernel), or has a /sys/module entry (built-ins with
# parameters). Everything present is listed; anything missing fails the pod with its name.
#
# Default modules (WARREN_MODULES overrides):
#   overlay                  sandbox rootfs (overlayfs)
#   veth                     the host/sandbox interface pair
#   tun                      /dev/net/tun for runtimes that want it
#   nf_tables nft_chain_nat nft_masq nf_nat nf_conntrack nft_ct nft_fib_inet
#                            warren's nftables table: NAT masquerade, ct state, fib anti-spoofing
#   loop                     per-sandbox disks (size-capped ext4 images); without it sizes are not enforced
# br_netfilter is not in the list: warren routes sandbox veths, it does not bridge them.
#
# Test seams: HOST_ROOT, KERNEL_RELEASE, PROC_MODULES, SYS_MODULE, MODPROBE (a command
# that is given the module name as its last argument).
#
# POSIX sh; runs under dash and busybox sh.

set -u

HOST_ROOT=${HOST_ROOT:-/host}
KERNEL_RELEASE=${KERNEL_RELEASE:-$(uname -r)}
PROC_MODULES=${PROC_MODULES:-/proc/modules}
SYS_MODULE=${SYS_MODULE:-/sys/module}
WARREN_MODULES=${WARREN_MODULES:-overlay veth tun nf_tables nf_conntrack nf_nat nft_chain_nat nft_masq nft_ct nft_fib_inet loop}

say() {
    printf 'warren-modules: %s\n' "$*"
}

# modules.builtin and modprobe accept '-' and '_' alike; /proc/modules and /sys/module use '_'.
norm() {
    printf '%s' "$1" | tr '-' '_'
}

builtin_list() {
    for dir in "$HOST_ROOT/lib/modules/$KERNEL_RELEASE" "$HOST_ROOT/usr/lib/modules/$KERNEL_RELEASE"; do
        if [ -r "$dir/modules.builtin" ]; then
            sed -e 's|.*/||' -e 's|\.ko.*$||' "$dir/modules.builtin" | tr '-' '_'
            return 0
        fi
    done
    return 0
}

# `grep -x >/dev/null`, not `grep -q`: -q stops reading at the first match, and a shell with
# pipefail (busybox sh has it) would then see the writer die of SIGPIPE and call a match a miss.
is_loaded() {
    [ -r "$PROC_MODULES" ] && cut -d ' ' -f 1 "$PROC_MODULES" | grep -x "$1" >/dev/null
}

is_builtin() {
    printf '%s\n' "$BUILTIN" | grep -x "$1" >/dev/null
}

probe() {
    if [ -n "${MODPROBE:-}" ]; then
        # shellcheck disable=SC2086 # MODPROBE is a command line on purpose
        $MODPROBE "$1"
    elif [ -x "$HOST_ROOT/sbin/modprobe" ] || [ -x "$HOST_ROOT/usr/sbin/modprobe" ]; then
        chroot "$HOST_ROOT" modprobe "$1"
    else
        modprobe -d "$HOST_ROOT" "$1"
    fi
}

if [ ! -d "$HOST_ROOT/lib/modules/$KERNEL_RELEASE" ] && [ ! -d "$HOST_ROOT/usr/lib/modules/$KERNEL_RELEASE" ]; then
    say "warning: no module directory for kernel $KERNEL_RELEASE under $HOST_ROOT; only loaded and built-in modules can be found"
fi

BUILTIN=$(builtin_list)
missing=""
for raw in $WARREN_MODULES; do
    m=$(norm "$raw")
    if is_loaded "$m"; then
        say "$m: loaded"
    elif is_builtin "$m"; then
        say "$m: built in"
    elif [ -d "$SYS_MODULE/$m" ]; then
        say "$m: built in (/sys/module)"
    elif out=$(probe "$m" 2>&1) && { is_loaded "$m" || [ -d "$SYS_MODULE/$m" ]; }; then
        say "$m: loaded now"
    else
        say "$m: MISSING${out:+ (modprobe: $(printf '%s' "$out" | tr '\n' ' '))}"
        missing="$missing $m"
    fi
done

if [ -r "$PROC_MODULES" ]; then
    say "host modules now loaded: $(cut -d ' ' -f 1 "$PROC_MODULES" | sort | tr '\n' ' ')"
fi

if [ -n "$missing" ]; then
    say "error: kernel $KERNEL_RELEASE lacks module(s):$missing. Install them on the node (e.g. the distribution's linux-modules-extra package) or build them in; warren cannot start without them."
    exit 1
fi
say "all required modules present on kernel $KERNEL_RELEASE"

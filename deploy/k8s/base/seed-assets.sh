#!/bin/sh
# warren initContainer: copy the runtime assets baked into the image onto the node, never
# overwriting what the node already has.
#
# The state dir is a hostPath, so it shadows nothing in the image; but the assets the image
# carries (the guest agent bundle, built-in templates) would otherwise be rebuilt by the
# server on every new node. This fills in what is missing and leaves everything present
# untouched, including files the server rebuilt or an operator replaced.
#
# Why not `cp -rn` / `cp --update=none`: a copy killed half-way leaves a half-written entry
# that no later run would ever replace, and the server treats a present asset directory as
# complete. So each missing entry is copied under a temporary name beside its destination
# and renamed into place; an entry that exists is either complete or was put there by
# someone else. A directory that exists on both sides is merged one level down the same
# way. (`--update=none` is also too new for bookworm's coreutils 9.1.)
#
# Environment: ASSETS_SRC (default /opt/warren/assets), ASSETS_DST (default
# /var/lib/warren/assets).
#
# POSIX sh; runs under dash and busybox sh.

set -u

ASSETS_SRC=${ASSETS_SRC:-/opt/warren/assets}
ASSETS_DST=${ASSETS_DST:-/var/lib/warren/assets}
TMP_PREFIX=.warren-seed-tmp.

say() {
    printf 'warren-seed: %s\n' "$*"
}

# seed SRC_DIR DST_DIR: a subshell, so recursion keeps its own variables.
seed() (
    src=$1
    dst=$2
    for entry in "$src"/* "$src"/.[!.]* "$src"/..?*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        name=${entry##*/}
        case "$name" in "$TMP_PREFIX"*) continue ;; esac
        target="$dst/$name"
        tmp="$dst/$TMP_PREFIX$name"
        if [ -d "$entry" ] && [ ! -L "$entry" ] && [ -d "$target" ] && [ ! -L "$target" ]; then
            seed "$entry" "$target" || exit 1
        elif [ -e "$target" ] || [ -L "$target" ]; then
            say "kept $target"
        else
            rm -rf "$tmp" || exit 1
            if cp -a "$entry" "$tmp" && mv "$tmp" "$target"; then
                say "seeded $target"
            else
                rm -rf "$tmp"
                say "error: cannot copy $entry to $target"
                exit 1
            fi
        fi
    done
)

if [ ! -d "$ASSETS_SRC" ]; then
    say "no assets in the image at $ASSETS_SRC; nothing to seed (the server builds what it needs)"
    exit 0
fi
mkdir -p "$ASSETS_DST" || exit 1
# Leftovers of a run that was killed mid-copy, at any depth: never complete, always ours.
find "$ASSETS_DST" -name "$TMP_PREFIX*" -prune -exec rm -rf {} + || exit 1
if seed "$ASSETS_SRC" "$ASSETS_DST"; then
    say "done: $ASSETS_SRC -> $ASSETS_DST"
else
    say "error: seeding $ASSETS_DST failed"
    exit 1
fi

#!/usr/bin/env bash
# Host setup for warren, idempotent: Debian packages, the venv at .venv (pinned by requirements.lock),
# warren itself (editable), then `warren setup` (guest agent bundle + built-in templates, cached).
# Runs as root, unattended (CI=true, no stdin). A second run only checks and returns quickly.
#
# WARREN_SETUP_STAGES (default "packages,venv,sdk,warren"): the stages to run, comma-separated, always
# in that order. `WARREN_SETUP_STAGES=packages scripts/setup.sh` only installs the Debian packages
# (tests/unit/scripts runs it so against stand-in apt tools).
#
# The sdk stage installs the older e2b SDK of the version matrix (requirements-e2b-<version>.lock, every
# dependency pinned) into .sdk/e2b-<version> with `pip install --no-deps --target`; a stamp of the lock
# makes a second run a no-op. tests/e2e/test_sdk_versions.py runs SDK tests under it.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
PYTHON=${PYTHON:-python3}

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'scripts/setup.sh: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (sudo scripts/setup.sh)"

STAGES=${WARREN_SETUP_STAGES:-packages,venv,sdk,warren}
for stage in ${STAGES//,/ }; do
  case "$stage" in
    packages | venv | sdk | warren) ;;
    *) die "unknown stage '$stage' in WARREN_SETUP_STAGES (known: packages, venv, sdk, warren)" ;;
  esac
done
want_stage() { [[ ",$STAGES," == *",$1,"* ]]; }

# Needed by warren or its tests; setup fails without them.
REQUIRED=(runc debootstrap busybox-static nftables iptables patchelf iproute2 procps psmisc socat e2fsprogs curl dash
          python3 python3-venv ca-certificates)
# Installed when the host's release has them; features that need a missing one report it and their
# tests skip (runsc: gVisor; redis-server: cluster; docker-registry, skopeo: image pulls; dnsmasq-base:
# the egress tests' DNS).
OPTIONAL=(runsc redis-server docker-registry skopeo dnsmasq-base)

# No pipelines into `grep -q` here: under pipefail, grep exiting at its first match kills the
# producer with SIGPIPE and the pipeline fails (141) exactly when the match was found. Capture, then test.
missing_packages() {
  local pkg status
  for pkg in "$@"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = installed ] || echo "$pkg"
  done
}

has_candidate() {
  local policy
  policy=$(apt-cache policy "$1" 2>/dev/null || true)
  [[ $policy =~ Candidate:\ [^\(] ]]
}

install_packages() {
  mapfile -t need < <(missing_packages "${REQUIRED[@]}" "${OPTIONAL[@]}")
  if [ "${#need[@]}" -eq 0 ]; then
    log "Debian packages: all present"
    return
  fi
  log "apt-get update (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q </dev/null
  local install=() pkg
  for pkg in "${need[@]}"; do
    if has_candidate "$pkg"; then
      install+=("$pkg")
    elif [[ " ${OPTIONAL[*]} " == *" $pkg "* ]]; then
      log "optional package $pkg is not available on this release; skipping it"
    else
      die "required package $pkg is not available from the configured apt sources"
    fi
  done
  if [ "${#install[@]}" -gt 0 ]; then
    log "apt-get install ${install[*]}"
    apt-get install -y -q --no-install-recommends "${install[@]}" </dev/null
  fi
}

# pip verifies TLS with its own bundle; the system one also trusts a local intercepting proxy.
if [ -z "${PIP_CERT:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi

setup_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || die "$PYTHON is older than 3.11 (set PYTHON=/path/to/python3.11+)"
    log "creating $VENV with $("$PYTHON" --version)"
    "$PYTHON" -m venv "$VENV"
  fi
  local stamp=$VENV/.warren-deps wanted
  wanted=$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$VENV/bin/warren" ]; then
    log "venv: up to date"
    return
  fi
  log "pip install -r requirements.lock"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements.lock </dev/null
  log "pip install --no-deps -e ."
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e . </dev/null
  check_lock
  echo "$wanted" >"$stamp"
}

# Every requirement of warren and its dev extra must come from the lock: say which one does not.
check_lock() {
  "$VENV/bin/python" - <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement

bad = []
for spec in requires("warren") or []:
    req = Requirement(spec)
    if req.marker is not None and not req.marker.evaluate({"extra": "dev"}):
        continue
    try:
        installed = version(req.name)
    except PackageNotFoundError:
        bad.append(f"{req} (not installed)")
        continue
    if not req.specifier.contains(installed, prereleases=True):
        bad.append(f"{req} (installed {installed})")
if bad:
    sys.exit("requirements.lock does not satisfy pyproject.toml: " + "; ".join(bad))
PY
}

# The older SDKs of the version matrix, one target dir per lock; WARREN_SDK_DIR and WARREN_SDK_PIP
# (default .sdk and the venv's pip) let tests/unit/scripts run this stage against a stand-in pip.
setup_sdks() {
  local sdk_dir=${WARREN_SDK_DIR:-$ROOT/.sdk} pip=${WARREN_SDK_PIP:-$VENV/bin/pip} lock version target wanted
  for lock in "$ROOT"/requirements-e2b-*.lock; do
    [ -f "$lock" ] || continue
    version=${lock##*/requirements-e2b-}
    version=${version%.lock}
    target=$sdk_dir/e2b-$version
    wanted=$(sha256sum <"$lock" | cut -d' ' -f1)
    if [ -f "$target/.warren-sdk" ] && [ "$(cat "$target/.warren-sdk")" = "$wanted" ]; then
      log "e2b $version for the SDK matrix: up to date"
      continue
    fi
    log "pip install --target $target (e2b $version for the SDK matrix)"
    rm -rf "$target.tmp"
    mkdir -p "$sdk_dir"
    "$pip" install -q --disable-pip-version-check --no-deps --target "$target.tmp" -r "$lock" </dev/null \
      || { rm -rf "$target.tmp"; die "installing e2b $version into $target failed"; }
    echo "$wanted" >"$target.tmp/.warren-sdk"
    rm -rf "$target"
    mv "$target.tmp" "$target"
  done
}

if want_stage packages; then
  install_packages
fi
if want_stage venv; then
  setup_venv
fi
if want_stage sdk; then
  setup_sdks
fi
if want_stage warren; then
  log "warren setup"
  "$VENV/bin/warren" setup </dev/null
fi
log "done"

#!/usr/bin/env bash
# Builds what a real node of the local cluster runs, from Go modules and C sources:
# kubelet and kube-proxy (by build.sh, same Kubernetes release as the control plane),
# containerd v2 with its runc shim and ctr, runc (cgo + libseccomp), crictl, CoreDNS,
# kube-router (NetworkPolicy enforcement only) and the pause binary (static, from the
# Kubernetes module's build/pause C source). The CNI plugins come from Debian
# (containernetworking-plugins; `make services` installs them).
#
# Output: $KVRANK_CACHE/node/<versions>/bin. A second run with the same pinned versions finds
# the binaries and returns in seconds. Prints the bin directory as its last line of stdout.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.3.7}"
RUNC_VERSION="${RUNC_VERSION:-v1.4.3}"          # Debian's 1.1.5 cannot start sandboxes here
CRICTL_VERSION="${CRICTL_VERSION:-v1.37.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"  # the only v2 the module proxy serves
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"

CACHE_ROOT="${KVRANK_CACHE:-$HOME/.cache/kvrank}"
KEY="containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_crictl-${CRICTL_VERSION}_coredns-${COREDNS_VERSION}_kube-router-${KUBE_ROUTER_VERSION}_pause-${KUBE_VERSION}_actionlint-${ACTIONLINT_VERSION}"
OUT="$CACHE_ROOT/node/$KEY"
BIN="$OUT/bin"
WORK="$OUT/src"
BINARIES=(containerd containerd-shim-runc-v2 ctr runc crictl coredns kube-router pause actionlint)

export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod"
LOG_TAG=localkube-node-build
# shellcheck source=build-common.sh
source "$(dirname "$0")/build-common.sh"
command -v go >/dev/null || { echo "localkube-node-build: 'go' is not on PATH" >&2; exit 1; }
command -v gcc >/dev/null || { echo "localkube-node-build: 'gcc' is not on PATH" >&2; exit 1; }
[[ -f /usr/include/seccomp.h ]] || {
  echo "localkube-node-build: runc needs libseccomp-dev (make services installs it)" >&2; exit 1; }
mkdir -p "$BIN" "$WORK"

build() {  # NAME MODULE VERSION PACKAGE CGO TAGS [LDFLAGS]
  local name="$1" mod="$2" ver="$3" pkg="$4" cgo="$5" tags="$6" ldflags="${7:-}"
  [[ -x "$BIN/$name" ]] && return 0
  local dir="$WORK/${mod//\//_}"
  mkdir -p "$dir"
  printf 'module kvrank.local/build/node\n\ngo 1.26.0\n\nrequire %s %s\n' "$mod" "$ver" > "$dir/go.mod"
  log "building $name $ver"
  (cd "$dir" && CGO_ENABLED="$cgo" go build -trimpath -tags "$tags" \
    -ldflags "-s -w $ldflags" -o "$BIN/$name" "$pkg")
}

CTRD=github.com/containerd/containerd/v2
CTRD_TAGS="no_btrfs no_devmapper no_zfs"
CTRD_LD="-X $CTRD/version.Version=$CONTAINERD_VERSION -X $CTRD/version.Revision=kvrank"
build containerd "$CTRD" "$CONTAINERD_VERSION" "$CTRD/cmd/containerd" 0 "$CTRD_TAGS" "$CTRD_LD"
build containerd-shim-runc-v2 "$CTRD" "$CONTAINERD_VERSION" "$CTRD/cmd/containerd-shim-runc-v2" 0 "$CTRD_TAGS" "$CTRD_LD"
build ctr "$CTRD" "$CONTAINERD_VERSION" "$CTRD/cmd/ctr" 0 "$CTRD_TAGS" "$CTRD_LD"
build runc github.com/opencontainers/runc "$RUNC_VERSION" github.com/opencontainers/runc 1 seccomp \
  "-X main.version=${RUNC_VERSION#v}"
build crictl sigs.k8s.io/cri-tools "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl 0 "" \
  "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
build coredns github.com/coredns/coredns "$COREDNS_VERSION" github.com/coredns/coredns 0 ""
build kube-router github.com/cloudnativelabs/kube-router/v2 "$KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router 0 ""
build actionlint github.com/rhysd/actionlint "$ACTIONLINT_VERSION" github.com/rhysd/actionlint/cmd/actionlint 0 ""

if [[ ! -x "$BIN/pause" ]]; then
  log "building pause from k8s.io/kubernetes $KUBE_VERSION build/pause"
  src="$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  gcc -Os -Wall -Werror -static -DVERSION="${KUBE_VERSION}-kvrank" \
    -o "$BIN/pause" "$src/build/pause/linux/pause.c"
fi

have_all || { echo "localkube-node-build: some binaries are missing in $BIN" >&2; exit 1; }
log "done: $(ls "$BIN" | tr '\n' ' ')"
echo "$BIN"

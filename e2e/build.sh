#!/usr/bin/env bash
# Build the real control plane used by `make e2e` from Go modules (no prebuilt binaries are downloaded).
#
#   etcd                    go.etcd.io/etcd/server/v3          (a tiny main around etcdmain)
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#                           k8s.io/kubernetes                  (a throwaway module replacing every staging module)
#   mpi-operator            github.com/kubeflow/mpi-operator   (also the source of the MPIJob CRD)
#   kwok                    sigs.k8s.io/kwok
#   kueue                   sigs.k8s.io/kueue                  (also the source of its CRDs and webhooks)
#
# Outputs go to .e2e/bin (gitignored); a binary already there for the same version is reused. If
# OMS_E2E_BIN or KUBEBUILDER_ASSETS names a folder holding a binary, that one is used and not built.
# One binary at a time (-p 2): the machines have 2 cores.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
MPI_OPERATOR_VERSION="${MPI_OPERATOR_VERSION:-v0.8.2}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"

# Go's standard install location, when a non-login shell did not put it on PATH.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
    PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null; then
    echo "e2e/build.sh: the Go toolchain (go 1.26 or newer) is needed to build the control plane" >&2
    exit 1
fi

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
E2E="$ROOT/.e2e"
BIN="$E2E/bin"
SRC="$E2E/src"
mkdir -p "$BIN" "$SRC" "$E2E/logs"
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
BUILD_FLAGS=(-p 2 -trimpath)

log() { printf '[e2e-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Prints the folder of a prebuilt binary named $1 from OMS_E2E_BIN / KUBEBUILDER_ASSETS, if any.
external() {
    local dir
    for dir in "${OMS_E2E_BIN:-}" "${KUBEBUILDER_ASSETS:-}"; do
        if [ -n "$dir" ] && [ -x "$dir/$1" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

# up_to_date NAME STAMP: true when .e2e/bin/NAME was built from STAMP (or a prebuilt one is configured).
up_to_date() {
    if dir="$(external "$1")"; then
        log "$1: using $dir/$1"
        return 0
    fi
    [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.stamp" 2>/dev/null)" = "$2" ]
}

# build NAME MODULE_DIR PACKAGE STAMP [EXTRA_LDFLAGS]
build() {
    local name="$1" dir="$2" pkg="$3" stamp="$4" ldflags="-s -w ${5:-}" start
    start=$(date +%s)
    log "$name: building $pkg ($stamp)"
    (cd "$dir" && go build "${BUILD_FLAGS[@]}" -ldflags="$ldflags" -o "$BIN/$name.tmp" "$pkg")
    mv "$BIN/$name.tmp" "$BIN/$name"
    echo "$stamp" >"$BIN/.$name.stamp"
    log "$name: built in $(($(date +%s) - start)) s"
}

new_module() {  # new_module DIR: an empty throwaway module
    mkdir -p "$1"
    if [ ! -f "$1/go.mod" ]; then
        (cd "$1" && go mod init oms-e2e-build >/dev/null 2>&1)
    fi
}

# --- etcd -------------------------------------------------------------------------------------------
if ! up_to_date etcd "etcd $ETCD_VERSION"; then
    dir="$SRC/etcd"
    new_module "$dir"
    cat >"$dir/main.go" <<'GO'
// Command etcd runs the etcd server (go.etcd.io/etcd/server/v3/etcdmain) for the e2e control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy)
    build etcd "$dir" . "etcd $ETCD_VERSION"
fi

# --- Kubernetes -------------------------------------------------------------------------------------
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
K8S_STAMP="kubernetes $K8S_VERSION (versioned)"
# What `hack/lib/version.sh` stamps into release builds, so /version and kubectl tell the truth.
minor="${K8S_VERSION#v1.}"
minor="${minor%%.*}"
K8S_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean"
done
need_k8s=()
for name in "${K8S_BINARIES[@]}"; do
    up_to_date "$name" "$K8S_STAMP" || need_k8s+=("$name")
done
if [ "${#need_k8s[@]}" -gt 0 ]; then
    dir="$SRC/kubernetes"
    new_module "$dir"
    staging="v0.${K8S_VERSION#v1.}"
    if ! grep -q "k8s.io/kubernetes $K8S_VERSION" "$dir/go.mod"; then
        gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
        # Every `k8s.io/<staging> => ./staging/src/k8s.io/<staging>` becomes `=> k8s.io/<staging> v0.X.Y`.
        sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod" | while read -r mod; do
            (cd "$dir" && go mod edit -replace "$mod=$mod@$staging")
        done
        (cd "$dir" && go mod edit -require "k8s.io/kubernetes@$K8S_VERSION")
        cat >"$dir/tools.go" <<'GO'
//go:build tools

// Package tools pins the Kubernetes commands the e2e control plane builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
        (cd "$dir" && go mod tidy -e 2>&1 | tail -5 >&2 || true)
    fi
    for name in "${need_k8s[@]}"; do
        build "$name" "$dir" "k8s.io/kubernetes/cmd/$name" "$K8S_STAMP" "$K8S_LDFLAGS"
    done
fi

# --- MPI Operator -----------------------------------------------------------------------------------
if ! up_to_date mpi-operator "mpi-operator $MPI_OPERATOR_VERSION"; then
    dir="$SRC/mpi-operator"
    new_module "$dir"
    (cd "$dir" && go get "github.com/kubeflow/mpi-operator/cmd/mpi-operator@$MPI_OPERATOR_VERSION")
    build mpi-operator "$dir" github.com/kubeflow/mpi-operator/cmd/mpi-operator "mpi-operator $MPI_OPERATOR_VERSION"
fi
# The CRD comes from the same module as the operator.
crd_dir="$(go mod download -json "github.com/kubeflow/mpi-operator@$MPI_OPERATOR_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
cp "$crd_dir/manifests/base/kubeflow.org_mpijobs.yaml" "$BIN/mpijob-crd.yaml.tmp" && mv "$BIN/mpijob-crd.yaml.tmp" "$BIN/mpijob-crd.yaml"
chmod 644 "$BIN/mpijob-crd.yaml"

# --- kwok -------------------------------------------------------------------------------------------
if ! up_to_date kwok "kwok $KWOK_VERSION"; then
    dir="$SRC/kwok"
    new_module "$dir"
    (cd "$dir" && go get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
    build kwok "$dir" sigs.k8s.io/kwok/cmd/kwok "kwok $KWOK_VERSION"
fi

# --- Kueue ------------------------------------------------------------------------------------------
if ! up_to_date kueue "kueue $KUEUE_VERSION"; then
    dir="$SRC/kueue"
    new_module "$dir"
    (cd "$dir" && go get "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION")
    build kueue "$dir" sigs.k8s.io/kueue/cmd/kueue "kueue $KUEUE_VERSION"
fi
# Kueue's CRDs come from the same module as the binary, one file per CRD, into .e2e/bin/kueue-crds.
kueue_dir="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
rm -rf "$BIN/kueue-crds.tmp" && mkdir -p "$BIN/kueue-crds.tmp"
cp "$kueue_dir"/config/components/crd/bases/*.yaml "$BIN/kueue-crds.tmp/"
chmod 644 "$BIN/kueue-crds.tmp"/*.yaml
rm -rf "$BIN/kueue-crds" && mv "$BIN/kueue-crds.tmp" "$BIN/kueue-crds"
# Its webhook configurations too (the e2e fixture points them at Kueue's loopback port).
cp "$kueue_dir/config/components/webhook/manifests.yaml" "$BIN/kueue-webhooks.yaml.tmp"
chmod 644 "$BIN/kueue-webhooks.yaml.tmp" && mv "$BIN/kueue-webhooks.yaml.tmp" "$BIN/kueue-webhooks.yaml"

log "all binaries ready in $BIN"

#!/usr/bin/env bash
# Runs softrdma's wire-interoperability suite against Linux Soft-RoCE
# (rdma_rxe) and rdma-core's mckey in QEMU guests: builds or reuses the
# guest image (build-image.sh, cached under /var/cache/softrdma-interop),
# then runs the Go tests of this folder with the suite enabled.
#
#   test/interop/run.sh                 # everything
#   test/interop/run.sh -run TestIGMP   # extra arguments go to `go test`
#
# Needs root. Environment: SOFTRDMA_INTEROP_CACHE (cache folder),
# SOFTRDMA_INTEROP_ACCEL=kvm|tcg (default: probe KVM, fall back to TCG),
# SOFTRDMA_INTEROP_MCKEY (a prebuilt softrdma mckey to test instead of
# building ./cmd/mckey), SOFTRDMA_ARTIFACTS (where a failed case's pcaps and guest logs are kept;
# default /tmp/softrdma-interop-artifacts).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
export GOFLAGS=${GOFLAGS:--buildvcs=false}

start=$(date +%s)
echo "== interop: guest image"
image=$(bash "$here/build-image.sh" | tail -n 1)
[ -e "$image/complete" ] || { echo "interop: no image at '$image'" >&2; exit 1; }
echo "interop: image $image ($(($(date +%s) - start)) s)"
sed -n '1,5p' "$image/manifest.txt" | sed 's/^/interop:   /'

echo "== interop: tests"
export SOFTRDMA_INTEROP_IMAGE="$image" SOFTRDMA_INTEROP_REQUIRE=1
set +e
go test -race -count=1 -timeout 25m -v ./test/interop/ "$@"
rc=$?
set -e
echo "interop: done in $(($(date +%s) - start)) s, exit status $rc"
if [ $rc -ne 0 ]; then
	echo "interop: artifacts of failed cases: ${SOFTRDMA_ARTIFACTS:-/tmp/softrdma-interop-artifacts}"
fi
exit $rc

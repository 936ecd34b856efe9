#!/usr/bin/env bash
# Builds (or reuses) the guest image of the interop suite: Debian's
# linux-image-amd64 kernel and an initramfs made from a debootstrap
# --variant=minbase root filesystem with rdma-core's tools and the kernel
# modules the guest needs. Everything comes from the Debian packages of the
# apt sources this machine is configured with; no mirror is named here.
#
# The result is cached outside the checkout, keyed by the candidate versions
# of the packages (apt-cache policy) and by this script and the guest's init:
#
#   ${SOFTRDMA_INTEROP_CACHE:-/var/cache/softrdma-interop}/<key>/
#       vmlinuz  initrd.img  manifest.txt  complete
#
# Prints the image directory on the last line of stdout (progress on stderr).
# Usage: build-image.sh [--key-only] [--rebuild]
set -euo pipefail
export LC_ALL=C DEBIAN_FRONTEND=noninteractive

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${SOFTRDMA_INTEROP_CACHE:-/var/cache/softrdma-interop}
suite=bookworm
# Packages of the guest's root filesystem (python3-pyverbs: test/interop's
# TestPyverbs runs rdma-core's own Python tests on the kernel's rxe).
guest_pkgs=(rdma-core ibverbs-providers rdmacm-utils ibverbs-utils perftest iproute2 kmod python3-pyverbs)
# Modules the guest loads (their dependencies are resolved with modprobe).
# crc32_generic: rxe allocates the "crc32" shash at device creation (a
# runtime request, not a module dependency). veth: provider/rdmacore's
# TestAsyncPortEvents adds an rxe device on a veth pair of its own (the
# kernel loads it on demand, with the guest's modprobe).
guest_mods=(virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs rdma_ucm veth)

key_only=0 rebuild=0
for a in "$@"; do
	case "$a" in
	--key-only) key_only=1 ;;
	--rebuild) rebuild=1 ;;
	*) echo "usage: $0 [--key-only] [--rebuild]" >&2; exit 2 ;;
	esac
done

log() { echo "build-image: $*" >&2; }
die() { log "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, apt-get)"

apt_updated=0
apt_update() {
	if [ $apt_updated = 0 ]; then
		apt-get update -qq >&2 || log "apt-get update failed; going on with the lists we have"
		apt_updated=1
	fi
}

# Host tools: install what is missing.
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v gzip >/dev/null || need+=(gzip)
if [ ${#need[@]} -gt 0 ]; then
	apt_update
	log "installing ${need[*]}"
	apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
kpkg=$(kernel_pkg)
if [ -z "$kpkg" ]; then
	apt_update
	kpkg=$(kernel_pkg)
fi
[ -n "$kpkg" ] || die "apt knows no linux-image-amd64 (are Debian's apt sources configured?)"

# The candidate versions of everything that goes into the image (one
# apt-cache call: "package version" lines).
candidates() {
	echo "suite $suite"
	apt-cache policy linux-image-amd64 "$kpkg" "${guest_pkgs[@]}" libc6 coreutils 2>/dev/null |
		awk '/^[^ ]/ {sub(":$", "", $1); p = $1} /Candidate:/ {print p, $2}'
}
versions=$(candidates)
if [ "$(echo "$versions" | grep -c -v ' (none)$')" -ne $((${#guest_pkgs[@]} + 5)) ]; then
	apt_update
	versions=$(candidates)
fi
echo "$versions" | grep -q ' (none)$' && die "no candidate for: $(echo "$versions" | awk '$2 == "(none)" {print $1}' | xargs)"
kver_deb=$(echo "$versions" | awk -v p="$kpkg" '$1 == p {print $2}')
# The key: those versions plus the code that builds the image.
key=$(
	{
		echo "$versions"
		echo "mods ${guest_mods[*]}"
		sha256sum "$here/build-image.sh" "$here/guest/init" | awk '{print $1}'
	} | sha256sum | cut -c1-16
)
key="$suite-$(echo "$kver_deb" | tr -c 'A-Za-z0-9.\n' '_')-$key"
out="$cache_root/$key"
if [ $key_only = 1 ]; then
	echo "$out"
	exit 0
fi

if [ $rebuild = 0 ] && [ -e "$out/complete" ]; then
	log "cached image $out"
	echo "$out"
	exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
log "waiting for the cache lock"
flock 9
if [ $rebuild = 0 ] && [ -e "$out/complete" ]; then # built meanwhile
	log "cached image $out"
	echo "$out"
	exit 0
fi

start=$(date +%s)
work=$(mktemp -d "$cache_root/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
kx="$work/kernel"

# The mirror debootstrap uses: the machine's own apt source of the suite.
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(IDENTIFIER)' |
	awk -v s="$suite" '$2 == s && $3 == "main" && $4 == "Packages" {print $1; exit}')
if [ -z "$mirror" ]; then
	apt_update
	mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(IDENTIFIER)' |
		awk -v s="$suite" '$2 == s && $3 == "main" && $4 == "Packages" {print $1; exit}')
fi
[ -n "$mirror" ] || die "no apt source for $suite main on this machine"

log "kernel: $kpkg $kver_deb"
mkdir -p "$kx/deb"
(cd "$kx/deb" && apt-get download "$kpkg" >&2) || { apt_update; (cd "$kx/deb" && apt-get download "$kpkg" >&2); }
dpkg-deb -x "$kx"/deb/*.deb "$kx/x"
kver=$(ls "$kx/x/lib/modules" | head -n1)
[ -n "$kver" ] && [ -e "$kx/x/boot/vmlinuz-$kver" ] || die "no kernel in $kpkg"
depmod -b "$kx/x" "$kver"

log "debootstrap --variant=minbase $suite (${guest_pkgs[*]})"
debootstrap --variant=minbase --include="$(IFS=,; echo "${guest_pkgs[*]}")" \
	"$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
	{ tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# Versions actually installed, for the manifest.
pkgs_installed=$(chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' "${guest_pkgs[@]}" libc6 coreutils)

# Modules and their dependencies.
mods=$(for m in "${guest_mods[@]}"; do
	modprobe -d "$kx/x" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | sort -u)
[ -n "$mods" ] || die "module resolution failed"
for f in $mods; do
	rel=${f#"$kx/x/"}
	mkdir -p "$root/$(dirname "$rel")"
	cp "$f" "$root/$rel"
done
cp "$kx/x/lib/modules/$kver/modules.order" "$kx/x/lib/modules/$kver/modules.builtin"* "$root/lib/modules/$kver/" 2>/dev/null || true
depmod -b "$root" "$kver"

# Make it small: no docs, locales, apt lists and caches, udev hwdb.
rm -rf "$root"/usr/share/{doc,man,info,locale,i18n,lintian,linda,bash-completion,zoneinfo} \
	"$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old \
	"$root"/usr/lib/udev/hwdb.bin "$root"/usr/lib/udev/hwdb.d "$root"/var/log/* \
	"$root"/usr/lib/x86_64-linux-gnu/gconv "$root"/var/lib/dpkg/info/*.md5sums
install -m 0755 "$here/guest/init" "$root/init"
echo "softrdma-interop" >"$root/etc/hostname"

log "packing the initramfs"
(cd "$root" && find . -xdev -print0 | cpio --null -o -H newc --quiet | gzip -6) >"$work/initrd.img"
cp "$kx/x/boot/vmlinuz-$kver" "$work/vmlinuz"
{
	echo "key $key"
	echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - start)) s"
	echo "kernel $kver"
	echo "initramfs_bytes $(stat -c %s "$work/initrd.img")"
	echo "root_kib $(du -sk "$root" | cut -f1)"
	echo "== candidates"
	echo "$versions"
	echo "== installed"
	echo "$pkgs_installed"
	echo "== modules"
	for f in $mods; do echo "${f#"$kx/x/lib/modules/$kver/"}"; done
} >"$work/manifest.txt"

rm -rf "$out"
mkdir -p "$out"
mv "$work/vmlinuz" "$work/initrd.img" "$work/manifest.txt" "$out/"
touch "$out/complete"
# Keep only this image and the two newest others.
for d in $(ls -1dt "$cache_root"/*/ 2>/dev/null | grep -v "/$key/\$" | tail -n +3 || true); do
	rm -rf "$d"
done
log "built $out in $(($(date +%s) - start)) s ($(du -h "$out/initrd.img" | cut -f1) initramfs)"
echo "$out"

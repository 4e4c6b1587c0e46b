#!/usr/bin/env bash
# The Debian package on this machine: build it (scripts/package.sh), install
# it with dpkg -i, check what it put where, mount an image through
# `mount -t fuse.foliofs` and through an /etc/fstab line, unmount, and
# remove it with dpkg -r, leaving the machine as it was (/etc/fstab, a
# mount helper installed by setup.sh, the log directory). As root, with
# /dev/fuse; elsewhere SKIPPED unless FOLIOFS_REQUIRE_FUSE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
skip() {
  if [ "${FOLIOFS_REQUIRE_FUSE:-}" = 1 ]; then echo "package-test: $1" >&2; exit 1; fi
  echo "SKIPPED: package test: $1"; exit 0
}
[ "$(id -u)" -eq 0 ] || skip "dpkg -i and mount(8) need root"
[ -e /dev/fuse ] || skip "no /dev/fuse"
command -v dpkg-deb >/dev/null || skip "no dpkg-deb (Debian's dpkg)"
if dpkg -s foliofs >/dev/null 2>&1; then
  echo "package-test: a foliofs package is installed already: not touching it" >&2; exit 1
fi
bash scripts/package.sh
deb=$(ls -t target/debian/foliofs_*.deb | head -1)
tmp=$(mktemp -d /tmp/foliofs-pkg.XXXXXX)
img=$tmp/p.img mnt=$tmp/mnt
# The daemon's own log where there is no syslog (docs: foliofs-mount(1)).
log=/var/log/foliofs/$(printf %s "${mnt#/}" | tr / -).log
helper=/usr/sbin/mount.fuse.foliofs
# What was there before: setup.sh links the helper to /usr/local/bin.
old_helper=$(readlink "$helper" 2>/dev/null || true)
had_logdir=$([ -d /var/log/foliofs ] && echo 1 || true)
cp -p /etc/fstab "$tmp/fstab"
installed=""
cleanup() {
  mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"
  cp -p "$tmp/fstab" /etc/fstab
  [ -z "$installed" ] || dpkg -r foliofs >/dev/null
  if [ -n "$old_helper" ] && [ ! -e "$helper" ]; then ln -s "$old_helper" "$helper"; fi
  rm -f "$log" "$log.1"
  [ -n "$had_logdir" ] || rmdir /var/log/foliofs 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "package-test: $*" >&2; exit 1; }
checks=0
ok() { checks=$((checks + 1)); }

dpkg -i "$deb" >/dev/null
installed=1
for f in /usr/bin/foliofs /usr/sbin/mount.fuse.foliofs /usr/lib/modprobe.d/foliofs.conf \
  /usr/share/man/man1/foliofs.1.gz /usr/share/man/man1/foliofs-stat.1.gz \
  /usr/share/man/man1/mount.fuse.foliofs.1.gz /usr/share/bash-completion/completions/foliofs \
  /usr/share/zsh/vendor-completions/_foliofs /usr/share/fish/vendor_completions.d/foliofs.fish \
  /usr/share/doc/foliofs/README.md; do
  dpkg -S "$f" >/dev/null 2>&1 || fail "$f is not in the package"
  [ -e "$f" ] || fail "$f is not installed"
done
ok
[ "$(readlink -f "$helper")" = /usr/bin/foliofs ] || fail "$helper does not lead to /usr/bin/foliofs"
zcat /usr/share/man/man1/mount.fuse.foliofs.1.gz | grep -q 'fuse\\\?\.foliofs' || fail "the helper's page lacks the fstab type"
/usr/bin/foliofs --version | grep -q "^foliofs " || fail "the packaged binary does not run"
ok

/usr/bin/foliofs mkfs "$img" --size 64M >/dev/null
mkdir "$mnt"
# 1. mount(8) with the type: mount runs /usr/sbin/mount.fuse.foliofs.
mount -t fuse.foliofs "$img" "$mnt" -o noatime
[ "$(findmnt -n -o FSTYPE "$mnt")" = fuse.foliofs ] || fail "mount -t fuse.foliofs: not a foliofs mount"
echo through-mount-t > "$mnt/a"
/usr/bin/foliofs stat --mount "$mnt" | grep -q "^  transport" || fail "stat --mount has no transport line"
umount "$mnt"
ok
# 2. An fstab line, mounted by its mount point alone; its options reach
# the mount (ro: the kernel refuses writes).
[ -z "$(tail -c1 /etc/fstab)" ] || echo >> /etc/fstab
printf '%s %s fuse.foliofs defaults,ro 0 0\n' "$img" "$mnt" >> /etc/fstab
mount "$mnt"
[ "$(cat "$mnt/a")" = through-mount-t ] || fail "the file written through the first mount is not there"
findmnt -n -o OPTIONS "$mnt" | grep -qw ro || fail "the fstab line's ro did not reach the mount"
if (echo no > "$mnt/b") 2>/dev/null; then fail "a write to the read-only fstab mount succeeded"; fi
/usr/bin/foliofs umount "$mnt" || fail "the fstab mount did not unmount cleanly"
ok
# Without /dev/log the daemon logged to its own file; with it, to syslog.
if [ ! -S /dev/log ]; then
  grep -q "mounted $img on $mnt" "$log" || fail "no mount message in $log"
  ok
fi
cp -p "$tmp/fstab" /etc/fstab
/usr/bin/foliofs fsck "$img" >/dev/null || fail "fsck after the fstab mount"
ok
# dpkg warns that /usr/lib/modprobe.d, shared with other packages, stays.
dpkg -r foliofs >/dev/null 2>&1 || fail "dpkg -r foliofs failed"
installed=""
[ ! -e /usr/bin/foliofs ] && [ ! -e /usr/share/man/man1/foliofs.1.gz ] || fail "dpkg -r left files behind"
dpkg -s foliofs >/dev/null 2>&1 && fail "the package is still known to dpkg after dpkg -r"
ok
cmp -s /etc/fstab "$tmp/fstab" || fail "/etc/fstab changed"
echo "package test: $checks passed, 0 failed ($(basename "$deb"))"

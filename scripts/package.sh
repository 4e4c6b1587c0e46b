#!/usr/bin/env bash
# Build the Debian package target/debian/foliofs_VERSION_ARCH.deb with
# dpkg-deb: the foliofs binary, the mount.fuse.foliofs helper (a link),
# man pages and bash, zsh and fish completions made by the binary from its
# own command definitions, the modprobe.d file that turns FUSE over
# io_uring on at boot, and the docs. Needs cargo and dpkg-dev
# (dpkg-shlibdeps works out the library dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/rust.sh
cargo build --release --locked -q -p foliofs-cli
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
out=target/debian
stage=$out/foliofs_${version}_$arch
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/sbin" "$stage/usr/share/man/man1" \
  "$stage/usr/share/doc/foliofs" "$stage/usr/lib/modprobe.d"
# The release profile keeps line tables for profiling; a package need not.
objcopy --strip-debug target/release/foliofs "$stage/usr/bin/foliofs"
chmod 0755 "$stage/usr/bin/foliofs"
ln -s ../bin/foliofs "$stage/usr/sbin/mount.fuse.foliofs"
gen=$(mktemp -d); trap 'rm -rf "$gen"' EXIT
target/release/foliofs generate "$gen" >/dev/null
for page in "$gen"/man/*.1; do
  gzip -9n < "$page" > "$stage/usr/share/man/man1/$(basename "$page").gz"
done
install -D -m 0644 "$gen/completions/foliofs.bash" "$stage/usr/share/bash-completion/completions/foliofs"
install -D -m 0644 "$gen/completions/_foliofs" "$stage/usr/share/zsh/vendor-completions/_foliofs"
install -D -m 0644 "$gen/completions/foliofs.fish" "$stage/usr/share/fish/vendor_completions.d/foliofs.fish"
install -m 0644 packaging/foliofs-modprobe.conf "$stage/usr/lib/modprobe.d/foliofs.conf"
install -m 0644 README.md docs/DESIGN.md docs/FORMAT.md docs/BENCH.md docs/BENCH-RESULTS.md \
  "$stage/usr/share/doc/foliofs/"
gzip -9n "$stage"/usr/share/doc/foliofs/{DESIGN,FORMAT,BENCH-RESULTS}.md
cat > "$stage/usr/share/doc/foliofs/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: foliofs

Files: *
License: MIT or Apache-2.0
COPYRIGHT
# dpkg-shlibdeps reads debian/control from its working directory.
mkdir -p "$gen/deb/debian"
printf 'Source: foliofs\n\nPackage: foliofs\nArchitecture: any\n' > "$gen/deb/debian/control"
shlibs=$(cd "$gen/deb" && dpkg-shlibdeps -O -e "$OLDPWD/$stage/usr/bin/foliofs" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
# The maintainer is whoever made the commit being packaged.
maintainer=$(git log -1 --format='%an <%ae>' 2>/dev/null || echo "foliofs maintainers <root@localhost>")
cat > "$stage/DEBIAN/control" <<CONTROL
Package: foliofs
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: ${shlibs:-libc6}, fuse3
Suggests: fio
Section: admin
Priority: optional
Description: userspace file system engine, mounted with FUSE
 foliofs is a crash-safe POSIX file system kept in an image file or on a
 block device, with per-block data checksums, a write-ahead journal and
 large folios. This package holds the foliofs command (mkfs, fsck, stat,
 mount, umount, sync, bench), the mount.fuse.foliofs helper for mount(8)
 and /etc/fstab, man pages, shell completions, and a modprobe.d file that
 turns FUSE over io_uring on at boot.
CONTROL
deb=$out/foliofs_${version}_$arch.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "package: $deb ($(du -h "$deb" | cut -f1))"

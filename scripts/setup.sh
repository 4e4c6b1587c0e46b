#!/usr/bin/env bash
# Install what foliofs needs on Debian, build it, install it with its mount
# helper, man pages and shell completions, turn FUSE over io_uring on where
# the kernel has it, make a default image (foliofs.img, 1 GiB), check it,
# and mount it with FUSE on ./mnt.
# FOLIOFS_IMAGE, FOLIOFS_SIZE and FOLIOFS_MOUNT change the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if command -v apt-get >/dev/null; then
  $SUDO apt-get update -qq
  # fuse3: fusermount3 and /etc/fuse.conf; build-essential/pkg-config: native crates.
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential pkg-config fuse3 man-db fonts-dejavu-core curl ca-certificates >/dev/null
fi
. scripts/rust.sh
cargo build --release --locked -p foliofs-cli
# The command, and the helper that lets mount(8) and /etc/fstab use type fuse.foliofs.
$SUDO install -m 0755 target/release/foliofs /usr/local/bin/foliofs
$SUDO ln -sf /usr/local/bin/foliofs /usr/sbin/mount.fuse.foliofs
# Man pages and completions, made by the binary just built from its own
# command definitions (`foliofs generate`).
gen=$(mktemp -d); trap 'rm -rf "$gen"' EXIT
target/release/foliofs generate "$gen" >/dev/null
$SUDO install -D -m 0644 -t /usr/local/share/man/man1 "$gen"/man/*.1
$SUDO install -D -m 0644 "$gen/completions/foliofs.bash" /usr/local/share/bash-completion/completions/foliofs
$SUDO install -D -m 0644 "$gen/completions/_foliofs" /usr/local/share/zsh/site-functions/_foliofs
$SUDO install -D -m 0644 "$gen/completions/foliofs.fish" /usr/local/share/fish/vendor_completions.d/foliofs.fish
if command -v mandb >/dev/null; then $SUDO mandb -q 2>/dev/null || true; fi
echo "setup: installed foliofs, mount.fuse.foliofs, their man pages and bash, zsh and fish completions"
# The rings before the mount: a mount keeps the transport it started with.
$SUDO bash scripts/fuse-uring.sh
IMG=${FOLIOFS_IMAGE:-foliofs.img}
MNT=${FOLIOFS_MOUNT:-mnt}
if [ ! -e "$IMG" ]; then
  foliofs mkfs "$IMG" --size "${FOLIOFS_SIZE:-1G}"
fi
if mountpoint -q "$MNT" 2>/dev/null; then
  echo "setup: $MNT is already mounted"
else
  foliofs fsck "$IMG"
  mkdir -p "$MNT"
  foliofs mount "$IMG" "$MNT"
fi
df -h "$MNT"
echo "setup: foliofs is mounted on $MNT; transport: $(foliofs stat --mount "$MNT" | sed -n "s/^  transport *//p")"
echo "setup: status: foliofs stat --mount $MNT; unmount: umount $MNT (or fusermount3 -u $MNT)"

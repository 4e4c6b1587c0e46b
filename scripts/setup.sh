#!/usr/bin/env bash
# Install what foliofs needs on Debian, build it, and make a default image:
# foliofs.img (1 GiB), then check it with fsck and show it with stat.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if command -v apt-get >/dev/null; then
  $SUDO apt-get update -qq
  # fuse3: for the FUSE mount; build-essential/pkg-config: for native crates.
  $SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential pkg-config fuse3 >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found: install Rust 1.85 or newer (rustup) and run again" >&2
  exit 1
fi
cargo build --release --locked -p foliofs-cli
IMG=${FOLIOFS_IMAGE:-foliofs.img}
if [ ! -e "$IMG" ]; then
  ./target/release/foliofs mkfs "$IMG" --size "${FOLIOFS_SIZE:-1G}"
fi
./target/release/foliofs fsck "$IMG"
./target/release/foliofs stat "$IMG"

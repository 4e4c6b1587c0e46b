#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/model/crash/direct I/O tests,
# FUSE tests with real programs (fio, tar, git, sqlite3, cp -a, PostgreSQL,
# pjdfstest over an image file and over an object image, stress-ng) over both
# FUSE transports (io_uring rings where the kernel has them, /dev/fuse), the
# Debian package installed and mounted, an image in a real S3 server
# (SeaweedFS), CLI smoke.
# FUSE tests skip without /dev/fuse or root unless FOLIOFS_REQUIRE_FUSE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS="build-essential pkg-config fuse3 fio git sqlite3 attr acl libacl1-dev diffutils tar jq dpkg-dev fonts-dejavu-core curl ca-certificates postgresql stress-ng python3 python3-venv e2fsprogs"
if command -v apt-get >/dev/null && ! dpkg -s $PKGS >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PKGS >/dev/null
fi
. scripts/rust.sh
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --locked --all-targets -- -D warnings
echo "== vendor/fuser against the published fuser 0.18.0 (vendor/fuser/FOLIOFS.md names every change)"
scripts/vendor-check.sh
echo "== fuzz targets compile (their saved inputs replay in cargo test, tests/fuzz_seeds.rs; fuzz with cargo +nightly fuzz, see docs/RELIABILITY.md)"
cargo check --locked --manifest-path fuzz/Cargo.toml -q
echo "== FUSE over io_uring: turned on where the kernel has it"
uring=/sys/module/fuse/parameters/enable_uring
if [ -w "$uring" ]; then
  echo Y > "$uring"
  echo "fuse.enable_uring=Y: the FUSE tests run over rings, then again over /dev/fuse"
elif [ -e "$uring" ]; then
  echo "fuse.enable_uring is $(cat "$uring") and not writable here: the FUSE tests run over /dev/fuse"
else
  echo "this kernel has no FUSE over io_uring: the FUSE tests run over /dev/fuse"
fi
limit=/proc/sys/fs/fuse/max_pages_limit
if [ -w "$limit" ] && [ "$(cat "$limit")" -lt 257 ]; then
  echo 257 > "$limit"
  echo "fs.fuse.max_pages_limit=257: a 1 MiB write from an unaligned buffer is one request"
fi
echo "== cargo test"
cargo test --locked --release
if [ "$(cat "$uring" 2>/dev/null)" = Y ]; then
  echo "== FUSE tests over /dev/fuse (io_uring=off)"
  FOLIOFS_FUSE_OPTS=io_uring=off cargo test --locked --release -p foliofs-cli --test fuse
fi
echo "== concurrency and crash tests with debug assertions"
cargo test --locked -q -p foliofs --test threads_and_faults --test buffered --test crash
echo "== pjdfstest (POSIX suite) through a FUSE mount, as root and its dummy users"
if [ -e /dev/fuse ] && [ "$(id -u)" -eq 0 ]; then
  cargo build --locked --release -p foliofs-cli -q
  bash scripts/pjdfstest.sh
elif [ "${FOLIOFS_REQUIRE_FUSE:-}" = 1 ]; then
  echo "pjdfstest: FOLIOFS_REQUIRE_FUSE=1 but /dev/fuse or root is missing" >&2; exit 1
else
  echo "SKIPPED: pjdfstest needs /dev/fuse and root"
fi
echo "== corruption campaign: fsck --repair beside e2fsck -fy on the same damage, 60 seeds (about 2 minutes)"
if [ -e /dev/fuse ] && [ "$(id -u)" -eq 0 ] && command -v mkfs.ext4 >/dev/null; then
  cargo build --locked --release -p foliofs-cli -q
  bash scripts/corruption-campaign.sh target/release/foliofs 60
elif [ "${FOLIOFS_REQUIRE_FUSE:-}" = 1 ]; then
  echo "corruption campaign: FOLIOFS_REQUIRE_FUSE=1 but /dev/fuse, root or mkfs.ext4 is missing" >&2; exit 1
else
  echo "SKIPPED: the corruption campaign needs /dev/fuse, root and e2fsprogs"
fi
echo "== stress-ng's file system stressors through a FUSE mount, as root and as nobody"
if [ -e /dev/fuse ] && [ "$(id -u)" -eq 0 ]; then
  bash scripts/stress-ng.sh target/release/foliofs 30
elif [ "${FOLIOFS_REQUIRE_FUSE:-}" = 1 ]; then
  echo "stress-ng: FOLIOFS_REQUIRE_FUSE=1 but /dev/fuse or root is missing" >&2; exit 1
else
  echo "SKIPPED: stress-ng needs /dev/fuse and root"
fi
echo "== real programs run the disk full, foliofs beside ext4, and through a failing device (scripts/full-disk.py)"
if [ -e /dev/fuse ] && [ "$(id -u)" -eq 0 ]; then
  python3 scripts/full-disk.py target/release/foliofs --free 24 --faults
elif [ "${FOLIOFS_REQUIRE_FUSE:-}" = 1 ]; then
  echo "full-disk: FOLIOFS_REQUIRE_FUSE=1 but /dev/fuse or root is missing" >&2; exit 1
else
  echo "SKIPPED: full-disk needs /dev/fuse and root"
fi
echo "== an image in a real S3 server (SeaweedFS from PyPI) through the mount: kill -9, takeover, fencing, the server restarted"
python3 scripts/object-s3.py target/release/foliofs
echo "== pjdfstest (POSIX suite) through a mount of an object image in SeaweedFS"
python3 scripts/object-s3.py target/release/foliofs --pjdfstest
echo "== the Debian package: dpkg -i, mount -t fuse.foliofs, an fstab line, dpkg -r"
bash scripts/package-test.sh
echo "== CLI smoke"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bin=./target/release/foliofs
cargo build --locked --release -p foliofs-cli -q
$bin mkfs "$tmp/t.img" --size 64M --json >/dev/null
$bin fsck "$tmp/t.img" --data
$bin stat "$tmp/t.img" --json >/dev/null
if $bin mkfs "$tmp/t.img" --size 32M 2>/dev/null; then echo "mkfs over an existing file system must refuse" >&2; exit 1; fi
[ "$(stat -c %s "$tmp/t.img")" -eq $((64 << 20)) ] || { echo "a refused mkfs must leave the image as it was" >&2; exit 1; }
$bin fsck "$tmp/t.img" >/dev/null
if $bin fsck "$tmp/missing.img" 2>/dev/null; then echo "fsck of a missing image must fail" >&2; exit 1; fi
echo "CLI smoke: 7 passed, 0 failed"
echo "== C ABI from C (crates/foliofs-capi/tests/abi.c: the header against libfoliofs.a)"
cargo build --locked --release -q -p foliofs-capi
cc -O1 -Wall -Werror -I crates/foliofs-capi/include crates/foliofs-capi/tests/abi.c \
  target/release/libfoliofs.a -lpthread -ldl -lm -o "$tmp/abi"
"$tmp/abi" "$tmp/abi.img"
echo "== fio external engine (seed W1, W2 jobs with verify=crc32c)"
make -s -C bench/fio check

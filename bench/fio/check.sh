#!/usr/bin/env bash
# The seed W1 and W2 jobs on the fio engine over foliofs, with
# verify=crc32c, then fsck of the image. FIO_ENGINE: the engine's .so.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
engine=${FIO_ENGINE:?set FIO_ENGINE to foliofs-fio.so}
work=$(mktemp -d /var/tmp/foliofs-fio.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
cargo build --locked --release -q -p foliofs-cli --manifest-path "$root/Cargo.toml"
bin="$root/target/release/foliofs"
export FOLIOFS_FIO_IMAGE="$work/fio.img" FOLIOFS_FIO_MKFS=1G RUNTIME=${RUNTIME:-120}
# The job files unmodified but for the ioengine line (and smaller sizes).
job() {
  sed -e "s|^\([[:space:]]*\)ioengine=.*|\1ioengine=external:$engine|" \
      -e "s|^\([[:space:]]*\)size=.*|\1size=$2|" -e "/time_based/d" "$here/$1.fio" > "$work/$1.fio"
  echo "$work/$1.fio"
}
# fio writes its verify state files into the working directory.
cd "$work"
status=0
for w in W1 W2; do
  size=8M; [ "$w" = W2 ] && size=128M
  out="$work/$w.json"
  # verify=crc32c: fio checks every block it wrote; W2 writes its file in
  # a first pass that verifies too.
  if [ "$w" = W2 ]; then
    fio --thread --output-format=json --output="$work/$w-write.json" \
      --name=w2-write --ioengine="external:$engine" --rw=write --bs=1M --direct=1 \
      --size=$size --filename=dio-read.0.0 --verify=crc32c --do_verify=1 >/dev/null
  fi
  fio --thread --output-format=json --output="$out" --verify=crc32c \
    "$(job $w $size)" >/dev/null || status=1
  # fio puts the engine's messages before the JSON.
  sed -n '/^{/,$p' "$out" > "$out.clean"
  errs=$(jq '[.jobs[].error] | add' "$out.clean")
  wbw=$(jq '[.jobs[] | .write.bw_bytes] | add / 1048576' "$out.clean")
  rbw=$(jq '[.jobs[] | .read.bw_bytes] | add / 1048576' "$out.clean")
  verified=$(jq '[.jobs[] | .read.io_bytes] | add / 1048576' "$out.clean")
  echo "fio $w on foliofs: writes $(printf %.1f "$wbw") MiB/s, reads $(printf %.0f "$rbw") MiB/s, $(printf %.0f "$verified") MiB read back and verified, errors $errs"
  [ "$errs" = 0 ] || status=1
done
"$bin" fsck "$FOLIOFS_FIO_IMAGE" --data || status=1
exit $status

#!/usr/bin/env bash
# The corruption campaign against the reference: the same content (this
# repository's crates/ and docs/ and a 20 MiB file) in a foliofs image and
# an ext4 image of the same size, the same damage by seed to both (80
# single-byte flips, 40 among the first 2,048 blocks where metadata lives
# and 40 anywhere; every third seed also zeroes 4 of those blocks, and
# every third other one tears a 512-byte sector of 4), then
# `foliofs fsck --repair` and `e2fsck -fy`, a second check of each, a mount
# of each, and every file read back against its checksum. Prints both
# side by side; fails if a foliofs image is left unclean or unmountable,
# or a foliofs file reads back bytes it was not given.
# Usage: scripts/corruption-campaign.sh [FOLIOFS_BINARY [SEEDS [SIZE_MIB]]]
# Needs root (loop mounts) and /dev/fuse. FOLIOFS_CAMPAIGN_TMP picks where
# the images go (default /var/tmp/foliofs-campaign, a suffix added).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/foliofs}")
seeds=${2:-20}
size_mib=${3:-128}
tmp=$(mktemp -d "${FOLIOFS_CAMPAIGN_TMP:-/var/tmp/foliofs-campaign}.XXXXXX")
cleanup() {
  umount -l "$tmp/mnt" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir "$tmp/mnt" "$tmp/src"
cp -a crates docs "$tmp/src/"
rm -rf "$tmp/src/crates/"*/target
python3 -c 'import random; random.seed(48); open("'"$tmp/src/big"'", "wb").write(random.randbytes(20 << 20))'
nfiles=$(find "$tmp/src" -type f | wc -l)

# The helper: `damage IMAGE SEED` applies the seed's damage; `read SRC
# ROOT` reads every file of SRC under ROOT and prints "kept lost eio cut
# wrong".
cat > "$tmp/helper.py" <<'PY'
import errno, os, random, sys

BS = 4096

def damage(image, seed):
    rng = random.Random(seed)
    with open(image, "r+b") as f:
        blocks = os.fstat(f.fileno()).st_size // BS
        meta = [rng.randrange(min(2048, blocks)) for _ in range(40)]
        anywhere = [rng.randrange(blocks) for _ in range(40)]
        for b in meta + anywhere:
            off = rng.randrange(BS)
            f.seek(b * BS + off)
            byte = f.read(1)[0]
            f.seek(b * BS + off)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        if seed % 3 == 1:
            for b in meta[:4]:
                f.seek(b * BS)
                f.write(bytes(BS))
        elif seed % 3 == 2:
            for b in meta[:4]:
                f.seek(b * BS + 512 * rng.randrange(BS // 512))
                f.write(bytes(512))

def read(src, root):
    kept = lost = eio = cut = wrong = 0
    for dirpath, _, names in os.walk(src):
        for n in names:
            name = os.path.relpath(os.path.join(dirpath, n), src)
            want = open(os.path.join(src, name), "rb").read()
            status = read_one(os.path.join(root, name), want)
            if status == "kept":
                kept += 1
            elif status == "lost":
                lost += 1
            elif status == "eio":
                eio += 1
            elif status == "cut":
                cut += 1
            else:
                wrong += 1
    print(kept, lost, eio, cut, wrong)

def read_one(path, want):
    """kept, lost, eio, cut (a prefix of what it was given: a repair
    that cut its map) or wrong."""
    try:
        with open(path, "rb") as f:
            # No more than one byte past what it was given: a repair may
            # leave a size of terabytes over holes (e2fsck has), and that
            # is wrong without reading it all.
            got = f.read(len(want) + 1)
    except FileNotFoundError:
        return "lost"
    except OSError as e:
        return "eio" if e.errno == errno.EIO else "lost"
    if got == want:
        return "kept"
    if len(got) < len(want) and want.startswith(got):
        return "cut"
    return "wrong"


if sys.argv[1] == "damage":
    damage(sys.argv[2], int(sys.argv[3]))
else:
    read(sys.argv[2], sys.argv[3])
PY

echo "== building the images ($size_mib MiB, $nfiles files)"
"$bin" mkfs "$tmp/base.folio" --size "${size_mib}M" >/dev/null
"$bin" mount "$tmp/base.folio" "$tmp/mnt" -o "log=$tmp/daemon.log"
cp -a "$tmp/src/." "$tmp/mnt/"
"$bin" umount "$tmp/mnt"
truncate -s "${size_mib}M" "$tmp/base.ext4"
mkfs.ext4 -q -F -b 4096 "$tmp/base.ext4"
mount -o loop "$tmp/base.ext4" "$tmp/mnt"
cp -a "$tmp/src/." "$tmp/mnt/"
umount "$tmp/mnt"

# Totals per file system: images clean after the repair, images that
# mounted, files kept, lost (no longer at their path), EIO, cut short,
# and read back with other bytes than they were given; data blocks
# flagged.
declare -A total
for k in clean mounted kept lost eio cut wrong flagged; do total[f_$k]=0; total[e_$k]=0; done
unclean=()
for seed in $(seq 1 "$seeds"); do
  cp "$tmp/base.folio" "$tmp/t.folio"
  cp "$tmp/base.ext4" "$tmp/t.ext4"
  python3 "$tmp/helper.py" damage "$tmp/t.folio" "$seed"
  python3 "$tmp/helper.py" damage "$tmp/t.ext4" "$seed"

  rc=0; "$bin" fsck --repair "$tmp/t.folio" > "$tmp/repair.out" 2>&1 || rc=$?
  if "$bin" fsck "$tmp/t.folio" > "$tmp/check.out" 2>&1; then
    total[f_clean]=$((total[f_clean] + 1))
  else
    unclean+=("$seed")
    echo "seed $seed: foliofs left unclean after fsck --repair (exit $rc):" >&2
    tail -5 "$tmp/check.out" >&2
  fi
  flagged=$("$bin" fsck --data "$tmp/t.folio" 2>/dev/null | grep -c "data checksum mismatch" || true)
  total[f_flagged]=$((total[f_flagged] + flagged))
  if "$bin" mount "$tmp/t.folio" "$tmp/mnt" -o "ro,log=$tmp/daemon.log" 2>>"$tmp/mount.err"; then
    total[f_mounted]=$((total[f_mounted] + 1))
    read -r kept lost eio cut wrong < <(python3 "$tmp/helper.py" read "$tmp/src" "$tmp/mnt")
    "$bin" umount "$tmp/mnt" >/dev/null
  else
    kept=0; lost=$nfiles; eio=0; cut=0; wrong=0
  fi
  for k in kept lost eio cut wrong; do total[f_$k]=$((total[f_$k] + ${!k})); done
  f_line="exit $rc, $kept kept, $lost lost, $eio EIO, $cut cut, $wrong wrong, $flagged flagged"

  rc=0; e2fsck -fy "$tmp/t.ext4" > /dev/null 2>&1 || rc=$?
  if e2fsck -fn "$tmp/t.ext4" > /dev/null 2>&1; then
    total[e_clean]=$((total[e_clean] + 1))
  fi
  if mount -o loop,ro "$tmp/t.ext4" "$tmp/mnt" 2>/dev/null; then
    total[e_mounted]=$((total[e_mounted] + 1))
    read -r kept lost eio cut wrong < <(python3 "$tmp/helper.py" read "$tmp/src" "$tmp/mnt")
    umount "$tmp/mnt"
  else
    kept=0; lost=$nfiles; eio=0; cut=0; wrong=0
  fi
  for k in kept lost eio cut wrong; do total[e_$k]=$((total[e_$k] + ${!k})); done
  echo "seed $seed: foliofs $f_line | ext4 e2fsck exit $rc, $kept kept, $lost lost, $eio EIO, $cut cut, $wrong wrong"
done

row() { printf '%-38s %10s %10s\n' "$1" "$2" "$3"; }
echo
echo "== $seeds seeds, $nfiles files each, ${size_mib} MiB images"
row "" "foliofs" "ext4"
row "images clean after the repair" "${total[f_clean]}/$seeds" "${total[e_clean]}/$seeds"
row "images that mount after it" "${total[f_mounted]}/$seeds" "${total[e_mounted]}/$seeds"
row "files kept (read back whole)" "${total[f_kept]}" "${total[e_kept]}"
row "files lost (not at their path)" "${total[f_lost]}" "${total[e_lost]}"
row "files failing with EIO" "${total[f_eio]}" "${total[e_eio]}"
row "files cut short (a prefix of theirs)" "${total[f_cut]}" "${total[e_cut]}"
row "files read back with wrong bytes" "${total[f_wrong]}" "${total[e_wrong]}"
row "data blocks flagged by checksum" "${total[f_flagged]}" "n/a"
status=0
if [ "${#unclean[@]}" -gt 0 ]; then
  echo "foliofs images left unclean after repair: seeds ${unclean[*]}" >&2
  status=1
fi
if [ "${total[f_mounted]}" -ne "$seeds" ]; then
  echo "foliofs images that did not mount after repair (see $tmp/mount.err)" >&2
  cat "$tmp/mount.err" >&2 || true
  status=1
fi
if [ "${total[f_wrong]}" -ne 0 ]; then
  echo "foliofs files read back with bytes they were not given" >&2
  status=1
fi
exit "$status"

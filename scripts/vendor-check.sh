#!/usr/bin/env bash
# vendor/fuser against fuser 0.18.0 as published on crates.io: every
# vendored file that differs from the published crate's (or that the crate
# does not have) must be named under "## Files changed" in
# vendor/fuser/FOLIOFS.md, and every file named there must differ. The
# crate comes from cargo's registry cache when it is there, otherwise from
# crates.io, and is checked against its published SHA-256 either way.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.18.0
# The crates.io index's `cksum` for fuser 0.18.0.
SHA256=b82b6597d216503555ead6b358f341ef748869bf5c6fbae6a0cb9dd231baecfd
VENDOR=vendor/fuser
LEDGER=$VENDOR/FOLIOFS.md

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
crate=""
for c in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/fuser-$VERSION.crate; do
  [ -f "$c" ] && crate=$c && break
done
if [ -z "$crate" ]; then
  crate=$work/fuser-$VERSION.crate
  curl -fsSL --retry 3 --max-time 120 -o "$crate" \
    "https://static.crates.io/crates/fuser/fuser-$VERSION.crate"
fi
echo "$SHA256  $crate" | sha256sum -c --quiet -
tar -xzf "$crate" -C "$work"
upstream=$work/fuser-$VERSION

# The paths the ledger names: "- `PATH`: ..." lines of its section.
listed=$(sed -n '/^## Files changed/,/^## [^F]/p' "$LEDGER" |
  sed -n 's/^- `\([^`]*\)`.*/\1/p' | sort -u)
# The vendored files that are not upstream's byte for byte.
differ=$(cd "$VENDOR" && find . -type f ! -path ./FOLIOFS.md | sed 's|^\./||' | sort |
  while read -r f; do cmp -s "$f" "$upstream/$f" || echo "$f"; done)

fail=0
for f in $differ; do
  if ! grep -qxF "$f" <<<"$listed"; then
    echo "vendor-check: $VENDOR/$f differs from fuser $VERSION but $LEDGER does not name it" >&2
    fail=1
  fi
done
for f in $listed; do
  if ! grep -qxF "$f" <<<"$differ"; then
    echo "vendor-check: $LEDGER names $f, which is upstream's unchanged (or not vendored)" >&2
    fail=1
  fi
done
[ "$fail" = 0 ] || exit 1
echo "vendor/fuser: $(wc -w <<<"$differ") files changed against fuser $VERSION, each named in FOLIOFS.md"

# Sourced by setup.sh and test.sh: make cargo available. When it is
# missing, install Rust with rustup as its installer documents
# (https://rustup.rs), for this user, and put it on PATH.
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  echo "rust: cargo not found: installing Rust with rustup (https://rustup.rs)" >&2
  command -v curl >/dev/null || $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl ca-certificates >/dev/null
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

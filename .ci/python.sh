#!/usr/bin/env bash
# The Python package (python/): lints its crate, builds its wheel with maturin, installs
# the wheel in a fresh virtual environment (Debian's Python refuses installs outside one,
# PEP 668) with numpy and pytest, and runs its tests: real jobs started by quiver run and
# mpirun, so target/release/quiver must be built (`cargo test --workspace --release` does;
# otherwise this script builds it). Called by .ci/run; runs alone too (as root on a fresh
# Debian 12 machine it installs python3-venv). About 3 minutes on 2 cores, mostly the
# build of the extension.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    . "$HOME/.cargo/env"
fi
# Debian keeps `venv`'s pip bootstrap (ensurepip) in python3-venv.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo ".ci/python.sh: installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q python3-venv >/dev/null
fi

# The crate is outside the workspace (docs/DESIGN-NOTES.md, "Python bindings"): its own
# lints, as .ci/run's clippy does for the workspace.
export CARGO_TARGET_DIR="$repo/target/python"
cargo clippy --manifest-path python/Cargo.toml --all-targets --release -- -D warnings

venv="$repo/target/python/venv"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check maturin numpy pytest mypy

wheels="$repo/target/python/wheels"
rm -rf "$wheels"
"$venv/bin/maturin" build --release --manifest-path python/Cargo.toml \
    --interpreter "$venv/bin/python" --out "$wheels"
"$venv/bin/pip" install -q --disable-pip-version-check "$wheels"/quiver_comm-*.whl

[ -x target/release/quiver ] || CARGO_TARGET_DIR="$repo/target" cargo build --release -p quiver-cli
# From outside python/, so that `import quiver` finds the installed wheel, not the
# sources (which lack the compiled module).
cd "$repo/target"
QUIVER_BIN="$repo/target/release/quiver" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$repo/python/tests"

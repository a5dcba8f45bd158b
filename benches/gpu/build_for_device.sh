#!/usr/bin/env bash
# Builds the release `dayone` binary and the CUDA-capable test binaries here, and copies them into
# .bin/ (git-ignored) for the GPU machine, which has no Rust toolchain: pass carry: [".bin"].
# Binaries are stripped and gzipped (a call carries at most 64 MiB); run_h200.sh unpacks them.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .bin
rm -f .bin/*
cargo build --release --bin dayone
cp target/release/dayone .bin/dayone
cargo build --release -p dayone-benches --bins
cp target/release/moe-bench target/release/op-bench target/release/dsa-bench target/release/serve-scenarios target/release/vision-bench .bin/
# Test binaries of the packages in $PACKAGES (default: the cross-backend tests and the CUDA crate).
pkgs=""
for p in ${PACKAGES:-dayone-tests dayone-cuda}; do pkgs="$pkgs -p $p"; done
cargo test --release --no-run $pkgs --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        pkg = m["package_id"].split("#")[0].split("/")[-1]
        shutil.copy(m["executable"], ".bin/test-" + pkg + "-" + name)
        print("copied", pkg, name)
'
strip .bin/* 2>/dev/null || true
gzip -9 -f .bin/*
ls -la .bin; du -sh .bin

#!/usr/bin/env bash
# Builds the release `dayone` binary and the CUDA-capable test binaries here, and copies them into
# .bin/ (git-ignored) for the GPU machine, which has no Rust toolchain: pass carry: [".bin"].
# Binaries are stripped and compressed (xz where present, else gzip: a call carries at most
# 64 MiB); device_env.sh unpacks them. BENCH_BINS names the bench binaries to copy (default: all
# five), TESTS the test targets (default: every test of $PACKAGES), e.g. for run_s10.sh:
#   TESTS="decode_graphs golden golden_kimi cuda_conformance" BENCH_BINS=moe-bench \
#     bash benches/gpu/build_for_device.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .bin
rm -f .bin/*
cargo build --release --bin dayone
cp target/release/dayone .bin/dayone
cargo build --release -p dayone-benches --bins
for b in ${BENCH_BINS:-moe-bench op-bench dsa-bench serve-scenarios vision-bench}; do
  cp "target/release/$b" .bin/
done
# Test binaries of the packages in $PACKAGES (default: the cross-backend tests and the CUDA crate).
pkgs=""
for p in ${PACKAGES:-dayone-tests dayone-cuda}; do pkgs="$pkgs -p $p"; done
cargo test --release --no-run $pkgs --message-format=json 2>/dev/null \
  | TESTS="${TESTS:-}" python3 -c '
import json, os, sys, shutil
wanted = os.environ["TESTS"].split()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        if wanted and name not in wanted:
            continue
        pkg = m["package_id"].split("#")[0].split("/")[-1]
        shutil.copy(m["executable"], ".bin/test-" + pkg + "-" + name)
        print("copied", pkg, name)
'
strip .bin/* 2>/dev/null || true
if command -v xz >/dev/null; then xz -9e -T2 -f .bin/*; else gzip -9 -f .bin/*; fi
ls -la .bin; du -sh .bin

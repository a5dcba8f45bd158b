#!/usr/bin/env bash
# Builds the release `dayone` binary and the CUDA-capable test binaries here, and copies them into
# .bin/ (git-ignored) for the GPU machine, which has no Rust toolchain: pass carry: [".bin"].
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .bin
rm -f .bin/test-*
cargo build --release --bin dayone
cp target/release/dayone .bin/dayone
cargo test --release --no-run -p dayone-tests -p dayone-cuda --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        shutil.copy(m["executable"], f".bin/test-{m[\"package_id\"].split(\"#\")[0].split(\"/\")[-1]}-{name}")
        print("copied", name)
'
ls -la .bin

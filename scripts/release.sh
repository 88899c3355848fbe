#!/usr/bin/env bash
# The release artifacts of the checked-out commit, under OUT (default dist/): the wheels
# (kvrank, which carries the operator, and the example plugin kvrank-sasrec), the operator's
# chart package, and SHA256SUMS. Built from `git archive` of the commit (never from the
# working tree or a stale build/ folder), with every file time set to the commit's time and
# the chart archive's entries in a fixed order: two builds of one commit are byte-identical.
#
# With RELEASE_IMAGES (the file `make push-images` wrote: each pushed image's digest), the
# chart's values are pinned to those images at IMAGE_TAG (default: the version in
# pyproject.toml), and the file is in the release as images.txt.
#
# Needs PY (a Python with pip, setuptools and wheel and PyYAML) and HELM (a helm binary);
# `make release` gives both.
set -euo pipefail

out=${1:-dist}
py=${PY:?PY: a Python with pip, setuptools and wheel}
helm=${HELM:?HELM: a helm binary}
commit=$(git rev-parse HEAD)
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct "$commit")
export SOURCE_DATE_EPOCH

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/chart" "$work/unpacked"
git archive "$commit" | tar -x -C "$work/src"
images=""
if [[ -n "${RELEASE_IMAGES:-}" ]]; then
  images="$work/images.txt"  # read now: it may lie in the output folder, emptied below
  sort "$RELEASE_IMAGES" > "$images"
  tag=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$work/src/pyproject.toml")}
  "$py" "$work/src/scripts/pin_images.py" "$work/src/charts/kvrank-operator/values.yaml" \
    "$images" "$tag"
fi

rm -rf "$out"
mkdir -p "$out"
"$py" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out" \
  "$work/src" "$work/src/examples/sasrec"

HELM_CACHE_HOME="$work/helm-cache" "$helm" package "$work/src/charts/kvrank-operator" \
  --destination "$work/chart" >/dev/null
archive=$(cd "$work/chart" && ls -- *.tgz)
tar -xzmf "$work/chart/$archive" -C "$work/unpacked"
# helm stamps each entry with the packaging time: re-pack in name order with the commit's
(cd "$work/unpacked" && tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 \
  --numeric-owner --format=gnu -c -- *) | gzip -n -9 > "$out/$archive"

[[ -z "$images" ]] || cp "$images" "$out/images.txt"
(cd "$out" && sha256sum -- * > SHA256SUMS)
echo "release of ${commit:0:12} in $out:"
cat "$out/SHA256SUMS"

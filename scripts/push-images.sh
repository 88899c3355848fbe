#!/usr/bin/env bash
# Pushes images `make images` built (REGISTRY/NAME:TAG, or REGISTRY/NAME:OWN given as NAME:OWN) and writes, to FILE, the digest each
# push got: one line `NAME REGISTRY/NAME@sha256:…` per image, what `make release` pins the
# chart to (RELEASE_IMAGES=FILE). Pushing needs a login to the registry (`docker login`).
#   push-images.sh REGISTRY TAG FILE NAME...
set -euo pipefail
registry="$1" tag="$2" file="$3"
shift 3
(($#)) || { echo "push-images: no image names given" >&2; exit 2; }
mkdir -p "$(dirname "$file")"
pushed=$(mktemp)
trap 'rm -f "$pushed"' EXIT
for image in "$@"; do
  # NAME is pushed as NAME:TAG; NAME:OWN (a model image, tagged by model version) as it is
  case "$image" in *:*) ref="$registry/$image" name="${image%%:*}" ;; *) ref="$registry/$image:$tag" name="$image" ;; esac
  docker image inspect "$ref" >/dev/null 2>&1 ||
    { echo "push-images: no local image $ref (make images REGISTRY=$registry builds it)" >&2; exit 1; }
  echo "pushing $ref" >&2
  docker push "$ref" >/dev/null
  # the engine records the digest the registry answered for the pushed manifest
  digest=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$ref" |
    grep -m1 -F "$registry/$name@sha256:") ||
    { echo "push-images: the engine recorded no digest of $registry/$name after its push" >&2; exit 1; }
  echo "$image $digest" >> "$pushed"
done
mv "$pushed" "$file"
trap - EXIT
cat "$file"

# Sourced by the *-crds.sh scripts: module_crds NAME MODULE@VERSION PATH... copies the files
# at PATH (globs, relative to the module's root) out of a Go module, fetched through the Go
# module proxy (this network reaches no GitHub download), into a cached directory named
# NAME once, and prints that directory.
module_crds() {
  local name=$1 module=$2 cache
  shift 2
  cache="${KVRANK_CACHE:-$HOME/.cache/kvrank}/$name"
  if [ ! -d "$cache" ]; then
    local work dir path
    work=$(mktemp -d)
    GOMODCACHE="$work/mod" GOFLAGS=-mod=mod go mod download -json "$module" > "$work/module.json"
    dir=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["Dir"])' "$work/module.json")
    mkdir -p "$cache.partial"
    for path in "$@"; do
      # shellcheck disable=SC2086  # the glob is meant to expand
      cp $dir/$path "$cache.partial/"
    done
    chmod -R u+w "$work"
    rm -rf "$work"
    mv "$cache.partial" "$cache"
  fi
  echo "$cache"
}

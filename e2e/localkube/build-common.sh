# Sourced by build.sh and build-node.sh after they set BINARIES, BIN and LOG_TAG: timed log
# lines on stderr, and an early exit that prints $BIN when every binary is already there.
START=$SECONDS
log() { printf '[%s +%4ds] %s\n' "$LOG_TAG" "$((SECONDS - START))" "$*" >&2; }

have_all() {
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
}

if have_all; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

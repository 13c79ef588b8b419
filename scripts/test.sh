#!/usr/bin/env bash
# The test command of README.md: starts one Firestore + Pub/Sub emulator pair for the whole run
# (unless FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST already name running ones), then runs
# every test with the race detector. Extra arguments go to `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

if [ -z "${FIRESTORE_EMULATOR_HOST:-}" ] || [ -z "${PUBSUB_EMULATOR_HOST:-}" ]; then
  emu=$(mktemp -d)
  trap 'scripts/emulators.sh stop "$emu"' EXIT
  eval "$(scripts/emulators.sh start "$emu")"
  export FIRESTORE_EMULATOR_HOST PUBSUB_EMULATOR_HOST
fi
echo "emulators: firestore=$FIRESTORE_EMULATOR_HOST pubsub=$PUBSUB_EMULATOR_HOST"
go test -race -timeout 25m "$@" ./...

#!/usr/bin/env bash
# Starts the official Firestore and Pub/Sub emulators on free loopback ports, each JVM in its own
# process group, waits until both are ready, and prints `export` lines for their hosts.
# Usage: eval "$(scripts/emulators.sh start DIR)"; ...; scripts/emulators.sh stop DIR
set -euo pipefail

cmd=${1:?usage: emulators.sh start|stop DIR}
dir=${2:?usage: emulators.sh start|stop DIR}

stop() {
  for f in "$dir"/*.pgid; do
    [ -e "$f" ] || continue
    kill -KILL -- "-$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_ready() { # log marker name
  for _ in $(seq 1 240); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "$3 emulator did not start; its log:" >&2
  cat "$1" >&2
  stop
  exit 1
}

case "$cmd" in
stop) stop ;;
start)
  mkdir -p "$dir"
  command -v java >/dev/null || { echo "java not found: install a JDK 17 (Debian: openjdk-17-jre-headless)" >&2; exit 1; }
  root=${CLOUDSDK_ROOT:-$(gcloud info --format='value(installation.sdk_root)' 2>/dev/null || true)}
  root=${root:-/usr/lib/google-cloud-sdk}
  jar=$root/platform/cloud-firestore-emulator/cloud-firestore-emulator.jar
  ps=$root/platform/pubsub-emulator/bin/cloud-pubsub-emulator
  [ -f "$jar" ] || { echo "Firestore emulator not found at $jar: install google-cloud-cli-firestore-emulator" >&2; exit 1; }
  [ -x "$ps" ] || { echo "Pub/Sub emulator not found at $ps: install google-cloud-cli-pubsub-emulator" >&2; exit 1; }
  fport=$(free_port)
  pport=$(free_port)
  setsid java -cp "$jar" com.google.cloud.datastore.emulator.firestore.CloudFirestore start \
    --host=127.0.0.1 --port="$fport" >"$dir/firestore.log" 2>&1 &
  echo $! >"$dir/firestore.pgid"
  setsid "$ps" --host=127.0.0.1 --port="$pport" >"$dir/pubsub.log" 2>&1 &
  echo $! >"$dir/pubsub.pgid"
  wait_ready "$dir/firestore.log" "Dev App Server is now running" Firestore
  wait_ready "$dir/pubsub.log" "Server started" Pub/Sub
  echo "export FIRESTORE_EMULATOR_HOST=127.0.0.1:$fport"
  echo "export PUBSUB_EMULATOR_HOST=127.0.0.1:$pport"
  ;;
*) echo "usage: emulators.sh start|stop DIR" >&2; exit 2 ;;
esac

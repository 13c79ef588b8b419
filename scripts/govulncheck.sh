#!/usr/bin/env bash
# govulncheck ./... for .ci/run (gating): fails when the code calls a known-vulnerable function.
#   Go: the scan runs on the toolchain go.mod pins (the patched Go the images are built with), so
#       the standard library it judges is the one that ships; GOTOOLCHAIN fetches it through the
#       Go module proxy (golang.org/toolchain) once. Without it, the local Go is scanned, and
#       fixes the images have may be reported against it.
#   database: https://vuln.go.dev when reachable; otherwise one built offline from the
#       golang.org/x/vulndb module (its OSV files, indexed by its cmd/indexdb) under
#       GENBOX_VULNDB_DIR (default ~/.cache/genbox-tools/vulndb), refreshed from the module
#       proxy when possible and else the newest built before, whose version (and date) is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
. scripts/tools.sh

GOVULNCHECK_VERSION=v1.9.0
# indexdb turns the module's OSV files into a database; the data itself is always the newest.
INDEXDB_VERSION=v0.0.0-20261105234957-e22db6528018
DBDIR=${GENBOX_VULNDB_DIR:-$HOME/.cache/genbox-tools/vulndb}

install govulncheck "$GOVULNCHECK_VERSION" golang.org/x/vuln/cmd/govulncheck

toolchain=$(go mod edit -json | sed -n 's/^[[:space:]]*"Toolchain": "\(.*\)",*$/\1/p')
if [ -n "$toolchain" ] && GOTOOLCHAIN=$toolchain go version >/dev/null 2>&1; then
  scan_go=$toolchain
else
  scan_go=local
  echo "the toolchain of go.mod (${toolchain:-none}) is unavailable: scanning with the local $(go env GOVERSION)"
fi

db=()
if timeout 15 curl -fsS -o /dev/null https://vuln.go.dev/index/db.json.gz 2>/dev/null; then
  echo "database: https://vuln.go.dev"
else
  version=$(timeout 120 go list -m -f '{{.Version}}' golang.org/x/vulndb@latest 2>/dev/null || true)
  if [ -n "$version" ] && [ ! -f "$DBDIR/$version/index/db.json" ]; then
    echo "vuln.go.dev unreachable: building the database of golang.org/x/vulndb@$version"
    src=$(go mod download -json "golang.org/x/vulndb@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
    if install indexdb "$INDEXDB_VERSION" golang.org/x/vulndb/cmd/indexdb; then
      rm -rf "$DBDIR/$version.tmp"
      "$BIN/indexdb" -vulns "$src/data/osv" -out "$DBDIR/$version.tmp" && mv "$DBDIR/$version.tmp" "$DBDIR/$version"
    fi
  fi
  newest=$(ls -1d "$DBDIR"/*/index/db.json 2>/dev/null | sort | tail -1 || true)
  if [ -z "$newest" ]; then
    echo "no vulnerability database: vuln.go.dev and the module proxy are unreachable and none was built before"
    exit 1
  fi
  dir=${newest%/index/db.json}
  echo "database: $dir (offline: golang.org/x/vulndb@${dir##*/}, whose version carries its date)"
  db=(-db "file://$dir")
fi
GOTOOLCHAIN=$scan_go nice "$BIN/govulncheck" "${db[@]}" ./...

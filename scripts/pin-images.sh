#!/usr/bin/env bash
# Pins every third-party image of the Dockerfile and the Cloud Build configurations by digest:
# name:tag becomes name:tag@sha256:<the digest the registry serves for the tag now> (the tag
# stays for the reader; the digest decides what is pulled). Run it where the registries are
# reachable, with `docker buildx` or `crane`; then remove the pinned images from `unpinned` in
# internal/deploycheck/supplychain_test.go, whose test holds every image to a digest. Re-run it to
# move to newer content of the same tags (e.g. a rebuilt distroless), and review the diff.
set -euo pipefail
cd "$(dirname "$0")/.."

digest_of() {
  if command -v crane >/dev/null; then
    crane digest "$1"
  else
    docker buildx imagetools inspect "$1" --format '{{json .Manifest}}' | sed -n 's/.*"digest":"\(sha256:[0-9a-f]\{64\}\)".*/\1/p'
  fi
}

files=(Dockerfile cloudbuild.yaml cloudbuild.check.yaml)
refs=$(
  {
    sed -n 's/^FROM[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' Dockerfile
    sed -n 's/^[[:space:]]*\(- \)\{0,1\}name:[[:space:]]*\([^[:space:]]*\)[[:space:]]*$/\2/p' cloudbuild.yaml cloudbuild.check.yaml
  } | sed 's/@sha256:[0-9a-f]*$//' | sort -u
)
for ref in $refs; do
  d=$(digest_of "$ref")
  case "$d" in
    sha256:????????????????????????????????????????????????????????????????) ;;
    *) echo "no digest for $ref" >&2; exit 1 ;;
  esac
  echo "$ref@$d"
  for f in "${files[@]}"; do
    # Replace the reference, pinned or not, where it is a whole word: FROM lines and step names.
    sed -i -E "s#(^FROM[[:space:]]+|name:[[:space:]]*)$(printf '%s' "$ref" | sed 's/[.[\*^$/]/\\&/g')(@sha256:[0-9a-f]{64})?([[:space:]]|\$)#\1$ref@$d\3#" "$f"
  done
done

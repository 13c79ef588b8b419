#!/usr/bin/env bash
# Offline checks of infra/terraform, called by .ci/run.
#   gating:   terraform fmt -check -recursive (skipped with a notice when terraform is missing; the
#             Go test internal/deploycheck.TestTerraformFormatted checks the same formatting)
#   advisory: tflint (bundled Terraform rules, all on) and tfsec; their findings are printed and
#             never fail the run. Both install with `go install` into a cache outside the repository
#             (GENBOX_TOOLS_BIN, default ~/.cache/genbox-tools/bin), as their builds take minutes
#             on 2 cores; GENBOX_SKIP_TF_LINT=1 skips them. Each install is cut off after
#             GENBOX_TOOLS_INSTALL_TIMEOUT seconds (default 900) to spare CI's budget; the packages it
#             compiled stay in Go's build cache, so a later run finishes the job.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

TFLINT_VERSION=v0.64.0
TFSEC_VERSION=v1.28.14
BIN=${GENBOX_TOOLS_BIN:-$HOME/.cache/genbox-tools/bin}
DIR=infra/terraform
export TF_CLI_CONFIG_FILE=/dev/null # no ~/.terraformrc warning

echo "--- terraform fmt -check -recursive $DIR (gating)"
if command -v terraform >/dev/null; then
  terraform fmt -check -recursive -diff "$DIR"
  echo "formatted"
else
  echo "terraform not installed: fmt skipped here (TestTerraformFormatted covers it)"
fi

[ "${GENBOX_SKIP_TF_LINT:-}" = 1 ] && { echo "GENBOX_SKIP_TF_LINT=1: tflint and tfsec skipped"; exit 0; }

# install NAME VERSION PACKAGE: go install into $BIN unless that version is already there.
install() {
  local name=$1 version=$2 pkg=$3 stamp="$BIN/.$1-$2"
  [ -x "$BIN/$name" ] && [ -f "$stamp" ] && return 0
  echo "installing $name $version into $BIN (cached for later runs)"
  mkdir -p "$BIN"
  if GOBIN="$BIN" GOFLAGS=-buildvcs=false timeout "${GENBOX_TOOLS_INSTALL_TIMEOUT:-900}" nice go install "$pkg@$version"; then
    touch "$stamp"
  else
    echo "could not install $name $version (or not within the time limit): skipped (advisory)"
    return 1
  fi
}

echo "--- tflint $TFLINT_VERSION (advisory)"
if install tflint "$TFLINT_VERSION" github.com/terraform-linters/tflint; then
  if "$BIN/tflint" --chdir="$DIR" --config=.tflint.hcl --format=compact; then
    echo "tflint: no issues"
  else
    echo "tflint: findings above (advisory)"
  fi
fi

echo "--- tfsec $TFSEC_VERSION (advisory)"
if install tfsec "$TFSEC_VERSION" github.com/aquasecurity/tfsec/cmd/tfsec; then
  "$BIN/tfsec" "$DIR" --no-color --concise-output --soft-fail || echo "tfsec: could not run (advisory)"
fi

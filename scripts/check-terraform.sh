#!/usr/bin/env bash
# Offline checks of infra/terraform, called by .ci/run.
#   gating:   terraform fmt -check -recursive (skipped with a notice when terraform is missing; the
#             Go test internal/deploycheck.TestTerraformFormatted checks the same formatting)
#   advisory: tflint (bundled Terraform rules, all on) and trivy config (misconfigurations, with
#             the checks built into the binary: no download at run time; tfsec, which it replaces,
#             is deprecated); their findings are printed and never fail the run. Both install with
#             `go install` into the tools cache of scripts/tools.sh; GENBOX_SKIP_TF_LINT=1 skips
#             them. A tool that cannot be installed is skipped with a notice.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
. scripts/tools.sh

TFLINT_VERSION=v0.64.0
TRIVY_VERSION=v0.74.0
DIR=infra/terraform
export TF_CLI_CONFIG_FILE=/dev/null # no ~/.terraformrc warning

echo "--- terraform fmt -check -recursive $DIR (gating)"
if command -v terraform >/dev/null; then
  terraform fmt -check -recursive -diff "$DIR"
  echo "formatted"
else
  echo "terraform not installed: fmt skipped here (TestTerraformFormatted covers it)"
fi

[ "${GENBOX_SKIP_TF_LINT:-}" = 1 ] && { echo "GENBOX_SKIP_TF_LINT=1: tflint and trivy skipped"; exit 0; }

echo "--- tflint $TFLINT_VERSION (advisory)"
if install tflint "$TFLINT_VERSION" github.com/terraform-linters/tflint; then
  if "$BIN/tflint" --chdir="$DIR" --config=.tflint.hcl --format=compact; then
    echo "tflint: no issues"
  else
    echo "tflint: findings above (advisory)"
  fi
else
  echo "tflint: skipped (advisory)"
fi

echo "--- trivy config $TRIVY_VERSION (advisory)"
# trivy builds only with encoding/json/v2, an experiment in Go 1.26.
if GOEXPERIMENT=jsonv2 install trivy "$TRIVY_VERSION" github.com/aquasecurity/trivy/cmd/trivy; then
  "$BIN/trivy" config --skip-check-update --quiet --exit-code 0 "$DIR" || echo "trivy: could not run (advisory)"
else
  echo "trivy: skipped (advisory)"
fi

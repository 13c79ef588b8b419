# Sourced by the check scripts: installs Go-built tools into a cache outside the repository
# (GENBOX_TOOLS_BIN, default ~/.cache/genbox-tools/bin), as their builds take minutes on 2 cores.
# Each install is cut off after GENBOX_TOOLS_INSTALL_TIMEOUT seconds (default 900) to spare CI's
# budget; the packages it compiled stay in Go's build cache, so a later run finishes the job.

BIN=${GENBOX_TOOLS_BIN:-$HOME/.cache/genbox-tools/bin}

# install NAME VERSION PACKAGE: go install PACKAGE@VERSION into $BIN as NAME unless that version is
# already there; fails (status 1) when it cannot, after saying why.
install() {
  local name=$1 version=$2 pkg=$3 stamp="$BIN/.$1-$2"
  [ -x "$BIN/$name" ] && [ -f "$stamp" ] && return 0
  echo "installing $name $version into $BIN (cached for later runs)"
  mkdir -p "$BIN"
  if GOBIN="$BIN" GOFLAGS=-buildvcs=false timeout "${GENBOX_TOOLS_INSTALL_TIMEOUT:-900}" nice go install "$pkg@$version"; then
    rm -f "$BIN/.$name-"*
    touch "$stamp"
  else
    echo "could not install $name $version (or not within the time limit)"
    return 1
  fi
}

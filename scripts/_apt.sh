# Sourced by the set-up scripts: install Debian packages, saying first what and why, and
# waiting for another install's dpkg and package-list locks (up to 10 minutes) instead
# of failing at once.
apt_install() {
  local why="$1"
  shift
  echo "installing $* from Debian's packages: $why" >&2
  local wait=(-o DPkg::Lock::Timeout=600)
  apt-get "${wait[@]}" update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -qq "$@" >/dev/null
}

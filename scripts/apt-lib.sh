# Sourced (not run) by the scripts that install Debian packages: setup.sh, ceph-cluster.sh.
# apt_ensure TAG PKG...: installs those of the packages that are not installed yet (as root, or
# with sudo), saying which on standard error under TAG.
apt_ensure() {
  local tag=$1 p sudo= missing=()
  shift
  [ "$(id -u)" = 0 ] || sudo=sudo
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "$tag: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
}

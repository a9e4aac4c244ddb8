# Sourced by scripts/fetch_jars.sh and scripts/kafka.sh (which define say and die):
# need_mvn makes sure Maven is there, installing it with apt-get when run as root.
need_mvn() {
  command -v mvn >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing maven (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven; } >/dev/null \
      || die "apt-get install maven failed"
  else
    die "needs Maven (mvn): install it (Debian/Ubuntu: apt-get install maven)"
  fi
}

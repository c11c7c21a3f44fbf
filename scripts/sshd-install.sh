#!/usr/bin/env bash
# Installs OpenSSH's server (Debian's openssh-server) if /usr/sbin/sshd is missing. The tests that play two
# EC2 instances on this machine (tests/ec2_sandbox.py) run one sshd inside the second instance's network
# namespace, as horovodrun on the first instance reaches the second over ssh. Nothing is started here and
# the system's sshd service is left as it is (the package's service is not started in a container).
# Exit 0: sshd is there; 3: it cannot be installed here (the reason on stderr).
set -euo pipefail
cannot() { echo "sshd-install: $*" >&2; exit 3; }
# The lock comes before the first look: dpkg unpacks /usr/sbin/sshd before its postinst creates the `sshd`
# privilege-separation user, so a worker that saw the binary while another worker's apt-get was still running
# started an sshd that refused to run ("Privilege separation user sshd does not exist"), and its played
# instance never booted (docs/reliability.md, "One sshd install for all the workers").
exec 9>/tmp/scalelab-sshd-install.lock && flock 9  # two test workers may ask at once: one apt at a time
[ -x /usr/sbin/sshd ] && exit 0
[ "$(id -u)" -eq 0 ] || cannot "sshd is not installed and installing it needs root"
command -v apt-get >/dev/null || cannot "sshd is not installed and there is no apt-get (install OpenSSH's server)"
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends openssh-server >"$log" 2>&1; then
  { apt-get update -qq && apt-get install -y -q --no-install-recommends openssh-server; } >>"$log" 2>&1 \
    || cannot "apt-get install openssh-server failed (see $log)"
fi
rm -f "$log"
[ -x /usr/sbin/sshd ] || cannot "openssh-server was installed but /usr/sbin/sshd is not there"

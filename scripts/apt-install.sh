#!/usr/bin/env bash
# Install Debian packages, as root or through sudo.
set -euo pipefail
run() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
export DEBIAN_FRONTEND=noninteractive
run apt-get update -q
run apt-get install -y -q "$@"

#!/usr/bin/env bash
# Installs Debian's libosmesa6 (MuJoCo's software renderer for offscreen images) if missing.
if ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libosmesa6 >/dev/null
fi

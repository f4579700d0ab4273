#!/usr/bin/env bash
# System packages the test suite drives for real: Chromium (browser tests), HAProxy and nginx
# (gateway integration tests), Caddy (its applier's end-to-end test and the routers' drill), Prometheus's promtool (the shipped rules in deploy/prometheus/) and
# Alertmanager (alert delivery tests). Installed from Debian's packages only when missing.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v haproxy  >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v nginx    >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v caddy    >/dev/null 2>&1 || need+=(caddy)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || [ -x /usr/bin/prometheus-alertmanager ] \
  || need+=(prometheus-alertmanager)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # --no-install-recommends: the daemons' own services are not wanted, only the binaries.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "system packages: chromium, haproxy, nginx, caddy, promtool, prometheus-alertmanager present"

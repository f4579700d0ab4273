#!/usr/bin/env bash
# The LiteLLM proxy in its own venv (.venv-litellm), with the gateway agent's distribution
# (deploy/agent: agent.litellm_callback imports only that) beside it. LiteLLM pins many
# packages, so it never goes into the project's .venv. Idempotent: a stamp holds the LiteLLM
# requirement it was made with; the agent is reinstalled (seconds) when one of its sources is newer
# than its own stamp. Serialised with flock: the test workers may call it at once.
# Used by `make test` (target litellm-venv) and by harness/routers_llm.py.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LITELLM_VENV:-.venv-litellm}
PYTHON=${PYTHON:-python3}
LITELLM_SPEC='litellm[proxy]>=1.108.7,<1.109'
STAMP="$VENV/.installed"
AGENT_STAMP="$VENV/.agent-installed"
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$LITELLM_SPEC" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip 'setuptools>=77' wheel
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$LITELLM_SPEC"
    # The agent with its dependency ranges (redis-py, prometheus-client), checked against LiteLLM's pins.
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation './deploy/agent[metrics]'
    "$VENV/bin/pip" check
    touch "$AGENT_STAMP"
    echo "$LITELLM_SPEC" > "$STAMP"
elif [ ! -f "$AGENT_STAMP" ] || [ -n "$(find agent contract deploy/agent pyproject.toml -newer "$AGENT_STAMP" \
            \( -name '*.py' -o -name '*.toml' \) -print -quit)" ]; then
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
        --force-reinstall ./deploy/agent
    touch "$AGENT_STAMP"
fi

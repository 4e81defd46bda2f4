#!/usr/bin/env bash
# Install each external plugin package under plugins/ (model packages and the extra plugins
# tensorboard, wandb and mlflow) from its folder, as a third party would, and check that installing it
# is what makes `slhub plugins` list it, as a model or an extra plugin. Their tests (under
# plugins/*/tests) run in the root `python -m pytest` that .ci/run calls afterwards.
# Expects slhub itself to be installed already (.ci/run installs it first).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

for pkg in plugins/*/; do
  python -m pip install -q -e "$pkg"
done

listing=$(python -m slhub plugins)
for pkg in plugins/*/; do
  name=$(basename "$pkg")
  grep -Eq "^${name}[[:space:]]+(model|extra)[[:space:]]+slhub-${name} " <<<"$listing" || {
    echo "slhub plugins does not list ${name}:"; echo "$listing"; exit 1
  }
done

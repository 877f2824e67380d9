#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build, fetch the
# default model, and serve it over HTTP (OpenAI-compatible API and a chat page at /).
# Extra arguments go to `hablar serve` (e.g. --host 0.0.0.0 --port 8080).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_system_packages
setup_venv
build_hablar
fetch_default_model

say "hablar serve (default model) on http://127.0.0.1:8080 unless told otherwise"
exec "$HABLAR_BIN" serve "$@"

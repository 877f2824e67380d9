#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build, fetch the
# default model, and run hablar on it. Extra arguments are passed to the command.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_system_packages
setup_venv
build_hablar
fetch_default_model

say "hablar info (default model)"
exec "$HABLAR_BIN" info "$@"

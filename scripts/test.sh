#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: the same set-up as scripts/run.sh, then
# every unit test (CTest), every Python test (pytest: oracles, CLI and server black-box tests),
# the llama.cpp server tests hablar passes (tools/llama_server_suite.py) and bounded fuzzing
# runs of the GGUF and Hugging Face readers and the server's request parsers. Exits non-zero
# if anything failed.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_system_packages
setup_venv
build_hablar
fetch_default_model
fetch_test_models

results="$HABLAR_BUILD_DIR/test-results"
rm -rf "$results"
mkdir -p "$results"
status=0

say "unit tests (ctest)"
ctest --test-dir "$HABLAR_BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 900 \
  --output-junit "$results/ctest.xml" || status=1

say "Python tests (pytest)"
set +e
(cd "$HABLAR_ROOT" && "$HABLAR_VENV/bin/python" -m pytest tests -q -rs \
  --junitxml="$results/pytest.xml")
rc=$?
set -e
# 5 means pytest collected no tests; anything else non-zero is a failure.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi

say "llama.cpp's own server tests (the ones hablar passes: tests/compat/llama_server_passing.txt)"
(cd "$HABLAR_ROOT" && "$HABLAR_VENV/bin/python" tools/llama_server_suite.py --fetch \
  --passing tests/compat/llama_server_passing.txt --junitxml="$results/llama-server-suite.xml") ||
  status=1

if [ -x "$HABLAR_ROOT/scripts/fuzz-gguf.sh" ]; then
  say "fuzzing the GGUF reader"
  "$HABLAR_ROOT/scripts/fuzz-gguf.sh" --junit "$results/fuzz.xml" || status=1
fi

if [ -x "$HABLAR_ROOT/scripts/fuzz-hf.sh" ]; then
  say "fuzzing the Hugging Face readers (safetensors, config.json, tokenizer.json)"
  "$HABLAR_ROOT/scripts/fuzz-hf.sh" --junit "$results/fuzz-hf.xml" || status=1
fi

if [ -x "$HABLAR_ROOT/scripts/fuzz-server.sh" ]; then
  say "fuzzing the server's request parsers"
  "$HABLAR_ROOT/scripts/fuzz-server.sh" --junit "$results/fuzz-server.xml" || status=1
fi

say "summary"
"$HABLAR_VENV/bin/python" "$HABLAR_ROOT/tools/junit_summary.py" "$results"/*.xml || status=1
exit "$status"

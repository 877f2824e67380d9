#!/usr/bin/env bash
# Fuzzes the GGUF reader (fuzz/gguf_fuzz) for a bounded time from the seed corpus fuzz/corpus;
# non-zero on any finding. scripts/fuzz-run.sh does the work.
#
#   scripts/fuzz-gguf.sh [--time SECONDS] [--junit FILE]
exec "$(dirname "${BASH_SOURCE[0]}")/fuzz-run.sh" gguf_fuzz fuzz/corpus 65536 gguf_reader "$@"

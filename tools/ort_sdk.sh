#!/usr/bin/env bash
# Assemble an ONNX Runtime SDK folder in the layout of ORT's release archives (include/, lib/) from registry
# packages, for the C++ library in cpp/ (docs/DESIGN.md "C++ runtime", "Toolchain facts"):
#   include/   ONNX Runtime's C and C++ API headers, from Debian's libonnxruntime-dev (headers only: its runtime
#              package, libonnxruntime1.x, is never installed; it needs a newer libc than bookworm's), and
#              nlohmann/json.hpp from Debian's nlohmann-json3-dev (header-only)
#   lib/       libonnxruntime.so from the PyPI onnxruntime wheel: the one installed for $PYTHON, else downloaded
#
# The .deb files come through a private apt state (lists, cache and sources in a temporary folder) pointed at
# the Debian mirror this machine's own apt sources name: nothing on the system changes, nothing is installed.
# The library is loaded with dlopen at run time (seer::Options::ort_library), so lib/ is only the default.
#
# Usage: tools/ort_sdk.sh DEST [--suite trixie|sid] [--library PATH]
#   --suite    Debian suite of the headers: trixie (ONNX Runtime 1.21, the default: works with any library
#              >= 1.21) or sid (1.23 today)
#   --library  a libonnxruntime.so to put in lib/ instead of the wheel's
#   $PYTHON    the Python whose onnxruntime wheel gives lib/ (default python3)
#   $SEER_DEBIAN_MIRROR  a Debian mirror URI instead of the one in this machine's apt sources
set -euo pipefail

dest="" suite="trixie" library=""
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite="$2"; shift 2 ;;
    --library) library="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "ort_sdk.sh: unknown option $1 (expected --suite, --library)" >&2; exit 2 ;;
    *) dest="$1"; shift ;;
  esac
done
[ -n "$dest" ] || { echo "ort_sdk.sh: give the folder to write, e.g. tools/ort_sdk.sh cpp/build/ort-sdk" >&2; exit 2; }
python="${PYTHON:-python3}"
# ONNX Runtime's telemetry off when the wheel's onnxruntime is imported below, unless the environment sets it, as the
# project's sessions do (docs/DESIGN.md "Telemetry"): its import writes a device id under ~/.cache otherwise
export ORT_DISABLE_TELEMETRY="${ORT_DISABLE_TELEMETRY-1}"
stamp="suite=$suite library=${library:-wheel:$python}"
if [ -f "$dest/SDK" ] && grep -qxF "$stamp" "$dest/SDK"; then
  exit 0  # already assembled with these settings
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The mirror: the first Debian archive URI of this machine's apt sources (deb822 .sources or one-line .list).
mirror="${SEER_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    mirror="$(grep -hoE '(^URIs:[[:space:]]*|^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)[a-z]+://[^[:space:]]+/debian/?([[:space:]]|$)' "$f" \
              | grep -oE '[a-z]+://[^[:space:]]+' | head -n1 || true)"
    [ -n "$mirror" ] && break
  done
fi
[ -n "$mirror" ] || { echo "ort_sdk.sh: no Debian mirror in /etc/apt/sources*; set SEER_DEBIAN_MIRROR to one" >&2; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { echo "ort_sdk.sh: $keyring is missing; install debian-archive-keyring" >&2; exit 1; }

mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial" "$work/sources" "$work/debs" "$work/x"
printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' "$mirror" "$suite" "$keyring" \
  > "$work/sources/seer.sources"
apt_opts=(-o "Dir::State=$work/state" -o "Dir::Cache=$work/cache" -o "Dir::State::status=/dev/null"
          -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$work/sources"
          -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$work/sources"
          -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)" -q)
apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 \
  || { cat "$work/apt.log" >&2; echo "ort_sdk.sh: apt-get update of $suite failed (above)" >&2; exit 1; }
(cd "$work/debs" && apt-get "${apt_opts[@]}" download libonnxruntime-dev nlohmann-json3-dev) >>"$work/apt.log" 2>&1 \
  || { cat "$work/apt.log" >&2; echo "ort_sdk.sh: downloading libonnxruntime-dev / nlohmann-json3-dev failed" >&2; exit 1; }
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/x"; done

rm -rf "$dest"
mkdir -p "$dest/include" "$dest/lib"
cp -r "$work"/x/usr/include/onnxruntime/. "$dest/include/"
cp -r "$work"/x/usr/include/nlohmann "$dest/include/"
headers="$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\)/1.\1/p' "$dest/include/onnxruntime_c_api.h")"

if [ -z "$library" ]; then
  capi="$("$python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))' 2>/dev/null || true)"
  if [ -z "$capi" ]; then  # no wheel installed for $python: download it (the wheel only, no dependencies)
    "$python" -m pip download -q --no-deps --only-binary :all: -d "$work/wheel" onnxruntime
    (cd "$work/wheel" && "$python" -m zipfile -e ./*.whl .)
    capi="$work/wheel/onnxruntime/capi"
  fi
  library="$(ls "$capi"/libonnxruntime.so* | head -n1)"
fi
[ -f "$library" ] || { echo "ort_sdk.sh: no libonnxruntime.so at '$library'" >&2; exit 1; }
cp "$library" "$dest/lib/$(basename "$library")"
[ "$(basename "$library")" = libonnxruntime.so ] || ln -sf "$(basename "$library")" "$dest/lib/libonnxruntime.so"
echo "$stamp" > "$dest/SDK"
echo "headers=$headers library=$(basename "$library")" >> "$dest/SDK"
echo "ort_sdk.sh: $dest: ONNX Runtime headers $headers ($suite), $(basename "$library"), nlohmann/json.hpp"

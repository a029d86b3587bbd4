#!/usr/bin/env bash
# Print the path of a CPython >= 3.12 for the harness virtualenv (Harbor and terminal-bench need
# 3.12+; tinkrl itself runs on the machine's Python). In order: $TINKRL_HARNESS_PYTHON when set; a
# python3.13 / python3.12 / python3 on PATH that runs and is 3.12+; a build cached in
# $TINKRL_HARNESS_PYTHON_PREFIX (default ~/.cache/tinkrl/python3.13); else CPython 3.13 is built
# there from Debian's source package (the trixie suite of the machine's own Debian archive), once.
# Diagnostics go to stderr; stdout is only the interpreter's path.
set -euo pipefail

prefix="${TINKRL_HARNESS_PYTHON_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/tinkrl/python3.13}"
ok='import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'

usable() { [ -n "$1" ] && "$1" -c "$ok" >/dev/null 2>&1; }

if [ -n "${TINKRL_HARNESS_PYTHON:-}" ]; then
  usable "$TINKRL_HARNESS_PYTHON" || { echo "TINKRL_HARNESS_PYTHON=$TINKRL_HARNESS_PYTHON is not a Python >= 3.12" >&2; exit 2; }
  echo "$TINKRL_HARNESS_PYTHON"; exit 0
fi
for name in python3.13 python3.12 python3; do
  p=$(command -v "$name" 2>/dev/null || true)
  if usable "$p"; then echo "$p"; exit 0; fi
done
if usable "$prefix/bin/python3.13"; then echo "$prefix/bin/python3.13"; exit 0; fi

# --- build CPython 3.13 from Debian's source package into $prefix ---
command -v apt-get >/dev/null || { echo "no Python >= 3.12 here and no apt-get to fetch CPython's source; set TINKRL_HARNESS_PYTHON=/path/to/python3.12+" >&2; exit 2; }
sources=/etc/apt/sources.list.d/debian.sources
uris=$(grep -m1 '^URIs:' "$sources" 2>/dev/null || true)
[ -n "$uris" ] || { echo "no 'URIs:' line in $sources to find Debian's archive; set TINKRL_HARNESS_PYTHON=/path/to/python3.12+" >&2; exit 2; }
missing=()
for pkg in build-essential libssl-dev zlib1g-dev libbz2-dev liblzma-dev libsqlite3-dev libffi-dev libreadline-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "CPython's build needs: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2; exit 2; }
  echo "installing build dependencies: ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tinkrl-cpython.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial"
printf 'Types: deb-src\n%s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uris" >"$work/trixie.sources"
o=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work" -o "Dir::State::Lists=$work/lists" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
echo "fetching python3.13's source package from ${uris#URIs: } (trixie)" >&2
apt-get "${o[@]}" -qq update >&2
(cd "$work" && apt-get "${o[@]}" -qq source --download-only python3.13 >&2)
tar xf "$work"/python3.13_*.orig.tar.xz -C "$work"
src=$(echo "$work"/Python-3.13.*/)
jobs=$(nproc 2>/dev/null || echo 2)
echo "building CPython in $src -> $prefix (nice 19, -j$jobs; a few minutes)" >&2
mkdir -p "$(dirname "$prefix")"
(
  cd "$src"
  nice -n 19 ./configure --prefix="$prefix" --with-ensurepip=install >"$work/configure.log" 2>&1 \
    || { tail -20 "$work/configure.log" >&2; exit 1; }
  nice -n 19 make -j"$jobs" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
  nice -n 19 make install >"$work/install.log" 2>&1 || { tail -40 "$work/install.log" >&2; exit 1; }
)
"$prefix/bin/python3.13" -c 'import ssl, sqlite3, ctypes, zlib, lzma, bz2, readline' \
  || { echo "the built CPython lacks a standard module (see above)" >&2; exit 1; }
echo "$prefix/bin/python3.13"

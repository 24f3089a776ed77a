#!/usr/bin/env bash
# `cmake --install` makes a usable kiln: install the build tree into a temporary prefix,
# build examples/embed (a separate CMake project: find_package(kiln), kiln::kiln_runtime)
# against it, export a model with `kiln train --export`, and run the embed binary on it
# with LD_LIBRARY_PATH unset (the installed libraries are found through RPATH). Also
# checks the pkg-config files (kiln-runtime.pc builds the same program), that the
# installed libkiln_runtime.so does not need libkiln.so, and that no private header
# (generated protobuf) or build-tree path leaks into the installation.
#
#   install_embed.sh BUILD_DIR SOURCE_DIR KILN_CLI
# Environment (set by ctest from the build's cache): KILN_EMBED_CXX, KILN_EMBED_CXXFLAGS,
# KILN_EMBED_LDFLAGS, KILN_EMBED_BUILD_TYPE: the embed project is built like kiln (the
# sanitizer presets need the same flags).
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
SRC="$(cd "$2" && pwd)"
KILN="$3"
CXX="${KILN_EMBED_CXX:-c++}"
CXXFLAGS="${KILN_EMBED_CXXFLAGS:-}"
LDFLAGS="${KILN_EMBED_LDFLAGS:-}"
BUILD_TYPE="${KILN_EMBED_BUILD_TYPE:-RelWithDebInfo}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do [ -e "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; exit 1; }
step() { echo "== $*"; }
prefix="$work/prefix"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache)")

step "cmake --install $BUILD --prefix $prefix"
cmake --install "$BUILD" --prefix "$prefix" > "$work/install.log" 2>&1 || fail "cmake --install failed"
libdir=$(dirname "$(find "$prefix" -name 'libkiln_runtime.so' | head -n 1)")
if [ -z "$libdir" ] || [ "$libdir" = . ]; then fail "no libkiln_runtime.so under $prefix"; fi
for f in "$libdir/libkiln.so" "$prefix/bin/kiln" "$prefix/include/kiln/package/saved_model.h" \
         "$prefix/include/kiln/core/version.h" "$libdir/cmake/kiln/kilnConfig.cmake" \
         "$libdir/cmake/kiln/kilnConfigVersion.cmake" "$libdir/pkgconfig/kiln-runtime.pc" "$libdir/pkgconfig/kiln.pc"; do
  [ -e "$f" ] || fail "not installed: $f"
done
leaked=$(find "$prefix/include" -name '*.pb.h' -o -name '*.in' -o -name '*internal*')
[ -z "$leaked" ] || fail "private headers installed: $leaked"
echo "installed $(find "$prefix" -type f | wc -l) files"
# The installed headers stand on their own: all of them compile together from the prefix.
(cd "$prefix/include" && find kiln -name '*.h' | sort | sed 's/.*/#include "&"/') > "$work/all_headers.cc"
"$CXX" -std=c++20 -fsyntax-only -I"$prefix/include" "$work/all_headers.cc" > "$work/headers.log" 2>&1 ||
  fail "the installed headers do not compile on their own"
echo "$(wc -l < "$work/all_headers.cc") installed headers compile from the prefix alone"

step "readelf: SONAMEs, NEEDED, RUNPATH"
rt=$(readelf -d "$libdir/libkiln_runtime.so")
echo "$rt" | grep -E 'SONAME|NEEDED.*kiln|R(UN)?PATH'
echo "$rt" | grep -q 'SONAME.*\[libkiln_runtime\.so\.[0-9]' || fail "libkiln_runtime.so has no versioned SONAME"
if echo "$rt" | grep -E 'NEEDED' | grep -q '\[libkiln\.so'; then fail "libkiln_runtime.so needs libkiln.so"; fi
readelf -d "$libdir/libkiln.so" | grep -q 'NEEDED.*\[libkiln_runtime\.so' || fail "libkiln.so does not need libkiln_runtime.so"
# The server library and binary carry no training code (NORTH_STAR: serving never links train/).
if readelf -d "$libdir/libkiln_serving.so" | grep -E 'NEEDED' | grep -q '\[libkiln\.so'; then fail "libkiln_serving.so needs libkiln.so"; fi
if readelf -d "$prefix/bin/kiln_model_server" | grep -E 'NEEDED' | grep -q '\[libkiln\.so'; then fail "kiln_model_server needs libkiln.so"; fi
for f in "$libdir"/libkiln_runtime.so "$libdir"/libkiln.so "$libdir"/libkiln_serving.so "$prefix/bin/kiln" \
         "$prefix/bin/kiln_model_server"; do
  if readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -qF "$BUILD"; then fail "$f keeps a build-tree RPATH"; fi
done
env -u LD_LIBRARY_PATH "$prefix/bin/kiln" --version > "$work/version.log" 2>&1 || fail "installed kiln --version failed"
cat "$work/version.log"
env -u LD_LIBRARY_PATH "$prefix/bin/kiln_model_server" --version > "$work/server_version.log" 2>&1 ||
  fail "installed kiln_model_server --version failed"
echo "kiln_model_server $(cat "$work/server_version.log")"

step "configure + build examples/embed against the installation"
cmake -S "$SRC/examples/embed" -B "$work/embed" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${launcher[@]}" \
      -DCMAKE_CXX_FLAGS="$CXXFLAGS" -DCMAKE_EXE_LINKER_FLAGS="$LDFLAGS" > "$work/embed-configure.log" 2>&1 ||
  fail "configuring examples/embed failed"
grep -q "kiln_DIR:PATH=$libdir/cmake/kiln" "$work/embed/CMakeCache.txt" || fail "find_package(kiln) did not find $prefix"
cmake --build "$work/embed" > "$work/embed-build.log" 2>&1 || fail "building examples/embed failed"
# Public headers only: nothing from the source or build tree on the command line.
if grep -E -- "-I$SRC|-isystem $SRC|$BUILD" "$work/embed/build.ninja" >/dev/null; then
  fail "the embed build uses the kiln source or build tree"
fi

step "export a package: kiln train --export"
"$KILN" train --model mlp --epochs 1 --max-samples 500 --export "$work/pkg" --verbose 0 > "$work/train.log" 2>&1 ||
  fail "kiln train --export failed"
[ -e "$work/pkg/1/manifest.json" ] || fail "no package at $work/pkg/1"

step "run embed (LD_LIBRARY_PATH unset)"
env -u LD_LIBRARY_PATH "$work/embed/embed" "$work/pkg/1" > "$work/embed-run.log" 2>&1 || fail "embed failed"
cat "$work/embed-run.log"
grep -q "signature serving_default" "$work/embed-run.log" || fail "embed did not list serving_default"
grep -qE "result [A-Za-z0-9_]+: f32\[2, 10\]" "$work/embed-run.log" || fail "embed: no f32[2, 10] result"
grep -q "4 threads x [0-9]* runs: identical results" "$work/embed-run.log" || fail "embed: concurrent runs"
grep -q "embed: ok" "$work/embed-run.log" || fail "embed did not finish"
env -u LD_LIBRARY_PATH "$work/embed/embed" "$work/nonexistent" > "$work/embed-missing.log" 2>&1 &&
  fail "embed on a missing package exited 0"
grep -q "NotFound" "$work/embed-missing.log" || fail "embed on a missing package: no NotFound error"

step "pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
rt_flags=$(pkg-config --cflags --libs kiln-runtime) || fail "pkg-config kiln-runtime failed"
echo "kiln-runtime: $rt_flags"
all_flags=$(pkg-config --cflags --libs kiln) || fail "pkg-config kiln failed"
echo "kiln: $all_flags"
case "$all_flags" in *-lkiln\ *-lkiln_runtime*|*-lkiln_runtime*-lkiln\ *) ;; *) fail "kiln.pc lacks -lkiln or -lkiln_runtime";; esac
[ "$(pkg-config --modversion kiln-runtime)" = "$(sed -n 's/.*KILN_VERSION_STRING "\(.*\)"/\1/p' "$prefix/include/kiln/core/version.h")" ] ||
  fail "kiln-runtime.pc version differs from version.h"
cxx=("$CXX"); command -v ccache >/dev/null && cxx=(ccache "$CXX")
# shellcheck disable=SC2086  # flags are word lists
"${cxx[@]}" -std=c++20 $CXXFLAGS "$SRC/examples/embed/embed.cc" $rt_flags $LDFLAGS \
  -Wl,-rpath,"$(pkg-config --variable=libdir kiln-runtime)" -o "$work/embed_pc" > "$work/embed-pc.log" 2>&1 ||
  fail "building embed.cc with pkg-config's flags failed"
env -u LD_LIBRARY_PATH "$work/embed_pc" "$work/pkg/1" > "$work/embed-pc-run.log" 2>&1 || fail "embed (pkg-config build) failed"
grep -q "embed: ok" "$work/embed-pc-run.log" || fail "embed (pkg-config build) did not finish"
echo "pkg-config build: embed: ok"

echo "install_embed: ok"

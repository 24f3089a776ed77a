#!/usr/bin/env bash
# Builds kiln's container image (deploy/Dockerfile) with Debian's podman. This machine
# reaches no image registry, so the Dockerfile's base (debian:bookworm-slim) is made here
# by mmdebstrap from Debian's mirror and tagged under that name.
#
#   bash scripts/build-image.sh [--prebuilt BUILD_DIR [--cuda]] [--tag NAME]
#
# Default: the Dockerfile's `runtime` target (kiln compiled in its build stage).
# --prebuilt BUILD_DIR: its `prebuilt` target: BUILD_DIR is installed (`cmake --install
# --strip`) into the context instead, on the same runtime stage (what the image test uses:
# no second compile). --cuda: the CUDA variant from a build with CUDA (tag kiln-serving:cuda;
# the CPU one is kiln-serving:cpu). Prints the image's size.
#
# Where podman cannot start a container as configured (this VM: crun's setrlimit and its
# refusal of the hybrid cgroup layout), the script retries with an empty default_ulimits
# and the runc runtime, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=""
prebuilt=""
cuda=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --cuda) cuda=1; shift ;;
    --tag) tag="$2"; shift 2 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$tag" ] || tag=$([ $cuda = 1 ] && echo kiln-serving:cuda || echo kiln-serving:cpu)
if [ $cuda = 1 ] && [ -z "$prebuilt" ]; then
  echo "build-image: --cuda needs --prebuilt BUILD_DIR (a build with CUDA: the toolkit is the machine's, not Debian's)" >&2
  exit 2
fi
for tool in podman mmdebstrap; do
  command -v "$tool" > /dev/null || { echo "build-image: $tool is not installed (scripts/install-deps.sh)" >&2; exit 3; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=docker.io/library/debian:bookworm-slim

if ! podman image exists "$base"; then
  echo "build-image: making $base with mmdebstrap (Debian 12, minbase)"
  # merged /usr by mmdebstrap's hook, not the usrmerge package (it pulls in 46 MB of perl).
  mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$work/base.tar"
  podman import --quiet "$work/base.tar" "$base" > /dev/null
fi

podman_cmd=(podman)
if ! "${podman_cmd[@]}" run --rm --network=host "$base" true 2> "$work/err"; then
  printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
  export CONTAINERS_CONF="$work/containers.conf"
  podman_cmd=(podman --runtime runc)
  echo "build-image: podman could not start a container ($(tail -n1 "$work/err")); using runc without default ulimits"
  "${podman_cmd[@]}" run --rm --network=host "$base" true || { echo "build-image: podman cannot run containers here" >&2; exit 3; }
fi

context=.
target=runtime
if [ -n "$prebuilt" ]; then
  # A context of its own: the Dockerfile and the stripped installation.
  context="$work/context"
  mkdir -p "$context"
  cmake --install "$prebuilt" --prefix "$context/kiln-install" --strip > /dev/null
  # Headers, CMake and pkg-config files stay out; so does the CUDA plugin of the CPU image.
  rm -rf "$context/kiln-install/include" "$context/kiln-install/lib/cmake" "$context/kiln-install/lib/pkgconfig"
  target=prebuilt
  if [ $cuda = 1 ]; then
    plugin=$(ls "$context"/kiln-install/lib/libkiln_cuda.so.*.*.* 2>/dev/null | head -n1)
    [ -n "$plugin" ] || { echo "build-image: $prebuilt has no libkiln_cuda (configure with CUDA)" >&2; exit 2; }
    mkdir -p "$context/cuda-libs"
    # What the plugin links, and what cuDNN and NVRTC load beside them.
    for lib in $(ldd "$plugin" | awk '/cudart|cublas|cudnn|nccl/ {print $3}'); do
      dir=$(dirname "$(readlink -f "$lib")")
      cp -L "$lib" "$context/cuda-libs/"
      for extra in "$dir"/libcudnn_*.so.9 "$dir"/libnvrtc.so.[0-9]* "$dir"/libnvrtc-builtins.so.[0-9]*; do
        [ -e "$extra" ] && cp -L "$extra" "$context/cuda-libs/"
      done
    done
    target=prebuilt-cuda
  else
    rm -f "$context"/kiln-install/lib/libkiln_cuda.so*
  fi
fi
"${podman_cmd[@]}" build --format docker --squash-all --network=host --pull=never --target "$target" -f deploy/Dockerfile -t "$tag" "$context"
size=$("${podman_cmd[@]}" image inspect --format '{{.Size}}' "$tag")
echo "build-image: $tag ($target): $((size / 1000000)) MB"

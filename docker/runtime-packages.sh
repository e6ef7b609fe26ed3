#!/bin/sh
# Prints the Debian 12 packages that a komputed image needs at run time, one a line, for the
# image named by the argument: `gpu` (docker/Dockerfile, NVIDIA nodes) or `cpu`
# (docker/Dockerfile.cpu, Mesa lavapipe). The images' final stages install exactly this list
# (apt-get install --no-install-recommends); tests/deploy checks that every name has a candidate
# in Debian's archive. Only shared-library packages here: no -dev package, no compiler.
#
# When the daemon links a new shared library, add its package here (`dpkg -S` on the library that
# `ldd build/server/komputed` names tells which): tests/deploy compares this list with the built
# daemon's libraries when build/server/komputed exists.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 gpu|cpu" >&2
  exit 2
fi

# Both images: the Vulkan loader and the daemon's shared libraries (gRPC 1.51 with reflection,
# Protobuf 3.21, Abseil 20220623, spdlog 1.10 and its fmt, prometheus-cpp 1.0, yaml-cpp 0.7 and
# OpenSSL 3 for the tenants file and its token hashes).
common="
libvulkan1
libgrpc++1.51
libgrpc29
libprotobuf32
libabsl20220623
libspdlog1.10
libfmt9
libprometheus-cpp-core1.0
libprometheus-cpp-pull1.0
libyaml-cpp0.7
libssl3
"

case "$1" in
  gpu)
    # Nothing more: the NVIDIA driver (its Vulkan ICD libEGL_nvidia.so.0 and the libraries
    # behind it) is not in the image, the NVIDIA container toolkit mounts the host's at start.
    # libEGL_nvidia.so.0 links only glibc and the driver's own libraries: its Vulkan works
    # without libglvnd (checked headless on an H200, driver 580, with no libglvnd installed).
    extra=""
    ;;
  cpu)
    # Mesa's Vulkan drivers: lavapipe, a CPU Vulkan 1.3 device.
    extra="
mesa-vulkan-drivers
"
    ;;
  *)
    echo "$0: unknown image '$1' (want gpu or cpu)" >&2
    exit 2
    ;;
esac

for p in $common $extra; do
  echo "$p"
done

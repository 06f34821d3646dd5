#!/usr/bin/env bash
# setup.sh — makes sure this Debian/Ubuntu machine has what ember's build
# needs: meson, ninja, pkg-config, gcc, g++ (the CUDA emulator's build of the
# .cu kernels), OpenBLAS, zlib and libyaml headers; and, optional, OpenMPI
# (openmpi-bin, libopenmpi-dev: the MPI transport and its mpirun tests).
# Missing packages are installed when run as root; otherwise the exact
# `sudo apt-get install` line is printed and the script exits 1.
# A package counts as present when its tool/pkg-config module is found (so a
# pip-installed meson or a hand-built OpenBLAS is fine) or dpkg says so.
#
# usage: setup.sh [demo]   (demo: also the word list `make demo` trains on)
set -euo pipefail

MIN_MESON=0.63 # meson.build's meson_version

# present <package>: 0 if what the package provides is already here
present() {
    case "$1" in
        meson) command -v meson >/dev/null 2>&1 && return 0 ;;
        ninja-build) { command -v ninja >/dev/null 2>&1 || command -v samu >/dev/null 2>&1; } && return 0 ;;
        pkg-config) command -v pkg-config >/dev/null 2>&1 && return 0 ;;
        gcc) command -v gcc >/dev/null 2>&1 && return 0 ;;
        g++) command -v g++ >/dev/null 2>&1 && return 0 ;;
        libopenblas-dev) command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openblas && return 0 ;;
        zlib1g-dev) command -v pkg-config >/dev/null 2>&1 && pkg-config --exists zlib && return 0 ;;
        libyaml-dev) command -v pkg-config >/dev/null 2>&1 && pkg-config --exists yaml-0.1 && return 0 ;;
        wamerican) [ -s /usr/share/dict/american-english ] && return 0 ;;
        openmpi-bin) command -v mpirun >/dev/null 2>&1 && return 0 ;;
        libopenmpi-dev) command -v pkg-config >/dev/null 2>&1 && pkg-config --exists ompi-c && return 0 ;;
    esac
    command -v dpkg >/dev/null 2>&1 && dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'
}

missing=()
wanted=(meson ninja-build pkg-config gcc g++ libopenblas-dev zlib1g-dev libyaml-dev)
[ "${1:-}" = demo ] && wanted+=(wamerican)
for pkg in "${wanted[@]}"; do
    present "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]})); then
    if [ "$(id -u)" -eq 0 ]; then
        if ! command -v apt-get >/dev/null 2>&1; then
            echo "setup: missing ${missing[*]} and this machine has no apt-get; install them with your package manager" >&2
            exit 1
        fi
        echo "setup: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update
        apt-get install -y "${missing[@]}"
    else
        echo "setup: ember needs packages that are not installed: ${missing[*]}" >&2
        echo "Install them with:" >&2
        echo "sudo apt-get install -y ${missing[*]}"
        exit 1
    fi
fi

# Optional: OpenMPI, for the MPI transport (EMBER_TRANSPORT=mpi) and its
# tests under mpirun. Installed when root; otherwise the line is printed and
# ember builds without it.
mpi_missing=()
for pkg in openmpi-bin libopenmpi-dev; do
    present "$pkg" || mpi_missing+=("$pkg")
done
if ((${#mpi_missing[@]})); then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${mpi_missing[*]} (the MPI transport)"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get install -y "${mpi_missing[@]}" || { apt-get update && apt-get install -y "${mpi_missing[@]}"; }; } ||
            echo "setup: could not install ${mpi_missing[*]}; ember builds without the MPI transport" >&2
    else
        echo "setup: optional: for the MPI transport, sudo apt-get install -y ${mpi_missing[*]}" >&2
    fi
fi

if ! command -v meson >/dev/null 2>&1; then
    echo "setup: meson is still not on PATH after installing; install it and run again" >&2
    exit 1
fi

# meson too old for meson.build (e.g. Ubuntu 22.04 ships 0.61)
ver=$(meson --version)
if [ "$(printf '%s\n%s\n' "$MIN_MESON" "$ver" | sort -V | head -n1)" != "$MIN_MESON" ]; then
    echo "setup: meson $ver is older than the $MIN_MESON ember needs." >&2
    echo "Install a newer one, e.g.: python3 -m pip install --user 'meson>=$MIN_MESON'  (then put ~/.local/bin first in PATH)" >&2
    exit 1
fi

#!/bin/sh
# Build llama.cpp's llama-server and llama-speculative-simple (they run DFlash drafts: --spec-type draft-dflash)
# into DEST, from the llama.cpp that the llama-cpp-python sdist bundles (its source is reachable here only that way).
#   sh scripts/peers/build_llamacpp.sh DEST PYTHON
# Release, CPU only, native ISA; only the two targets (a full build takes over half an hour on two cores), at
# nice 19 so the rest of the machine keeps working. Rerun: an existing build is reused, cmake rebuilds nothing.
set -eu
DEST=$1
PYTHON=$2
VERSION=0.3.36
mkdir -p "$DEST"
if [ ! -f "$DEST/src/CMakeLists.txt" ]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DEST/sdist"
    tar xzf "$DEST/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$DEST/sdist"
    rm -rf "$DEST/src"
    mv "$DEST/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DEST/src"
    rm -rf "$DEST/sdist"
fi
# No web UI (the prebuilt one is downloaded), no HTTPS, static binaries that run from any folder.
nice -n 19 cmake -S "$DEST/src" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    > "$DEST/cmake.log"
nice -n 19 cmake --build "$DEST/build" --config Release -j "$(nproc)" --target llama-server llama-speculative-simple

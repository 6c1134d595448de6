# Cross build for AArch64 Linux with Debian's g++-aarch64-linux-gnu, against
# the arm64 libraries of Debian's multiarch (libzstd-dev:arm64,
# libgtest-dev:arm64 in /usr/lib/aarch64-linux-gnu). Binaries run under
# qemu-aarch64 (scripts/test-aarch64.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and packages of the target only; headers-only packages
# (nlohmann_json in /usr/share) are found too.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
# At run time the loader, libc and libzstd all come from Debian's multiarch
# arm64 packages (/lib/ld-linux-aarch64.so.1, /lib/aarch64-linux-gnu), and
# libstdc++/libgcc are linked in. Running with the cross sysroot instead
# (qemu-aarch64 -L /usr/aarch64-linux-gnu) mixes that sysroot's loader with
# the multiarch libc (two builds of glibc 2.36), and the first
# pthread_create then never returns.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static-libstdc++ -static-libgcc")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)

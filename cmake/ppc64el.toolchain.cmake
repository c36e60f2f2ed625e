# Cross-compiling for ppc64el (64-bit POWER, little endian) with Debian's cross toolchain and multiarch packages:
#   apt-get install crossbuild-essential-ppc64el libucx-dev:ppc64el libgtest-dev:ppc64el libstdc++6:ppc64el qemu-user
#   cmake -S . -B build-ppc64el -DCMAKE_TOOLCHAIN_FILE=cmake/ppc64el.toolchain.cmake -DDDL_BUILD_SERVICE=OFF
# scripts/cross-ppc64el does all of it and runs the tests under qemu-user.
#
# Where things are on Debian: the cross compilers' own libc and libstdc++ under /usr/powerpc64le-linux-gnu
# (libc6-dev-ppc64el-cross, libstdc++-12-dev-ppc64el-cross), everything installed as pkg:ppc64el in the multiarch
# directories /usr/lib/powerpc64le-linux-gnu (libraries, CMake packages, .pc files) and /usr/include (headers,
# identical for every architecture). Programs (protoc, grpc_cpp_plugin, pkg-config) are the host's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ppc64le)
set(DDL_CROSS_TRIPLET powerpc64le-linux-gnu)

set(CMAKE_C_COMPILER ${DDL_CROSS_TRIPLET}-gcc)
set(CMAKE_CXX_COMPILER ${DDL_CROSS_TRIPLET}-g++)
# The multiarch directory name: find_library and find_package look in <prefix>/lib/<this> first, and never in the
# host's /usr/lib/x86_64-linux-gnu.
set(CMAKE_LIBRARY_ARCHITECTURE ${DDL_CROSS_TRIPLET})

# Look for libraries, headers and CMake packages in the cross root and in / (for the multiarch directories, which
# CMAKE_LIBRARY_ARCHITECTURE selects); programs on the host only.
set(CMAKE_FIND_ROOT_PATH /usr/${DDL_CROSS_TRIPLET} /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (the host's) reads the ppc64el .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${DDL_CROSS_TRIPLET}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Test binaries run under qemu-user (gtest_discover_tests lists their cases at build time, ctest runs them), on
# the multiarch runtime: libc6:ppc64el (which libucx0:ppc64el pulls in) gives /lib64/ld64.so.2, libstdc++6:ppc64el
# the C++ library. No -L /usr/powerpc64le-linux-gnu: with libc6:ppc64el installed, that prefix's loader (from
# libc6-ppc64el-cross) would load the multiarch libc.so.6, a different build, and every program dies at start with
# "*** stack smashing detected ***". No binfmt_misc registration is needed either.
find_program(DDL_PPC64EL_QEMU NAMES qemu-ppc64le qemu-ppc64le-static)
if(DDL_PPC64EL_QEMU)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${DDL_PPC64EL_QEMU})
endif()

# Third-party libraries of the build, each behind one target of its own:
#   tz::zstd    libzstd (required by the codec library)
#   tz::xxhash  libxxhash (the container, the checkpoint engine and their tests;
#               optional: without it those parts are left out)
#   tz::uring   liburing (optional: src/io then has the pread/pwrite threads only)
# GoogleTest is looked up by tz_find_gtest() (tests/CMakeLists.txt), and
# nlohmann_json by find_package as before.
#
# Each is looked up in this order:
#  1. pkg-config, where it is installed (the Debian -dev packages of
#     scripts/deps.sh: the ordinary build, unchanged by this file);
#  2. the folder TZ_DEPS_DIR, when given: the unpacked dependencies that
#     bench/gpu/prepare.sh brings to a machine without the -dev packages (the
#     GPU machine's image), with sources where a library must be compiled
#     there (zstd/, googletest/, xxhash/) and headers and static libraries
#     (include/, lib/) for the rest; it is also put first on CMAKE_PREFIX_PATH,
#     so that find_package(nlohmann_json) finds share/cmake/nlohmann_json;
#  3. find_path/find_library on the usual paths (a -dev package without
#     pkg-config).
set(TZ_DEPS_DIR "" CACHE PATH
    "Dependencies brought along for a machine without the -dev packages (bench/gpu/prepare.sh)")
if(TZ_DEPS_DIR)
  if(NOT IS_DIRECTORY "${TZ_DEPS_DIR}")
    message(FATAL_ERROR "TZ_DEPS_DIR=${TZ_DEPS_DIR} is not a folder")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${TZ_DEPS_DIR}")
endif()
find_package(PkgConfig QUIET)

# NAME: tz::NAME to define; PC: pkg-config module; HEADER, LIBNAMES: for
# find_path/find_library; SOURCE_SUBDIR: cmake/deps/<NAME> builds it from
# ${TZ_DEPS_DIR}/<SOURCE_SUBDIR> when that folder exists.
function(tz_find_library_dependency NAME PC HEADER LIBNAMES SOURCE_SUBDIR)
  set(target tz_dep_${NAME})
  set(how "")
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(TZ_PC_${NAME} QUIET IMPORTED_TARGET GLOBAL ${PC})
    if(TZ_PC_${NAME}_FOUND)
      add_library(${target} INTERFACE)
      target_link_libraries(${target} INTERFACE PkgConfig::TZ_PC_${NAME})
      set(how "pkg-config ${PC} ${TZ_PC_${NAME}_VERSION}")
    endif()
  endif()
  if(NOT how AND TZ_DEPS_DIR AND SOURCE_SUBDIR AND IS_DIRECTORY "${TZ_DEPS_DIR}/${SOURCE_SUBDIR}")
    set(TZ_DEP_SOURCE_DIR "${TZ_DEPS_DIR}/${SOURCE_SUBDIR}")
    add_subdirectory(${PROJECT_SOURCE_DIR}/cmake/deps/${NAME} ${PROJECT_BINARY_DIR}/_deps/${NAME})
    set(how "built from ${TZ_DEP_SOURCE_DIR}")
  endif()
  if(NOT how)
    find_path(TZ_${NAME}_INCLUDE_DIR ${HEADER})
    find_library(TZ_${NAME}_LIBRARY NAMES ${LIBNAMES})
    if(TZ_${NAME}_INCLUDE_DIR AND TZ_${NAME}_LIBRARY)
      add_library(${target} INTERFACE)
      target_include_directories(${target} INTERFACE ${TZ_${NAME}_INCLUDE_DIR})
      target_link_libraries(${target} INTERFACE ${TZ_${NAME}_LIBRARY})
      set(how "${TZ_${NAME}_LIBRARY}")
    endif()
  endif()
  if(how)
    add_library(tz::${NAME} ALIAS ${target})
    message(STATUS "${NAME}: ${how}")
  endif()
endfunction()

tz_find_library_dependency(zstd libzstd zstd.h "zstd;libzstd.a" zstd)
if(NOT TARGET tz::zstd)
  message(FATAL_ERROR "libzstd not found: install libzstd-dev (scripts/deps.sh), or give -DTZ_DEPS_DIR= "
                      "a folder made by bench/gpu/prepare.sh")
endif()
tz_find_library_dependency(xxhash libxxhash xxhash.h "xxhash;libxxhash.a" xxhash)
tz_find_library_dependency(uring liburing liburing.h "uring;liburing.a" "")

# GoogleTest: an installed package (FindGTest: CMake config or headers and
# libraries), else its sources from TZ_DEPS_DIR/googletest (laid out as
# libgtest-dev's /usr/src/googletest: the top CMakeLists.txt and googletest/),
# built here with the project, without GoogleMock. Call once, from tests/: the
# targets GTest::gtest and GTest::gtest_main are then seen by every test folder.
macro(tz_find_gtest)
  if(NOT TARGET GTest::gtest)
    if(TZ_DEPS_DIR AND EXISTS "${TZ_DEPS_DIR}/googletest/CMakeLists.txt")
      find_package(GTest QUIET)
    else()
      find_package(GTest REQUIRED)
    endif()
  endif()
  if(NOT TARGET GTest::gtest)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    # Its cmake_minimum_required(3.5): CMake 4 warns below 3.10, and later ones refuse it.
    set(CMAKE_POLICY_VERSION_MINIMUM 3.10)
    add_subdirectory("${TZ_DEPS_DIR}/googletest" ${PROJECT_BINARY_DIR}/_deps/googletest EXCLUDE_FROM_ALL)
    unset(CMAKE_POLICY_VERSION_MINIMUM)
    foreach(lib gtest gtest_main)
      if(NOT TARGET GTest::${lib})  # GoogleTest >= 1.11 names them so itself
        add_library(GTest::${lib} ALIAS ${lib})
      endif()
    endforeach()
    message(STATUS "GoogleTest: built from ${TZ_DEPS_DIR}/googletest")
  endif()
endmacro()

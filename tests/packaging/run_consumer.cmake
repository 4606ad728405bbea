# Builds and runs tests/packaging/consumer against gpumem brought in one way (MODE), from a clean
# work directory. Run by ctest (tests/CMakeLists.txt, label "packaging"):
#
#   cmake -DMODE=find_package|add_subdirectory|fetchcontent -DSOURCE_DIR=<gpumem source>
#         -DWORK_DIR=<build>/tests/packaging/<mode> -DGENERATOR=<generator>
#         [-DGENERATOR_PLATFORM=...] [-DGENERATOR_TOOLSET=...] [-DMAKE_PROGRAM=...]
#         [-DCXX_COMPILER=...] [-DBUILD_TYPE=<config>] [-DVERSION=<gpumem version>]
#         [-DPREFIX_PATH=<dir>|<dir>...] -P run_consumer.cmake
#
# find_package: configures gpumem alone (tests, benchmarks, examples, tools off), installs it into
# WORK_DIR/prefix, checks every public header was installed, then builds the consumer with
# CMAKE_PREFIX_PATH=WORK_DIR/prefix (plus PREFIX_PATH, '|'-separated, for where gpumem's own
# dependencies live). The other modes build the consumer straight from SOURCE_DIR.
cmake_minimum_required(VERSION 3.20)

foreach(var IN ITEMS MODE SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(find_package|add_subdirectory|fetchcontent)$")
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()
# WORK_DIR is deleted first: insist on a dedicated directory.
if(NOT IS_ABSOLUTE "${WORK_DIR}" OR NOT WORK_DIR MATCHES "/packaging/[A-Za-z0-9_.-]+/?$")
  message(FATAL_ERROR "run_consumer.cmake: WORK_DIR '${WORK_DIR}' must be an absolute "
                      "<something>/packaging/<name> directory (it is deleted)")
endif()

set(consumer_source "${CMAKE_CURRENT_LIST_DIR}/consumer")
set(consumer_build "${WORK_DIR}/consumer-build")
set(prefix "${WORK_DIR}/prefix")

# Options every configure step gets: the parent build's generator, compiler and configuration.
set(common_args -G "${GENERATOR}")
if(GENERATOR_PLATFORM)
  list(APPEND common_args -A "${GENERATOR_PLATFORM}")
endif()
if(GENERATOR_TOOLSET)
  list(APPEND common_args -T "${GENERATOR_TOOLSET}")
endif()
if(MAKE_PROGRAM)
  list(APPEND common_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX_COMPILER)
  list(APPEND common_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(BUILD_TYPE)
  list(APPEND common_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
  set(config_args --config "${BUILD_TYPE}")
else()
  set(config_args "")
endif()
string(REPLACE "|" ";" prefix_path "${PREFIX_PATH}")

# Runs one step; stops the test with the step's name when it fails. Output goes to ctest's log.
function(step name)
  string(TIMESTAMP start "%s")
  message(STATUS "[packaging.${MODE}] ${name}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  string(TIMESTAMP stop "%s")
  math(EXPR seconds "${stop} - ${start}")
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "[packaging.${MODE}] step '${name}' failed (${rc}) after ${seconds} s:\n"
                        "  ${command}")
  endif()
  message(STATUS "[packaging.${MODE}] ${name}: ok (${seconds} s)")
endfunction()

# CMAKE_PREFIX_PATH is a list, which cannot travel through a CMake list of arguments: it goes in
# an initial-cache script (cmake -C) instead.
function(write_prefix_path file list)
  file(WRITE "${file}" "set(CMAKE_PREFIX_PATH [==[${list}]==] CACHE STRING \"\")\n")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(consumer_args "-DGPUMEM_CONSUMER_MODE=${MODE}" "-DGPUMEM_SOURCE_DIR=${SOURCE_DIR}"
                  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

if(MODE STREQUAL "find_package")
  set(gpumem_build "${WORK_DIR}/gpumem-build")
  write_prefix_path("${WORK_DIR}/gpumem-init.cmake" "${prefix_path}")
  step("configure gpumem" "${CMAKE_COMMAND}" -C "${WORK_DIR}/gpumem-init.cmake"
       -S "${SOURCE_DIR}" -B "${gpumem_build}" ${common_args} "-DCMAKE_INSTALL_PREFIX=${prefix}"
       -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_BENCHMARKS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF
       -DGPUMEM_BUILD_TOOLS=OFF)
  step("build gpumem" "${CMAKE_COMMAND}" --build "${gpumem_build}" ${config_args})
  step("install gpumem" "${CMAKE_COMMAND}" --install "${gpumem_build}" ${config_args})

  # Every public header is installed, at the same relative path.
  file(GLOB_RECURSE headers RELATIVE "${SOURCE_DIR}/include" "${SOURCE_DIR}/include/gpumem/*.hpp")
  if(NOT headers)
    message(FATAL_ERROR "[packaging.${MODE}] no headers under ${SOURCE_DIR}/include/gpumem")
  endif()
  set(missing "")
  foreach(header IN LISTS headers)
    if(NOT EXISTS "${prefix}/include/${header}")
      list(APPEND missing "${header}")
    endif()
  endforeach()
  if(missing)
    list(JOIN missing "\n  " missing)
    message(FATAL_ERROR "[packaging.${MODE}] headers not installed under ${prefix}/include:\n"
                        "  ${missing}")
  endif()
  list(LENGTH headers count)
  message(STATUS "[packaging.${MODE}] all ${count} public headers installed")

  list(PREPEND prefix_path "${prefix}")
  list(APPEND consumer_args "-DGPUMEM_EXPECTED_PREFIX=${prefix}")
  if(VERSION)
    list(APPEND consumer_args "-DGPUMEM_EXPECTED_VERSION=${VERSION}")
  endif()
endif()
write_prefix_path("${WORK_DIR}/consumer-init.cmake" "${prefix_path}")

step("configure consumer" "${CMAKE_COMMAND}" -C "${WORK_DIR}/consumer-init.cmake"
     -S "${consumer_source}" -B "${consumer_build}"
     ${common_args} ${consumer_args})
step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})

# The consumer writes where its executables are (generator- and configuration-independent).
set(paths_file "${consumer_build}/gpumem_consumer_paths-${BUILD_TYPE}.cmake")
if(NOT EXISTS "${paths_file}")
  message(FATAL_ERROR "[packaging.${MODE}] the consumer did not write ${paths_file}")
endif()
include("${paths_file}")
step("run consumer" "${GPUMEM_CONSUMER_EXE}")
step("run CUDA consumer" "${GPUMEM_CONSUMER_CUDA_EXE}")
message(STATUS "[packaging.${MODE}] passed")

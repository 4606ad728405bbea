# gpumem CUDA simulator — checks that a simulated library can stand in for the real one.
#
#   cmake -DREADELF=readelf -DOBJDUMP=objdump -DSIM=<simulated library> -DREAL=<toolkit library>
#         -DSONAME=<expected SONAME> -P check_abi.cmake
#
# Fails unless: `readelf -d` shows SONAME for both; the version node names that `objdump -T` shows
# on the defined symbols are the same set for both (libcudart.so.13 for the runtime, none for the
# driver); and every function the real library exports is exported by the simulated one with the
# same version node.
cmake_minimum_required(VERSION 3.20)

foreach(var IN ITEMS READELF OBJDUMP SIM REAL SONAME)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_abi.cmake: ${var} is not set")
  endif()
endforeach()

function(soname_of file out)
  execute_process(COMMAND "${READELF}" -d "${file}" OUTPUT_VARIABLE text RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${READELF} -d ${file} failed")
  endif()
  if(text MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    set(${out} "<none>" PARENT_SCOPE)
  endif()
endfunction()

# Defined functions as "name@node" ("name@" when unversioned), and the set of node names.
function(exports_of file out_functions out_nodes)
  execute_process(COMMAND "${OBJDUMP}" -T "${file}" OUTPUT_VARIABLE text RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${OBJDUMP} -T ${file} failed")
  endif()
  string(REPLACE "\n" ";" lines "${text}")
  set(functions "")
  set(nodes "")
  foreach(line IN LISTS lines)
    # <value> <flags, 7 columns> <section>\t<size> [<version>] <name>; skip undefined symbols.
    if(NOT line MATCHES "^[0-9a-f]+ (.......) ([^\t ]+)\t[0-9a-f]+ +(.*)$")
      continue()
    endif()
    set(flags "${CMAKE_MATCH_1}")
    set(section "${CMAKE_MATCH_2}")
    string(STRIP "${CMAKE_MATCH_3}" rest)
    if(section STREQUAL "*UND*")
      continue()
    endif()
    string(REGEX REPLACE " +" ";" fields "${rest}")
    list(LENGTH fields n)
    list(GET fields -1 name)
    set(node "")
    if(n GREATER 1)
      list(GET fields 0 node)
      string(REGEX REPLACE "^\\((.*)\\)$" "\\1" node "${node}")  # a hidden version: (node)
    endif()
    if(node STREQUAL "Base")  # objdump's name for the global, unversioned index
      set(node "")
    endif()
    if(NOT node STREQUAL "")
      list(APPEND nodes "${node}")
    endif()
    if(flags MATCHES "F")  # a function
      list(APPEND functions "${name}@${node}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES nodes)
  list(SORT nodes)
  set(${out_functions} "${functions}" PARENT_SCOPE)
  set(${out_nodes} "${nodes}" PARENT_SCOPE)
endfunction()

set(problems "")

soname_of("${REAL}" real_soname)
soname_of("${SIM}" sim_soname)
if(NOT real_soname STREQUAL SONAME)
  string(APPEND problems "  the real library's SONAME is ${real_soname}, expected ${SONAME}\n")
endif()
if(NOT sim_soname STREQUAL SONAME)
  string(APPEND problems "  the simulated library's SONAME is ${sim_soname}, expected ${SONAME}\n")
endif()

exports_of("${REAL}" real_functions real_nodes)
exports_of("${SIM}" sim_functions sim_nodes)
if(NOT real_nodes STREQUAL sim_nodes)
  string(APPEND problems
         "  version nodes differ: real [${real_nodes}], simulated [${sim_nodes}]\n")
endif()
list(LENGTH real_functions real_count)
if(real_count EQUAL 0)
  string(APPEND problems "  found no exported function in ${REAL}\n")
endif()
set(missing "")
foreach(f IN LISTS real_functions)
  if(NOT f IN_LIST sim_functions)
    list(APPEND missing "${f}")
  endif()
endforeach()
list(LENGTH missing missing_count)
if(missing_count GREATER 0)
  list(SUBLIST missing 0 20 first)
  string(APPEND problems
         "  ${missing_count} of the real library's functions are not exported (name@version), "
         "first: ${first}\n")
endif()

list(LENGTH sim_functions sim_count)
message(STATUS "real ${REAL}: SONAME ${real_soname}, version nodes [${real_nodes}], "
               "${real_count} functions")
message(STATUS "simulated ${SIM}: SONAME ${sim_soname}, version nodes [${sim_nodes}], "
               "${sim_count} functions")
if(NOT problems STREQUAL "")
  message(FATAL_ERROR "the simulated library cannot stand in for the real one:\n${problems}")
endif()

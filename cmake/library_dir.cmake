# SCALIFY_LIBRARY_DIR: the Python extension links the libscalify.a of a configured build tree of
# this same checkout (scripts/build.sh's build/) instead of compiling src/ again. The tree is
# brought up to date before the link (cmake --build DIR --target scalify: nothing to do after
# scripts/build.sh). Refused, with the reason, when the tree cannot serve.
get_filename_component(_scalify_dir "${SCALIFY_LIBRARY_DIR}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
set(_scalify_refuse "SCALIFY_LIBRARY_DIR=${SCALIFY_LIBRARY_DIR} (${_scalify_dir}) cannot be used:")
if(NOT SCALIFY_BUILD_PYTHON OR SCALIFY_BUILD_APPS OR SCALIFY_BUILD_TESTS OR SCALIFY_BUILD_BENCH)
  message(FATAL_ERROR "SCALIFY_LIBRARY_DIR is for the Python package's build only (SCALIFY_BUILD_PYTHON=ON, apps, tests and benchmarks OFF, as pip install . sets them)")
endif()
if(NOT EXISTS "${_scalify_dir}/CMakeCache.txt")
  message(FATAL_ERROR "${_scalify_refuse} not a configured CMake build tree. Configure and build it first (scripts/build.sh builds build/), or leave SCALIFY_LIBRARY_DIR unset to compile the library here.")
endif()
if(NOT EXISTS "${_scalify_dir}/scalifyBuildTree.cmake")
  message(FATAL_ERROR "${_scalify_refuse} it exports no library (no scalifyBuildTree.cmake): configure it again with this checkout's CMakeLists.txt, without SCALIFY_BUILD_PYTHON (scripts/build.sh).")
endif()
include("${_scalify_dir}/scalifyBuildTree.cmake")
file(REAL_PATH "${SCALIFY_TREE_SOURCE_DIR}" _scalify_tree_src)
file(REAL_PATH "${CMAKE_SOURCE_DIR}" _scalify_this_src)
if(NOT _scalify_tree_src STREQUAL _scalify_this_src)
  message(FATAL_ERROR "${_scalify_refuse} it was configured from ${_scalify_tree_src}, not from this checkout (${_scalify_this_src}): its library may hold other code.")
endif()
if(NOT SCALIFY_TREE_PIC)
  message(FATAL_ERROR "${_scalify_refuse} its library is built without position-independent code, which a Python extension needs (configure it with CMAKE_POSITION_INDEPENDENT_CODE=ON).")
endif()
if(NOT SCALIFY_TREE_CXX_COMPILER STREQUAL "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
  message(FATAL_ERROR "${_scalify_refuse} it was compiled by ${SCALIFY_TREE_CXX_COMPILER}, this build uses ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}.")
endif()
find_package(scalify CONFIG REQUIRED PATHS "${_scalify_dir}" NO_DEFAULT_PATH)
add_custom_target(scalify_library_dir_build
  COMMAND ${CMAKE_COMMAND} --build "${_scalify_dir}" --target scalify
  BYPRODUCTS "${SCALIFY_TREE_LIBRARY}"
  COMMENT "Bringing ${_scalify_dir}'s libscalify.a up to date"
  USES_TERMINAL VERBATIM)
message(STATUS "scalify: linking ${SCALIFY_TREE_LIBRARY} (${SCALIFY_TREE_BUILD_TYPE}), not compiling src/")

# Makes this build tree usable by another build of the same checkout as SCALIFY_LIBRARY_DIR (the
# Python package: pip install --config-settings=cmake.define.SCALIFY_LIBRARY_DIR=build .): the
# library exported as scalify::scalify (scalifyTargets.cmake, found with scalifyConfig.cmake) and
# what the other build checks before linking it (scalifyBuildTree.cmake).
export(TARGETS scalify NAMESPACE scalify:: FILE ${CMAKE_BINARY_DIR}/scalifyTargets.cmake)
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/scalifyBuildTree.cmake CONTENT
"set(SCALIFY_TREE_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\")
set(SCALIFY_TREE_LIBRARY \"$<TARGET_FILE:scalify>\")
set(SCALIFY_TREE_PIC \"$<BOOL:$<TARGET_PROPERTY:scalify,POSITION_INDEPENDENT_CODE>>\")
set(SCALIFY_TREE_BUILD_TYPE \"${CMAKE_BUILD_TYPE}\")
set(SCALIFY_TREE_CXX_COMPILER \"${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}\")
")

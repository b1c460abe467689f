# Caps parallel compile jobs by the cores and the memory free at configure time (Ninja only: pip's
# build through scikit-build-core uses Ninja, whose default of cores + 2 jobs makes a 2-core machine
# shared with others crawl and a small one run out of memory). One compile job of this project
# peaks at about SCALIFY_COMPILE_JOB_MIB (measured with /usr/bin/time -v: docs/BENCHMARKS.md).
# Make's -j is the caller's (scripts/build.sh passes -j$(nproc)).
set(SCALIFY_COMPILE_JOB_MIB 1024 CACHE STRING "Memory one compile job may take (MiB), to cap parallel jobs under Ninja")
if(CMAKE_GENERATOR MATCHES "Ninja")
  cmake_host_system_information(RESULT _scalify_cores QUERY NUMBER_OF_LOGICAL_CORES)
  cmake_host_system_information(RESULT _scalify_free_mib QUERY AVAILABLE_PHYSICAL_MEMORY)
  math(EXPR _scalify_jobs "${_scalify_free_mib} / ${SCALIFY_COMPILE_JOB_MIB}")
  if(_scalify_jobs GREATER _scalify_cores)
    set(_scalify_jobs ${_scalify_cores})
  endif()
  if(_scalify_jobs LESS 1)
    set(_scalify_jobs 1)
  endif()
  set_property(GLOBAL APPEND PROPERTY JOB_POOLS scalify_compile=${_scalify_jobs})
  set(CMAKE_JOB_POOL_COMPILE scalify_compile)
  message(STATUS "scalify: at most ${_scalify_jobs} compile jobs (${_scalify_cores} cores, ${_scalify_free_mib} MiB free, ${SCALIFY_COMPILE_JOB_MIB} MiB a job)")
endif()

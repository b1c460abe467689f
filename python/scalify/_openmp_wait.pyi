"""OpenMP's wait, chosen before libgomp loads (src/scalify/platform/openmp_wait.hpp): no public names."""

# The gateway benchmark (bench/gateway/run.sh, run by bench/run): its fake
# upstream, a small C server, so that the upstream is never what limits
# the figures. Named gw_bench_upstream, not bench_*, because bench/run
# runs every bench_* executable as a benchmark of its own.
add_executable(gw_bench_upstream ${CMAKE_CURRENT_LIST_DIR}/gateway/upstream.c)

# The gateway benchmark (bench/gateway/run.sh, run by bench/run): its fake
# upstream, a small C server, so that the upstream is never what limits
# the figures. Named gw_bench_upstream, not bench_*, because bench/run
# runs every bench_* executable as a benchmark of its own.
add_executable(gw_bench_upstream ${CMAKE_CURRENT_LIST_DIR}/gateway/upstream.c)

# gateway_ir: the gateway's instructions per request under callgrind, for
# A/B comparisons on a noisy machine (bench/README.md). Not a bench_*
# program, so bench/run does not run it.
add_executable(gateway_ir ${CMAKE_CURRENT_LIST_DIR}/gateway_ir.c)
target_include_directories(gateway_ir PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(gateway_ir PRIVATE loopguard_static)
add_dependencies(gateway_ir loopguard_cli gw_bench_upstream)
target_compile_definitions(gateway_ir PRIVATE
  LG_BIN_PATH="$<TARGET_FILE:loopguard_cli>"
  LG_UPSTREAM_PATH="$<TARGET_FILE:gw_bench_upstream>"
  LG_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

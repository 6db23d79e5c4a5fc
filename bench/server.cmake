# bench_server: the HTTP sidecar under wrk (decisions per second, p50/p99,
# on SQLite and PostgreSQL) and its memory per tracked run (bench/README.md,
# "Server"). Included by bench/CMakeLists.txt; owned by the server module.
# It runs the loopguard binary of this build, the wrk script beside it and,
# without $LG_PG_URL, a throwaway PostgreSQL through tests/pg/with-postgres.sh.
add_executable(bench_server ${CMAKE_CURRENT_LIST_DIR}/bench_server.c)
target_include_directories(bench_server PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(bench_server PRIVATE loopguard_static)
add_dependencies(bench_server loopguard_cli)
target_compile_definitions(bench_server PRIVATE
  LG_BIN_PATH="$<TARGET_FILE:loopguard_cli>"
  LG_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  LG_PG_HARNESS="${CMAKE_SOURCE_DIR}/tests/pg/with-postgres.sh")

# server_ir: the server's instructions per decision under callgrind, for
# A/B comparisons on a noisy machine (bench/README.md). Not a bench_*
# program, so bench/run does not run it.
add_executable(server_ir ${CMAKE_CURRENT_LIST_DIR}/server_ir.c)
target_include_directories(server_ir PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(server_ir PRIVATE loopguard_static)
add_dependencies(server_ir loopguard_cli)
target_compile_definitions(server_ir PRIVATE LG_BIN_PATH="$<TARGET_FILE:loopguard_cli>")

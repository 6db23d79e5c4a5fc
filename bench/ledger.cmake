# bench_ledger: durable ledger claims per second on SQLite and PostgreSQL,
# each beside a bare single-row INSERT ... ON CONFLICT DO NOTHING loop on
# the same database (bench/README.md, "Ledger"). Included by
# bench/CMakeLists.txt; owned by the store module.
add_executable(bench_ledger ${CMAKE_CURRENT_LIST_DIR}/bench_ledger.c)
target_include_directories(bench_ledger PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(bench_ledger PRIVATE loopguard_static)
# Without $LG_PG_URL the benchmark starts its own throwaway server.
target_compile_definitions(bench_ledger PRIVATE
  LG_PG_HARNESS="${CMAKE_SOURCE_DIR}/tests/pg/with-postgres.sh")

# bench_budget: shared-budget reserve + settle cycles per second on SQLite
# and PostgreSQL, each beside a bare single-row durable UPDATE loop on the
# same database (docs/budget.md, "Tests and benchmark"). Included by
# bench/CMakeLists.txt; owned by the budget module.
add_executable(bench_budget ${CMAKE_CURRENT_LIST_DIR}/bench_budget.c)
target_include_directories(bench_budget PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(bench_budget PRIVATE loopguard_static)
# Without $LG_PG_URL the benchmark starts its own throwaway server.
target_compile_definitions(bench_budget PRIVATE
  LG_PG_HARNESS="${CMAKE_SOURCE_DIR}/tests/pg/with-postgres.sh")

# baton_test(NAME SOURCES... [LIBS libs...] [LABELS labels...])
# One helper registers every unit test: it builds NAME from SOURCES linked with gtest_main,
# and adds it to ctest. Tests live beside the code they test.
# PREFIX names the tests of a binary that shares its sources with another (the CUDA build
# of a CPU test): without it the two register the same names and ctest keeps only one.
function(baton_test name)
  cmake_parse_arguments(T "" "PREFIX" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 TEST_PREFIX "${T_PREFIX}"
                       PROPERTIES LABELS "${T_LABELS}")
endfunction()
include(GoogleTest)

# ctest driver: the README's C++ example must be the code between "// example-begin" and
# "// example-end" in tests/test_readme_example.cpp, which the test suite compiles and runs, and its C
# example the package test's C consumer.
file(READ "${SOURCE_DIR}/README.md" readme)
file(READ "${SOURCE_DIR}/tests/test_readme_example.cpp" source)
string(REGEX MATCH "// example-begin\n(.*)// example-end" _ "${source}")
set(example "${CMAKE_MATCH_1}")
if(example STREQUAL "")
  message(FATAL_ERROR "no example markers in tests/test_readme_example.cpp")
endif()
string(FIND "${readme}" "```cpp\n${example}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not show the example of tests/test_readme_example.cpp verbatim")
endif()
# and the C consumer of the package test, whole
file(READ "${SOURCE_DIR}/tests/consumer/main.c" c_example)
string(FIND "${readme}" "```c\n${c_example}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not show tests/consumer/main.c verbatim")
endif()
message(STATUS "README examples in sync")

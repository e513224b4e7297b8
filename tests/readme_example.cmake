# Writes the C++ example of README.md (its first ```cpp block) into a function
# body that the build compiles (the kda_readme_example target), so that the
# README's example cannot drift from the API: cmake -P with -DREADME=<README.md>
# -DOUT=<file.cc>. The example's free names (rows, n) are the function's
# parameters. The file is rewritten only when its content changes.
file(READ "${README}" text)
string(FIND "${text}" "```cpp\n" begin)
if(begin LESS 0)
  message(FATAL_ERROR "${README}: no ```cpp block")
endif()
math(EXPR begin "${begin} + 7")
string(SUBSTRING "${text}" ${begin} -1 rest)
string(FIND "${rest}" "```" end)
string(SUBSTRING "${rest}" 0 ${end} example)
# The #include lines stay at file scope; the rest becomes the body.
string(REGEX MATCHALL "#include [^\n]*\n" includes "${example}")
string(REGEX REPLACE "#include [^\n]*\n" "" body "${example}")
string(REPLACE ";" "" includes "${includes}")
set(content "// Generated from README.md by tests/readme_example.cmake: compiled, never run.
${includes}
#include <cstdint>

[[maybe_unused]] void ReadmeExample(const void* rows, int64_t n) {
${body}}
")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT "${old}" STREQUAL "${content}")
  file(WRITE "${OUT}" "${content}")
endif()

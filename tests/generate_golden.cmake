# Writes the golden sets that are generated at test time (cmake -P; the
# golden_generate CTest fixture): -DPYTHON=<python3> -DSCRIPT=<kda_ref.py>
# -DOUT=<build>/golden. A set is regenerated only when its command line or the
# script changed. Without python3+numpy or the script, nothing is written and
# the reason goes to OUT/NOT_GENERATED, which the tests show when they skip;
# under KDA_REQUIRE_GOLDEN=1 that is a failure.

# kda-real: the real model's KDA shapes (hidden 2304, 32 heads x 128) with a
# small batch: four sequences, one over a 64-token chunk, one of a single
# token, with initial states (T = 120: ~1 min on two cores, mostly writing
# the 3-layer checkpoint, two shards).
set(REAL_ARGS --hidden 2304 --heads 32 --head-dim 128 --shards 2 --seed 20261201
    --cases real_varlen_initstate:7+70+1+42:init)

set(NOTE "${OUT}/NOT_GENERATED")
file(MAKE_DIRECTORY "${OUT}")

function(not_generated reason)
  file(REMOVE_RECURSE "${OUT}/kda-real")
  if("$ENV{KDA_REQUIRE_GOLDEN}" STREQUAL "1")
    file(WRITE "${NOTE}" "${reason}\n")
    message(FATAL_ERROR "golden sets not generated: ${reason}")
  endif()
  file(WRITE "${NOTE}" "${reason}\n")
  message(STATUS "golden sets not generated (the tests that need them skip): ${reason}")
endfunction()

if(NOT EXISTS "${SCRIPT}")
  not_generated("${SCRIPT} not found")
  return()
endif()
if(NOT EXISTS "${PYTHON}")
  not_generated("${PYTHON} not found (Debian package python3)")
  return()
endif()
execute_process(COMMAND "${PYTHON}" -c "import numpy" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0)
  not_generated("${PYTHON} cannot import numpy (Debian package python3-numpy)")
  return()
endif()

set(STAMP "${OUT}/kda-real/STAMP")
file(SHA256 "${SCRIPT}" script_hash)
string(JOIN " " want_stamp ${REAL_ARGS} "${script_hash}")
if(EXISTS "${STAMP}")
  file(READ "${STAMP}" have_stamp)
  if(have_stamp STREQUAL want_stamp)
    file(REMOVE "${NOTE}")
    message(STATUS "kda-real up to date")
    return()
  endif()
endif()

# Into a scratch directory first: a half-written set is never used.
file(REMOVE_RECURSE "${OUT}/kda-real" "${OUT}/kda-real.tmp")
execute_process(COMMAND "${PYTHON}" "${SCRIPT}" "${OUT}/kda-real.tmp" ${REAL_ARGS} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE_RECURSE "${OUT}/kda-real.tmp")
  message(FATAL_ERROR "${SCRIPT} failed (exit ${rc})")
endif()
file(WRITE "${OUT}/kda-real.tmp/STAMP" "${want_stamp}")
file(RENAME "${OUT}/kda-real.tmp" "${OUT}/kda-real")
file(REMOVE "${NOTE}")

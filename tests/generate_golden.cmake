# Writes the golden sets that are generated at test time (cmake -P; the
# golden_generate CTest fixture): -DPYTHON=<python3>
# -DDELTA_RULE_SCRIPT=<tools/delta_rule_ref.py>
# -DMAMBA2_SCRIPT=<tools/mamba2_ref.py> -DOUT=<build>/golden. A set is
# regenerated only when its command line, its script or a module the script
# imports changed. Without the script (or python3 with numpy) no set is
# written and the reason goes to OUT/NOT_GENERATED, which the tests show when
# they skip; under KDA_REQUIRE_GOLDEN=1 that is a failure.

# The delta-rule sets, written by the project's own float64 reference (tools/delta_rule_ref.py; about a
# minute on two cores, most of it kda-real's 240 MB checkpoint): the sets every test runs on (Kimi-Linear's
# kda-mini, kda-stress, kda-loud; Qwen3-Next's gdn-mini, gdn-loud; Qwen3.5's gdn-gva3), kda-real (Kimi-Linear-48B's
# layer shapes, a sharded checkpoint), and the other families' small sets: KDA with the lower-bound gate
# (glm5_next, bailing_hybrid), Gated DeltaNet with negative eigenvalues (olmo_hybrid), a fused in_proj
# (lara_mini) and a sigmoid output gate (qwen4_exp).
set(DELTA_RULE_SETS kda-mini kda-stress kda-loud gdn-mini gdn-gva3 gdn-loud kda-real
    glm5-mini bailing-mini olmo-mini lara-mini qwen4-mini)
# The Mamba2 mixers' sets, written by tools/mamba2_ref.py (its own float64 Mamba2 mixer; it imports
# delta_rule_ref.py beside it for the bf16 rounding and the safetensors files; a few seconds): Nemotron-H
# (mamba2-mini), Mamba2 with two groups (mamba2-groups), Granite-4.0-H with decays down to exp(-100) and a
# loud scan output (mamba2-loud); the cases of the independent sets of the same names; Falcon-H1 with its
# multipliers and the norm before the gate (mamba2-falcon) and Zamba2, a hybrid layer's mixer with its dt
# clamp binding (mamba2-zamba), with mamba2-groups' cases.
set(MAMBA2_SETS mamba2-mini mamba2-groups mamba2-loud mamba2-falcon mamba2-zamba)

set(NOTE "${OUT}/NOT_GENERATED")
file(MAKE_DIRECTORY "${OUT}")
file(REMOVE "${NOTE}")
set(missing "")  # the reasons of the sets not written

# Records why `set_name` is not written (and removes an older copy of it).
function(not_generated set_name reason)
  file(REMOVE_RECURSE "${OUT}/${set_name}")
  file(APPEND "${NOTE}" "${set_name}: ${reason}\n")
  set(missing "${missing}${set_name}: ${reason}\n" PARENT_SCOPE)
  message(STATUS "golden set ${set_name} not generated (the tests that need it skip): ${reason}")
endfunction()

# Writes OUT/<set_name> with `script` <dir> <ARGS...> unless its stamp (the
# arguments and the hashes of the script and of the IMPORTS, modules beside
# it) is up to date; into a scratch directory first, so that a half-written
# set is never used.
function(generate set_name script)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "IMPORTS;ARGS")
  set(args ${arg_ARGS})
  if(NOT script)
    not_generated(${set_name} "no script given")
    set(missing "${missing}" PARENT_SCOPE)
    return()
  endif()
  get_filename_component(script_dir "${script}" DIRECTORY)
  set(hashes "")
  foreach(f "${script}" ${arg_IMPORTS})
    if(NOT IS_ABSOLUTE "${f}")
      set(f "${script_dir}/${f}")
    endif()
    if(NOT EXISTS "${f}")
      not_generated(${set_name} "${f} not found")
      set(missing "${missing}" PARENT_SCOPE)
      return()
    endif()
    file(SHA256 "${f}" h)
    list(APPEND hashes "${h}")
  endforeach()
  set(dir "${OUT}/${set_name}")
  string(JOIN " " want_stamp ${args} ${hashes})
  if(EXISTS "${dir}/STAMP")
    file(READ "${dir}/STAMP" have_stamp)
    if(have_stamp STREQUAL want_stamp)
      message(STATUS "${set_name} up to date")
      return()
    endif()
  endif()
  file(REMOVE_RECURSE "${dir}" "${dir}.tmp")
  execute_process(COMMAND "${PYTHON}" "${script}" "${dir}.tmp" ${args} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    file(REMOVE_RECURSE "${dir}.tmp")
    message(FATAL_ERROR "${script} failed for ${set_name} (exit ${rc})")
  endif()
  file(WRITE "${dir}.tmp/STAMP" "${want_stamp}")
  file(RENAME "${dir}.tmp" "${dir}")
endfunction()

set(python_missing "")
if(NOT EXISTS "${PYTHON}")
  set(python_missing "${PYTHON} not found (Debian package python3)")
else()
  execute_process(COMMAND "${PYTHON}" -c "import numpy" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(python_missing "${PYTHON} cannot import numpy (Debian package python3-numpy)")
  endif()
endif()

if(python_missing)
  foreach(s ${DELTA_RULE_SETS} ${MAMBA2_SETS})
    not_generated(${s} "${python_missing}")
  endforeach()
else()
  foreach(s ${DELTA_RULE_SETS})
    generate(${s} "${DELTA_RULE_SCRIPT}" ARGS --set ${s} --quiet)
  endforeach()
  foreach(s ${MAMBA2_SETS})
    generate(${s} "${MAMBA2_SCRIPT}" IMPORTS delta_rule_ref.py ARGS --set ${s} --quiet)
  endforeach()
endif()

if(missing AND "$ENV{KDA_REQUIRE_GOLDEN}" STREQUAL "1")
  message(FATAL_ERROR "golden sets not generated:\n${missing}")
endif()

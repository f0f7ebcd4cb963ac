# `smelt generate -tp 2` (two CPU ranks) prints the unsplit model's greedy text, with and without the built-in
# draft model (which runs whole on rank 0), and a model that does not split is refused with exit status 1.
# `-pp 2` and `-pp 4` (its 6 layers in stages of 1-2 layers; the 6 heads do not split over 4) print it too.
set(P "The capital of France is")
foreach(extra "" "-md;smelt-tiny-draft" "-pp;2" "-pp;4")
  set(split "-tp;2")
  set(ref_extra "${extra}") # the unsplit run: the same options but the split
  if(extra MATCHES "^-pp")
    set(split "")
    set(ref_extra "")
  endif()
  execute_process(COMMAND ${SMELT} generate -p "${P}" -n 24 --temp 0 --device cpu -t 1 ${ref_extra}
                  RESULT_VARIABLE rc1 OUTPUT_VARIABLE one ERROR_VARIABLE e1 TIMEOUT 120)
  execute_process(COMMAND ${SMELT} generate -p "${P}" -n 24 --temp 0 --device cpu -t 1 ${split} ${extra}
                  RESULT_VARIABLE rc2 OUTPUT_VARIABLE two ERROR_VARIABLE e2 TIMEOUT 120)
  if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0)
    message(FATAL_ERROR "smelt generate failed (${rc1}, ${rc2}): ${e1} ${e2}")
  endif()
  string(LENGTH "${one}" n)
  if(NOT one STREQUAL two OR n LESS 20)
    message(FATAL_ERROR "${split} ${extra}: a different text:\n${one}\n---\n${two}")
  endif()
  message(STATUS "${split} ${extra}: the same ${n} characters")
endforeach()
execute_process(COMMAND ${SMELT} generate -p "${P}" -n 4 --device cpu -t 1 -tp 4
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(rc EQUAL 0 OR NOT err MATCHES "do not split evenly")
  message(FATAL_ERROR "-tp 4 of a 6-head model: exit ${rc}, ${err}")
endif()

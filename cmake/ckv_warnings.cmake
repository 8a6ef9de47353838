# Warnings for our own targets only (generated protobuf code is compiled without -Werror).
function(ckv_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror)
endfunction()

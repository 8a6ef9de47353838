# Warnings for our own targets only (generated protobuf code is compiled without -Werror).
# C++ sources only: CUDA sources get their own flags (kernels/cuda/CMakeLists.txt), since nvcc
# would reject the g++ spellings.
function(ckv_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>)
endfunction()

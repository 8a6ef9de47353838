# Sanitizer and fuzzing builds.
# CKV_SANITIZE: a -fsanitize= list ("address,undefined" or "thread"), empty for a normal
# build. Applied to every target this project compiles (Debian's gRPC, protobuf, Abseil and
# oneTBB stay uninstrumented; the TSan leg swaps in instrumented oneTBB and Abseil
# synchronisation, scripts/build-tsan-deps.sh). The CUDA backend is off in these builds:
# nvcc's host objects carry no instrumentation and ASan's shadow memory clashes with the
# CUDA driver's fixed mappings.
# CKV_BUILD_FUZZ: the libFuzzer targets under fuzz/ (clang only); every other target is
# then compiled with -fsanitize=fuzzer-no-link too, so the fuzzers see coverage of our code.
set(CKV_SANITIZE "" CACHE STRING "Sanitizers for our targets: address,undefined | thread | empty")
option(CKV_BUILD_FUZZ "Build the libFuzzer targets (fuzz/, needs clang)" OFF)

if(CKV_BUILD_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "CKV_BUILD_FUZZ needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++-14 (Debian clang-14, libclang-rt-14-dev)")
endif()

if(CKV_SANITIZE)
  if(CKV_SANITIZE MATCHES "thread" AND CKV_SANITIZE MATCHES "address")
    message(FATAL_ERROR "CKV_SANITIZE: thread and address cannot be combined")
  endif()
  set(CKV_ENABLE_CUDA OFF CACHE BOOL "Build the CUDA backend when nvcc is found" FORCE)
  set(ckv_sanitize_flags -fsanitize=${CKV_SANITIZE} -fno-omit-frame-pointer)
  if(CKV_SANITIZE MATCHES "undefined")
    # A UBSan finding fails the test instead of printing and going on.
    list(APPEND ckv_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${ckv_sanitize_flags}>")
  add_link_options(-fsanitize=${CKV_SANITIZE})
  message(STATUS "Sanitizers: ${CKV_SANITIZE}")
endif()
if(CKV_BUILD_FUZZ)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
endif()

# The client links no engine: run by ctest as ckv_client_link_closure (tests/client/CMakeLists).
#   -DCLOSURE=<file written by ckv_write_link_closure(ckv_client ...)>
#   -DPROBE=<an executable that links ckv_client alone and calls into it>
# Fails if the configured link closure of ckv_client, or the probe binary itself, holds
# oneTBB, CUDA or an engine library; and, so that a broken walk cannot pass, if the closure
# lacks what the client does need (the domain types, the codec, gRPC).
cmake_minimum_required(VERSION 3.25)  # IN_LIST and the rest of modern if()
file(STRINGS ${CLOSURE} closure)
message(STATUS "ckv_client links: ${closure}")
set(failures "")
foreach(name IN LISTS closure)
  string(TOLOWER "${name}" lower)
  if(lower MATCHES "tbb|cuda|cudart|ckv_engines|ckv_kernels")
    list(APPEND failures "the link closure holds ${name}")
  endif()
endforeach()
foreach(needed ckv_types ckv_wire gRPC::grpc++)
  if(NOT needed IN_LIST closure)
    list(APPEND failures "the link closure lacks ${needed} (is the walk broken?)")
  endif()
endforeach()

# The binary: no shared oneTBB or CUDA library, no engine or backend symbol.
execute_process(COMMAND ldd ${PROBE} OUTPUT_VARIABLE libraries RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  list(APPEND failures "ldd ${PROBE} failed")
elseif(NOT libraries MATCHES "libgrpc")
  list(APPEND failures "the probe does not link gRPC (is it the client at all?)")
endif()
if(libraries MATCHES "libtbb|libcuda|libcudart")
  list(APPEND failures "the probe loads oneTBB or CUDA:\n${libraries}")
endif()
execute_process(COMMAND nm -C ${PROBE} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  list(APPEND failures "nm ${PROBE} failed")
elseif(NOT symbols MATCHES "centroidkv::client::Client::Connect")
  list(APPEND failures "the probe holds no client code (is it the client at all?)")
endif()
string(REGEX MATCHALL "[^\n]*(ClusterEngine|CpuEngine|CudaEngine|cudaMalloc|tbb::)[^\n]*"
       engine_symbols "${symbols}")
if(engine_symbols)
  list(GET engine_symbols 0 first)
  list(APPEND failures "the probe holds engine symbols, e.g. ${first}")
endif()

if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "ckv_client must not link an engine:\n  ${text}")
endif()
message(STATUS "ckv_client's link closure holds no engine, oneTBB or CUDA")

# OpenBLAS from Debian (libopenblas-pthread-dev): CBLAS and LAPACK for the fit of fitted
# jobs (kernels/fit/). The engine runs the heads as its own tasks, so the fit sets OpenBLAS to
# one thread (openblas_set_num_threads) and calls it from several threads at once: the
# pthread build allows that, while Debian's serial build is not safe for concurrent callers
# (it shares one buffer without a lock). Defines the target ckv_openblas (headers and
# library), with an rpath so that this build is the one loaded whatever libopenblas.so.0 the
# system's alternatives point at.
set(CKV_OPENBLAS_DIR /usr/lib/x86_64-linux-gnu/openblas-pthread CACHE PATH
    "Directory of the OpenBLAS library (its pthread build)")
set(CKV_OPENBLAS_INCLUDE_DIR /usr/include/x86_64-linux-gnu/openblas-pthread CACHE PATH
    "Directory of the OpenBLAS headers (cblas.h)")
find_library(CKV_OPENBLAS_LIBRARY NAMES openblas PATHS ${CKV_OPENBLAS_DIR} NO_DEFAULT_PATH)
if(NOT CKV_OPENBLAS_LIBRARY OR NOT EXISTS ${CKV_OPENBLAS_INCLUDE_DIR}/cblas.h)
  message(FATAL_ERROR "OpenBLAS not found in ${CKV_OPENBLAS_DIR} "
                      "(apt-get install libopenblas-pthread-dev; scripts/setup.sh does)")
endif()
add_library(ckv_openblas INTERFACE)
target_include_directories(ckv_openblas SYSTEM INTERFACE ${CKV_OPENBLAS_INCLUDE_DIR})
target_link_libraries(ckv_openblas INTERFACE ${CKV_OPENBLAS_LIBRARY})
target_link_options(ckv_openblas INTERFACE "LINKER:-rpath,${CKV_OPENBLAS_DIR}")

# CUDA: on when nvcc is found (CKV_ENABLE_CUDA=OFF turns it off), for Ampere (sm_80) and
# Hopper (sm_90) machine code plus sm_90 PTX for later GPUs. Sets CKV_CUDA_ENABLED.
option(CKV_ENABLE_CUDA "Build the CUDA backend when nvcc is found" ON)
set(CKV_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING
    "CUDA architectures of the CUDA backend")
set(CKV_CUDA_ENABLED OFF)
if(CKV_ENABLE_CUDA)
  # nvcc 13 sits in /usr/local/cuda on our machines, often not on PATH.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    endif()
    # C++17: CMake 3.25 knows no C++20 dialect flag for nvcc 13 (the .cu files need none).
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_ARCHITECTURES ${CKV_CUDA_ARCHITECTURES})
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)  # CUDA::cudart_static, at the top level for every folder
    set(CKV_CUDA_ENABLED ON)
    message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, ${CKV_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "CUDA backend: off (no nvcc found)")
  endif()
else()
  message(STATUS "CUDA backend: off (CKV_ENABLE_CUDA=OFF)")
endif()

# Finds PyTorch's c10 and c10_cuda (headers and shared libraries) in a torch installation, for the
# parts of gpumem that drive PyTorch's own CUDA caching allocator (the peers of gpumem-replay and
# gpumem_bench_compare). Only c10 is needed: the PyPI wheel (`pip install torch==2.11.0`, with or
# without --no-deps) has it under torch/include and torch/lib.
#
# Where torch is looked for, first found wins:
#   GPUMEM_TORCH_DIR     the torch package folder (the one with include/ and lib/)
#   GPUMEM_TORCH_PYTHON  a Python interpreter that can `import torch` (tools/setup_torch.sh)
# Defines, when found: GPUMEM_C10_FOUND (ON), GPUMEM_TORCH_VERSION, and the imported target
# gpumem::c10_cuda (include directories, libc10_cuda.so and libc10.so, the C++ ABI torch was
# built with), and GPUMEM_TORCH_LIB_DIR (torch/lib). Otherwise GPUMEM_C10_FOUND is OFF and
# GPUMEM_C10_WHY says why.
include_guard(GLOBAL)

set(GPUMEM_TORCH_DIR "" CACHE PATH "The torch package folder (with include/ and lib/); empty: ask GPUMEM_TORCH_PYTHON")
set(GPUMEM_C10_FOUND OFF)
set(GPUMEM_C10_WHY "")

set(_gpumem_torch_dir "${GPUMEM_TORCH_DIR}")
set(_gpumem_torch_abi 1)
if(NOT _gpumem_torch_dir AND GPUMEM_TORCH_PYTHON)
  # Under pip's build isolation (`pip install .` of the Python package), PYTHONPATH points at pip's
  # temporary build environment, whose sitecustomize hides the installing environment's
  # site-packages: ask the interpreter without it, so that it sees the torch installed there.
  set(_gpumem_python_env "")
  if("$ENV{PYTHONPATH}" MATCHES "pip-build-env")
    set(_gpumem_python_env ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE)
  endif()
  execute_process(
    COMMAND ${_gpumem_python_env} "${GPUMEM_TORCH_PYTHON}" -c
            "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _gpumem_torch_out ERROR_VARIABLE _gpumem_torch_err RESULT_VARIABLE _gpumem_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_gpumem_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _gpumem_torch_out "${_gpumem_torch_out}")
    list(GET _gpumem_torch_out 0 _gpumem_torch_dir)
    list(GET _gpumem_torch_out 1 GPUMEM_TORCH_VERSION)
    list(GET _gpumem_torch_out 2 _gpumem_torch_abi)
  else()
    set(GPUMEM_C10_WHY "${GPUMEM_TORCH_PYTHON} cannot import torch")
  endif()
endif()

if(_gpumem_torch_dir)
  find_library(GPUMEM_C10_LIBRARY c10 PATHS "${_gpumem_torch_dir}/lib" NO_DEFAULT_PATH)
  find_library(GPUMEM_C10_CUDA_LIBRARY c10_cuda PATHS "${_gpumem_torch_dir}/lib" NO_DEFAULT_PATH)
  if(GPUMEM_C10_LIBRARY AND GPUMEM_C10_CUDA_LIBRARY AND EXISTS "${_gpumem_torch_dir}/include/c10/cuda/CUDACachingAllocator.h")
    if(NOT GPUMEM_TORCH_VERSION AND EXISTS "${_gpumem_torch_dir}/version.py")
      file(STRINGS "${_gpumem_torch_dir}/version.py" _gpumem_v REGEX "^__version__")
      string(REGEX REPLACE ".*'([^']*)'.*" "\\1" GPUMEM_TORCH_VERSION "${_gpumem_v}")
    endif()
    set(GPUMEM_C10_FOUND ON)
    get_filename_component(GPUMEM_TORCH_LIB_DIR "${GPUMEM_C10_LIBRARY}" DIRECTORY)
    if(NOT TARGET gpumem::c10_cuda)
      add_library(gpumem_c10_cuda INTERFACE IMPORTED GLOBAL)
      add_library(gpumem::c10_cuda ALIAS gpumem_c10_cuda)
      target_include_directories(gpumem_c10_cuda SYSTEM INTERFACE "${_gpumem_torch_dir}/include")
      target_link_libraries(gpumem_c10_cuda INTERFACE "${GPUMEM_C10_CUDA_LIBRARY}" "${GPUMEM_C10_LIBRARY}")
      target_compile_definitions(gpumem_c10_cuda INTERFACE _GLIBCXX_USE_CXX11_ABI=${_gpumem_torch_abi})
      # Newer torch headers use C++20 (operator<=> in c10/util/intrusive_ptr.h, torch 2.15).
      file(STRINGS "${_gpumem_torch_dir}/include/c10/util/intrusive_ptr.h" _gpumem_spaceship
           REGEX "operator<=>" LIMIT_COUNT 1)
      if(_gpumem_spaceship)
        target_compile_features(gpumem_c10_cuda INTERFACE cxx_std_20)
      endif()
    endif()
    message(STATUS "gpumem: PyTorch's c10 ${GPUMEM_TORCH_VERSION} found in ${_gpumem_torch_dir}")
  else()
    set(GPUMEM_C10_WHY "no libc10, libc10_cuda or c10 headers under ${_gpumem_torch_dir}")
  endif()
elseif(NOT GPUMEM_C10_WHY)
  set(GPUMEM_C10_WHY "neither GPUMEM_TORCH_DIR nor GPUMEM_TORCH_PYTHON is set (tools/setup_torch.sh makes a Python with torch)")
endif()
if(NOT GPUMEM_C10_FOUND)
  message(STATUS "gpumem: PyTorch's c10 not found: ${GPUMEM_C10_WHY}")
endif()

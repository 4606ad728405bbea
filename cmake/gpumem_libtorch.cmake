# Finds the full LibTorch (find_package(Torch)) of the torch installation GPUMEM_TORCH_PYTHON names
# (the PyPI wheel ships it), for gpumem's training helpers (gpumem/train), their tests and the
# LibTorch example. Defines GPUMEM_LIBTORCH_FOUND and, when found, the INTERFACE target
# gpumem::libtorch (${TORCH_LIBRARIES}).
include_guard(GLOBAL)
set(GPUMEM_LIBTORCH_FOUND OFF)
if(GPUMEM_TORCH_PYTHON)
  execute_process(COMMAND "${GPUMEM_TORCH_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _gpumem_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _gpumem_torch_rc ERROR_QUIET)
  if(_gpumem_torch_rc EQUAL 0 AND EXISTS "${_gpumem_torch_prefix}/Torch/TorchConfig.cmake")
    list(APPEND CMAKE_PREFIX_PATH "${_gpumem_torch_prefix}")
    find_package(Torch QUIET)
    if(Torch_FOUND)
      set(GPUMEM_LIBTORCH_FOUND ON)
      if(NOT TARGET gpumem::libtorch)
        add_library(gpumem_libtorch INTERFACE)
        add_library(gpumem::libtorch ALIAS gpumem_libtorch)
        target_link_libraries(gpumem_libtorch INTERFACE ${TORCH_LIBRARIES})
      endif()
    endif()
  endif()
endif()
if(NOT GPUMEM_LIBTORCH_FOUND)
  message(STATUS "gpumem: LibTorch not found (set GPUMEM_TORCH_PYTHON to a Python with torch): "
                 "the training helpers' tests and the LibTorch example are left out")
endif()

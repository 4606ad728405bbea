// gpumem packaging test: the CUDA runtime device through gpumem::cuda. Only built and linked
// (cudart must resolve); it may be run, and then says how many GPUs it sees.
#include <gpumem/device/cuda_device.hpp>

#include <cstdio>

int main() {
  static_assert(gpumem::is_device_v<gpumem::cuda_device>);
  std::printf("CUDA devices: %d\n", gpumem::cuda_device::device_count());
  return 0;
}

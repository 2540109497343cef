// CPU-only build: the CUDA entry points report that no device is available.
#ifndef K3_HAVE_CUDA
#include "core/cuda_check.h"

namespace k3::cuda {

int device_count() { return 0; }
Result<std::string> describe_device(int) { return Status(Code::unsupported, "built without CUDA (-DK3_CUDA=ON)"); }

}  // namespace k3::cuda
#endif

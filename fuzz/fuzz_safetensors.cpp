// fuzz_safetensors: arbitrary bytes as a whole .safetensors image -> parse_safetensors (io/safetensors.h).
// Must never crash, leak or read out of bounds; every accepted view must lie inside the buffer and
// match its shape * dtype size.
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf(data, data + size);  // own the bytes so ASan sees the exact bounds
  auto r = k3::parse_safetensors(buf.data(), buf.size(), "fuzz.safetensors");
  if (!r.ok()) return 0;
  for (const k3::NamedTensor& t : r.value()) {
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    K3_ASSERT(p >= buf.data() && p + t.view.nbytes <= buf.data() + buf.size());
    K3_ASSERT(size_t(t.view.numel()) * k3::dtype_size(t.view.dtype) == t.view.nbytes);
    volatile uint8_t sink = 0;
    if (t.view.nbytes) sink = p[0] ^ p[t.view.nbytes - 1];  // touch both ends
    (void)sink;
  }
  return 0;
}

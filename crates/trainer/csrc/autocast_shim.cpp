// extern "C" shim over libtorch's autocast state, used by src/trainer/amp.rs.
//
// tch's own `autocast` only switches CUDA autocast on with libtorch's default CUDA dtype (float16)
// and does nothing without CUDA; ups-doctor's `train.amp` is bfloat16 autocast on the rank's
// device, CUDA or the CPU, which needs `set_autocast_dtype`. No C++ exception crosses this
// boundary: these calls only flip thread-local flags.

#include <ATen/autocast_mode.h>

namespace {

at::DeviceType device_type(int cuda) { return cuda != 0 ? at::kCUDA : at::kCPU; }

}  // namespace

extern "C" {

// Enters bfloat16 autocast on CUDA (`cuda` = 1) or the CPU (0). Returns whether autocast was
// already enabled there (0 or 1), to be handed back to ups_autocast_exit.
int ups_autocast_enter(int cuda) {
  at::DeviceType type = device_type(cuda);
  bool previous = at::autocast::is_autocast_enabled(type);
  at::autocast::set_autocast_dtype(type, at::kBFloat16);
  at::autocast::set_autocast_enabled(type, true);
  at::autocast::increment_nesting();
  return previous ? 1 : 0;
}

// Leaves the autocast region entered by ups_autocast_enter; the cast cache is cleared when the
// outermost region ends, as torch.autocast's __exit__ does.
void ups_autocast_exit(int cuda, int previous) {
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device_type(cuda), previous != 0);
}

// Whether autocast is on for the device (for tests).
int ups_autocast_enabled(int cuda) { return at::autocast::is_autocast_enabled(device_type(cuda)) ? 1 : 0; }

}  // extern "C"

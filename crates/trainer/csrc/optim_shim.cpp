// extern "C" shim over libtorch's multi-tensor optimizer ops, used by src/optim.rs.
//
// tch 0.24 binds none of `_fused_adamw_`, `_foreach_norm` or `_foreach_mul_` (ops over tensor
// lists are left out of its generated API), and they are what PyTorch's own `AdamW(fused=True)`
// and `clip_grad_norm_` run: one pass over every parameter for the update, no host read-back for
// clipping. Tensors cross as tch's handles, which are `at::Tensor*`.
//
// Contract: no C++ exception ever crosses this boundary. Every entry point returns 0 on success
// and -1 on failure, with *err set to a malloc'd, NUL-terminated message that the caller releases
// with ups_optim_free_string. A tensor handed out is a new `at::Tensor*` that tch's `Tensor`
// adopts and frees (`at_free` deletes it).

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "shim_error.h"

namespace {

using ups_shim::dup_message;
using ups_shim::guarded;

// A list of n tensors from tch's handles. The handles outlive the call; the list shares their
// TensorImpls, so in-place ops on it update the caller's tensors.
std::vector<at::Tensor> list(at::Tensor* const* tensors, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(*tensors[i]);
  }
  return out;
}

}  // namespace

extern "C" {

// torch.optim.AdamW(fused=True)'s update of n parameters in place: decoupled weight decay,
// bias-corrected moments, eps added after the square root. `step` is one float32 tensor on the
// parameters' device holding the step number after this update (shared by every parameter: they
// all update together).
int ups_fused_adamw(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* exp_avgs,
                    at::Tensor* const* exp_avg_sqs, const at::Tensor* step, int64_t n, double lr,
                    double beta1, double beta2, double weight_decay, double eps, char** err) {
  return guarded(err, [&] {
    std::vector<at::Tensor> steps(static_cast<size_t>(n), *step);
    at::_fused_adamw_(list(params, n), list(grads, n), list(exp_avgs, n), list(exp_avg_sqs, n),
                      /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  });
}

// The L2 norm of each of n tensors, stacked into one 1-D tensor on their device
// (`_foreach_norm`, as clip_grad_norm_ computes them). *out receives a new tensor.
int ups_foreach_norm(at::Tensor* const* tensors, int64_t n, at::Tensor** out, char** err) {
  return guarded(err, [&] {
    *out = new at::Tensor(at::stack(at::_foreach_norm(list(tensors, n), 2)));
  });
}

// Multiplies n tensors in place by one 0-dim tensor (`_foreach_mul_`), which stays where it is:
// no read-back to the host.
int ups_foreach_mul_(at::Tensor* const* tensors, int64_t n, const at::Tensor* factor, char** err) {
  return guarded(err, [&] { at::_foreach_mul_(list(tensors, n), *factor); });
}

void ups_optim_free_string(char* s) { std::free(s); }

}  // extern "C"

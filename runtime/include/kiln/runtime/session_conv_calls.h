// The Session's convolution calls of one spatial rank (1, 2 or 3), as member pointers: for code
// that serves every rank with one template (the PyTorch device's lowering, the client API tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "kiln/runtime/session.h"

namespace kiln::runtime {

template <class Options, class TransposedOptions>
struct SessionConvCalls {
  std::size_t rank;
  Result<Tensor> (Session::*forward)(Tensor, Tensor, std::optional<Tensor>, const Options&);
  Result<Tensor> (Session::*forward_t)(Tensor, Tensor, std::optional<Tensor>, const TransposedOptions&);
  Result<Tensor> (Session::*x_grad)(Tensor, Tensor, Tensor, const Options&);
  Result<Tensor> (Session::*weight_grad)(Tensor, Tensor, Tensor, const Options&);
  Result<Tensor> (Session::*bias_grad)(Tensor, Tensor, Tensor);
  Result<Tensor> (Session::*weight_grad_t)(Tensor, Tensor, Tensor, const TransposedOptions&);
  Result<Tensor> (Session::*bias_grad_t)(Tensor, Tensor, Tensor);
};

inline constexpr SessionConvCalls<ir::build::Conv1dOptions, ir::build::ConvTranspose1dOptions> kConv1dCalls{
    1,
    &Session::conv1d,
    &Session::conv_transpose1d,
    &Session::conv1d_x_backward,
    &Session::conv1d_weight_backward,
    &Session::conv1d_bias_backward,
    &Session::conv_transpose1d_weight_backward,
    &Session::conv_transpose1d_bias_backward};
inline constexpr SessionConvCalls<ir::build::Conv2dOptions, ir::build::ConvTranspose2dOptions> kConv2dCalls{
    2,
    &Session::conv2d,
    &Session::conv_transpose2d,
    &Session::conv2d_x_backward,
    &Session::conv2d_weight_backward,
    &Session::conv2d_bias_backward,
    &Session::conv_transpose2d_weight_backward,
    &Session::conv_transpose2d_bias_backward};
inline constexpr SessionConvCalls<ir::build::Conv3dOptions, ir::build::ConvTranspose3dOptions> kConv3dCalls{
    3,
    &Session::conv3d,
    &Session::conv_transpose3d,
    &Session::conv3d_x_backward,
    &Session::conv3d_weight_backward,
    &Session::conv3d_bias_backward,
    &Session::conv_transpose3d_weight_backward,
    &Session::conv_transpose3d_bias_backward};

// f(the calls of `rank` spatial dims): rank 1 or 2, else 3.
template <class F>
decltype(auto) with_conv_calls(std::int64_t rank, F&& f) {
  if (rank == 1) return f(kConv1dCalls);
  if (rank == 2) return f(kConv2dCalls);
  return f(kConv3dCalls);
}

}  // namespace kiln::runtime

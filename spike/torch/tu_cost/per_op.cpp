#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <torch/library.h>
at::Tensor f(const at::Tensor& a) { return at::add(a, 1); }

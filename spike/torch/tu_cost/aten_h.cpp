#include <ATen/ATen.h>
#include <torch/library.h>
at::Tensor f(const at::Tensor& a) { return a + 1; }

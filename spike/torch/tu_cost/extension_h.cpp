#include <torch/extension.h>
at::Tensor f(const at::Tensor& a) { return a + 1; }

// The README's library example: a tiny softmax classifier forward pass.
#include <iostream>

#include "kiln/kiln.h"

int main() {
  using namespace kiln;
  try {
    Tensor x = ops::random_normal({64, 784}, 0.0, 1.0, DType::kF32, /*seed=*/1);
    Tensor w = ops::random_uniform({784, 10}, -0.05, 0.05, DType::kF32, 2);
    Tensor p = ops::softmax(ops::matmul(x, w));  // [64, 10]
    Tensor loss = ops::mean(-ops::log(ops::max(p, {1})));
    std::cout << "probabilities " << p.desc() << ", loss " << loss.str() << "\n";
    ops::matmul(x, x);  // [64, 784] x [64, 784]: a typed error, not a crash
  } catch (const kiln::InvalidArgumentError& e) {
    std::cout << "caught: " << e.what() << "\n";
    return 0;
  }
  return 1;
}

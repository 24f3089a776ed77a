#pragma once
// Converting a model package for inference (`kiln convert`, TensorRT-style): the full
// optimisation pipeline (folding, fusion) is applied once and stored, and the
// precision is lowered:
//   fp32  the optimised graphs only;
//   fp16, bf16  f32 weights of 1024+ elements are stored in 16 bits and cast back to
//         f32 when loaded (half the package and mapping size, weights rounded once;
//         compute stays f32: on CPUs without native 16-bit arithmetic, such as this
//         AVX2 one, 16-bit compute is slower, see docs/benchmarks.md);
//   int8  post-training quantisation: matmul and NHWC conv2d nodes with constant
//         weights (fused or not) become qlinear_matmul / qlinear_conv2d: weights
//         symmetric per output channel in i8, activations asymmetric per tensor in u8
//         0..127 (7 bits: oneDNN's int8 kernels on CPUs without VNNI saturate
//         otherwise) with ranges calibrated on the given batches (min/max of each
//         quantised node's input over all of them, widened to include 0).
//         Quantised layers in a row (through max_pool2d and reshape only) pass u8
//         activations: the first requantises to the second's input parameters.
// The result is a new package version directory with the same signatures, metadata
// (precision and converted_from set) and assets. The source may be a TensorFlow
// SavedModel (tf_saved_model.h): its graphs are imported, and the files directly under
// its assets/ and assets.extra/ are carried over.
//
// Thread-safety: reentrant.
#include <map>
#include <string>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::package {

struct ConvertOptions {
  std::string precision = "fp32";  // fp32 | fp16 | bf16 | int8
  // int8: calibration batches, input name -> tensor; each is run through every
  // signature whose inputs it names in full (at least one batch must fit one).
  std::vector<std::map<std::string, Tensor>> calibration;
  bool overwrite = false;
};

struct ConvertReport {
  int nodes_quantized = 0;   // int8: matmul/conv nodes replaced, all signatures
  int weights_lowered = 0;   // fp16/bf16: weights stored in 16 bits
  int calibration_batches = 0;
};

// Reads the package at src_dir (a version directory), writes out_dir (a version
// directory, e.g. models/fmnist/2). Throws InvalidArgumentError for an unknown
// precision or int8 without usable calibration data, FailedPreconditionError when
// out_dir exists (unless overwrite), and what loading and export throw.
ConvertReport convert_package(const std::string& src_dir, const std::string& out_dir, const ConvertOptions& opts);

}  // namespace kiln::package

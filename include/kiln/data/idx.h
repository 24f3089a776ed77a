#pragma once
// IDX files (the MNIST format, http://yann.lecun.com/exdb/mnist/): big-endian magic
// 0x0000TTRR (TT dtype code, RR rank), RR big-endian u32 dims, then the row-major data.
// Gzip-compressed files (".gz", detected by magic bytes) are read through zlib.
// Spec: docs/formats/idx.md.
#include <string>

#include <vector>

#include "kiln/core/tensor.h"
#include "kiln/data/dataset.h"

namespace kiln::data {

// Reads an IDX file into a tensor of the matching dtype (u8, i8, i16 -> i32, i32,
// f32, f64). Throws NotFoundError for a missing file and DataLossError naming the
// file for a bad magic, unknown type code, truncated data or a corrupt gzip stream.
Tensor read_idx(const std::string& path);

struct FashionMnist {
  Tensor train_images;  // u8 [60000, 28, 28]
  Tensor train_labels;  // u8 [60000]
  Tensor test_images;   // u8 [10000, 28, 28]
  Tensor test_labels;   // u8 [10000]
};
// Loads the four Fashion-MNIST IDX files from `dir` (default: Debian's
// dataset-fashion-mnist location, /usr/share/datasets/fashion-mnist); the
// KILN_FASHION_MNIST_DIR environment variable overrides the default. Throws
// NotFoundError naming the missing file and the package that provides it.
FashionMnist load_fashion_mnist(const std::string& dir = "");

// A Dataset over IDX files read once when it is built: element i holds row i of
// every file (e.g. {images, labels} -> (u8[28, 28], u8[])). The files must agree in
// their first dimension (InvalidArgumentError naming both).
Dataset idx_dataset(const std::vector<std::string>& files);

}  // namespace kiln::data

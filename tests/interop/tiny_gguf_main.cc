// Writes the tiny random-weight language models of tests/llm/tiny_model.h (one per GGUF
// tensor type) into a directory, as <name>.gguf: what bench/peers/make_llm_fixtures.py
// runs llama.cpp on to make the fixtures that tests/llm/tiny_models_test.cc checks.
//   kiln_tiny_gguf DIR
#include <cstdio>
#include <fstream>

#include "llm/tiny_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_tiny_gguf DIR\n");
    return 2;
  }
  for (const kiln::llm::testing::TinyModel& m : kiln::llm::testing::tiny_models()) {
    const std::string path = std::string(argv[1]) + "/" + m.name + ".gguf";
    std::ofstream(path, std::ios::binary) << kiln::llm::testing::tiny_model_gguf(m);
    std::printf("%s\n", path.c_str());
  }
  return 0;
}

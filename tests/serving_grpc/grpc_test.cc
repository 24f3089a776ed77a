// The gRPC front end driven through grpc++ stubs of TensorFlow Serving's services:
// Predict by version and label, output_filter, wrong dtypes, string tensors, unknown
// models, metadata (SignatureDefMap in an Any), Classify, Regress, GetModelStatus,
// HandleReloadConfigRequest, deadlines, a taken port. (Python's tensorflow-serving-api
// drives the same server in the interop_tf_serving_client test.)
#include <grpcpp/grpcpp.h>
#include <filesystem>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include "serving/grpc_server.h"
#include "kiln/core/metrics.h"
#include "serving/serving_test_util.h"
#include "package/tf_tensor_proto.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/config/model_server_config.pb.h"
using namespace kiln;
using namespace kiln::serving;
namespace tfs = tensorflow::serving;
#define CHECK(c) ASSERT_TRUE(c) << log.str()
namespace {
TEST(Grpc, TensorFlowServingServicesEndToEnd) {
  std::ostringstream log;  // what each call answered, printed when a check fails

  kiln::testing::TempDir dir("grpc");
  std::string base = dir.path() + "/m";
  kiln::serving::testing::export_test_model(base, 1, 1);
  kiln::serving::testing::export_test_model(base, 2, 2);
  Metrics metrics;
  ManagerOptions mo; mo.poll_seconds = 0; mo.metrics = &metrics;
  ModelManager mgr(mo);
  ModelConfig mc; mc.name = "m"; mc.base_path = base; mc.policy.kind = VersionPolicy::Kind::kAll; mc.labels["stable"] = 1;
  mgr.set_config({mc}); mgr.poll_now();
  Service svc(mgr, metrics);
  int reloads = 0;
  GrpcOptions go; go.port = 0; go.max_threads = 8;
  GrpcServer srv(svc, go, [&](const tfs::ModelServerConfig& c) { ++reloads; return c.model_config_list().config_size() ? Status{} : Status{Code::kInvalidArgument, "empty"}; });
  srv.start();
  log << "port " << srv.port() << "\n";
  // A second server on the same port must fail.
  { GrpcOptions g2 = go; g2.port = srv.port(); GrpcServer s2(svc, g2, nullptr);
    try { s2.start(); FAIL() << "a second server bound the same port"; } catch (const std::exception& e) { log << "bind error ok: " << e.what() << "\n"; } }
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(srv.port()), grpc::InsecureChannelCredentials());
  auto ps = tfs::PredictionService::NewStub(ch);
  auto ms = tfs::ModelService::NewStub(ch);
  Tensor x = Tensor::from_vector<float>({0.1f,0.2f,0.3f,0.4f, 1,2,3,4}, Shape{2,4});
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("m");
    tf::tensor_to_proto(x, &(*rq.mutable_inputs())["x"], true);
    auto st = ps->Predict(&ctx, rq, &rs);
    CHECK(st.ok()); log << "predict v" << rs.model_spec().version().value() << " sig " << rs.model_spec().signature_name() << "\n";
    Tensor p = tf::tensor_from_proto(rs.outputs().at("probs"));
    CHECK(allclose(p, kiln::serving::testing::test_model_probs(x, 2), 1e-5, 1e-6)); }
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.mutable_model_spec()->set_version_label("stable");
    tf::tensor_to_proto(x, &(*rq.mutable_inputs())["x"]);
    auto st = ps->Predict(&ctx, rq, &rs); CHECK(st.ok()); CHECK(rs.model_spec().version().value() == 1);
    CHECK(allclose(tf::tensor_from_proto(rs.outputs().at("probs")), kiln::serving::testing::test_model_probs(x, 1), 1e-5, 1e-6)); }
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.add_output_filter("nope");
    tf::tensor_to_proto(x, &(*rq.mutable_inputs())["x"]);
    auto st = ps->Predict(&ctx, rq, &rs); log << "filter: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 3); }
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("m");
    tf::tensor_to_proto(x.to(DType::kF64), &(*rq.mutable_inputs())["x"]);
    auto st = ps->Predict(&ctx, rq, &rs); log << "f64: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 3); }
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("m"); (*rq.mutable_inputs())["x"].set_dtype(tensorflow::DT_STRING);
    auto st = ps->Predict(&ctx, rq, &rs); log << "string: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 3); }
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("nope");
    auto st = ps->Predict(&ctx, rq, &rs); log << "unknown model: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 5); }
  { grpc::ClientContext ctx; tfs::PredictRequest rq; tfs::PredictResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.mutable_model_spec()->set_signature_name("classify");
    tf::tensor_to_proto(x, &(*rq.mutable_inputs())["x"]);
    auto st = ps->Predict(&ctx, rq, &rs); log << "predict on classify sig: " << st.error_code() << " " << st.error_message() << "\n"; }
  { grpc::ClientContext ctx; tfs::GetModelMetadataRequest rq; tfs::GetModelMetadataResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.add_metadata_field("signature_def");
    auto st = ps->GetModelMetadata(&ctx, rq, &rs); CHECK(st.ok());
    tfs::SignatureDefMap m; CHECK(rs.metadata().at("signature_def").UnpackTo(&m));
    log << "metadata type_url " << rs.metadata().at("signature_def").type_url() << "\n" << m.DebugString().substr(0, 600) << "\n"; }
  { grpc::ClientContext ctx; tfs::GetModelMetadataRequest rq; tfs::GetModelMetadataResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.add_metadata_field("other");
    auto st = ps->GetModelMetadata(&ctx, rq, &rs); log << "metadata other: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 3); }
  auto example_input = [](tfs::Input* in) {
    for (int i = 0; i < 2; ++i) { auto* e = in->mutable_example_list()->add_examples();
      auto& f = (*e->mutable_features()->mutable_feature())["x"];
      for (int j = 0; j < 4; ++j) f.mutable_float_list()->add_value(0.1f * (i + j)); } };
  { grpc::ClientContext ctx; tfs::ClassificationRequest rq; tfs::ClassificationResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.mutable_model_spec()->set_signature_name("classify");
    example_input(rq.mutable_input());
    auto st = ps->Classify(&ctx, rq, &rs); log << "classify: " << st.error_code() << " " << st.error_message() << "\n" << rs.DebugString().substr(0, 500) << "\n"; CHECK(st.ok()); CHECK(rs.result().classifications_size() == 2); }
  { grpc::ClientContext ctx; tfs::RegressionRequest rq; tfs::RegressionResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.mutable_model_spec()->set_signature_name("regress");
    example_input(rq.mutable_input());
    auto st = ps->Regress(&ctx, rq, &rs); log << "regress: " << st.error_code() << " " << st.error_message() << "\n" << rs.DebugString() << "\n"; CHECK(st.ok()); CHECK(rs.result().regressions_size() == 2); }
  { grpc::ClientContext ctx; tfs::RegressionRequest rq; tfs::RegressionResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.mutable_model_spec()->set_signature_name("regress");
    auto st = ps->Regress(&ctx, rq, &rs); log << "regress empty: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 3); }
  { grpc::ClientContext ctx; tfs::GetModelStatusRequest rq; tfs::GetModelStatusResponse rs;
    rq.mutable_model_spec()->set_name("m");
    auto st = ms->GetModelStatus(&ctx, rq, &rs); CHECK(st.ok()); log << rs.DebugString() << "\n"; CHECK(rs.model_version_status_size() == 2); }
  { grpc::ClientContext ctx; tfs::GetModelStatusRequest rq; tfs::GetModelStatusResponse rs;
    rq.mutable_model_spec()->set_name("m"); rq.mutable_model_spec()->mutable_version()->set_value(7);
    auto st = ms->GetModelStatus(&ctx, rq, &rs); log << "status v7: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 5); }
  { grpc::ClientContext ctx; tfs::ReloadConfigRequest rq; tfs::ReloadConfigResponse rs;
    rq.mutable_config()->mutable_model_config_list()->add_config()->set_name("m");
    auto st = ms->HandleReloadConfigRequest(&ctx, rq, &rs); CHECK(st.ok()); CHECK(reloads == 1); }
  { grpc::ClientContext ctx; tfs::ReloadConfigRequest rq; tfs::ReloadConfigResponse rs;
    auto st = ms->HandleReloadConfigRequest(&ctx, rq, &rs); log << "reload empty: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 3); }
  { grpc::ClientContext ctx; ctx.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
    tfs::PredictRequest rq; tfs::PredictResponse rs; rq.mutable_model_spec()->set_name("m");
    tf::tensor_to_proto(x, &(*rq.mutable_inputs())["x"]);
    auto st = ps->Predict(&ctx, rq, &rs); log << "past deadline: " << st.error_code() << " " << st.error_message() << "\n"; CHECK(st.error_code() == 4); }
  EXPECT_NE(metrics.render().find("api=\"grpc\",method=\"predict\",code=\"OK\""), std::string::npos) << metrics.render();
  srv.shutdown(std::chrono::milliseconds(100));
  }
}  // namespace

namespace {
// A call cancelled while its request waits for a batch: the request is dropped, not run.
TEST(Grpc, CancelledCallsAreDroppedFromTheQueue) {
  kiln::testing::TempDir dir("grpc");
  kiln::serving::testing::export_test_model(dir.path(), 1, 1);
  Metrics metrics;
  ManagerOptions mo;
  mo.poll_seconds = 0;
  mo.metrics = &metrics;
  BatchingOptions b;
  b.batch_timeout_micros = 400000;
  mo.batching = b;
  ModelManager mgr(mo);
  ModelConfig mc;
  mc.name = "m";
  mc.base_path = dir.path();
  mgr.set_config({mc});
  mgr.poll_now();
  Service svc(mgr, metrics);
  GrpcOptions go;
  go.port = 0;
  GrpcServer srv(svc, go, nullptr);
  srv.start();
  auto ps = tfs::PredictionService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(srv.port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  tfs::PredictRequest rq;
  tfs::PredictResponse rs;
  rq.mutable_model_spec()->set_name("m");
  tf::tensor_to_proto(Tensor::from_vector<float>({1, 2, 3, 4}, Shape{1, 4}), &(*rq.mutable_inputs())["x"]);
  std::thread cancel([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ctx.TryCancel();
  });
  auto st = ps->Predict(&ctx, rq, &rs);
  cancel.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED);
  // The server notices within its 10 ms poll and drops the request when the batch forms.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = metrics.render();
    if (text.find("code=\"CANCELLED\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(text.find(R"(api="grpc",method="predict",code="CANCELLED"} 1)"), std::string::npos) << text;
  EXPECT_EQ(text.find("kiln_compute_seconds_count{model=\"m\"}"), std::string::npos) << "the model ran";
  srv.shutdown(std::chrono::milliseconds(100));
}
}  // namespace

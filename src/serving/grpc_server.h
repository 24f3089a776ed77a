#pragma once
// The model server's gRPC front end: TensorFlow Serving's PredictionService (Predict,
// Classify, Regress, GetModelMetadata) and ModelService (GetModelStatus,
// HandleReloadConfigRequest), as proto/tensorflow_serving/apis/ declares them, so the
// tensorflow-serving-api clients (prediction_service_pb2_grpc ...) work unchanged.
//
// Synchronous grpc++ services on their own thread pool (max_threads bounds it through
// a resource quota; calls beyond it are answered RESOURCE_EXHAUSTED by gRPC). Every
// call is answered with a status, never an exception: kiln errors map through
// status_of() to the same codes TensorFlow Serving answers. Each call is counted in
// the metrics (api "grpc") through Service::record. A client deadline bounds the
// call: it travels to the batcher, which drops requests whose deadline has passed.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/serving/status.h"
#include "service.h"

namespace grpc {
class Server;
}
namespace tensorflow::serving {
class ModelServerConfig;
}

namespace kiln::serving {

struct GrpcOptions {
  std::string host = "127.0.0.1";  // "0.0.0.0" / "::" for every interface
  int port = 8500;                 // 0: any free port (see GrpcServer::port())
  int max_threads = 0;             // 0: gRPC's default
  int64_t max_message_bytes = 64 << 20;  // largest request accepted
};

// Applies a new model config (HandleReloadConfigRequest); its status is the answer.
using ReloadConfigFn = std::function<Status(const tensorflow::serving::ModelServerConfig&)>;

class GrpcServer {
 public:
  // An empty reload_config answers HandleReloadConfigRequest UNIMPLEMENTED.
  GrpcServer(Service& svc, GrpcOptions opts, ReloadConfigFn reload_config);
  ~GrpcServer();  // shutdown(0) if still running
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Binds and starts serving; throws UnavailableError naming the address
  // when it cannot listen (port taken, bad host), InvalidArgumentError for bad options.
  void start();
  // The port listened on (the one chosen when options asked for 0); 0 before start().
  int port() const { return port_; }
  // Stops taking calls, lets those in flight finish for up to `grace`, then cancels
  // the rest and returns when every handler has returned. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

 private:
  class PredictionImpl;
  class ModelImpl;
  Service& svc_;
  GrpcOptions opts_;
  ReloadConfigFn reload_;
  std::unique_ptr<PredictionImpl> prediction_;
  std::unique_ptr<ModelImpl> model_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;  // start / shutdown
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace kiln::serving

// LlmService::apply while requests run (ThreadSanitizer runs this binary): language
// models added, changed and removed under a steady stream of completions from several
// threads. Every answer is a completion (200) or, for a model not configured at that
// moment, 404; nothing hangs; a model whose spec did not change keeps its engine; a
// failed load changes nothing. Tiny random-weight models (tests/llm/tiny_model.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <unistd.h>

#include "kiln/core/error.h"
#include "llm/tiny_model.h"
#include "serving/llm_api.h"

namespace kiln::serving {
namespace {

std::string write_tiny(const std::string& tag, size_t which) {
  const llm::testing::TinyModel m = llm::testing::tiny_models().at(which);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_reload_" + tag + std::to_string(::getpid()) + ".gguf")).string();
  std::ofstream(path, std::ios::binary) << llm::testing::tiny_model_gguf(m);
  return path;
}

LlmModelSpec spec(const std::string& name, const std::string& path, int32_t max_running = 4) {
  LlmModelSpec s;
  s.name = name;
  s.path = path;
  s.engine.kv_cache_bytes = 1 << 20;
  s.engine.max_running = max_running;
  return s;
}

// A completion through the service as the REST server would ask it; the HTTP status.
int complete(LlmService& svc, const std::string& model) {
  HttpRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.body = "{\"model\": \"" + model + "\", \"prompt\": \"the cat\", \"max_tokens\": 4, \"temperature\": 0}";
  auto answer = std::make_shared<std::promise<int>>();
  std::future<int> status = answer->get_future();
  Responder respond = [answer](HttpResponse r) { answer->set_value(r.status); };
  EXPECT_TRUE(svc.handle(req, respond));
  if (status.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "no answer within 60 s";
    return 0;
  }
  return status.get();
}

TEST(LlmServiceReload, ModelsChangeWhileRequestsRun) {
  const std::string a_path = write_tiny("a", 0), b_path = write_tiny("b", 3);  // f32 (SentencePiece), q8_0
  Metrics metrics;
  LlmService svc({spec("a", a_path)}, metrics);
  EXPECT_EQ(complete(svc, "a"), 200);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, absent{0}, other{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const int code = complete(svc, (t + i) % 2 ? "a" : "b");
        (code == 200 ? ok : code == 404 ? absent : other)++;
      }
    });
  for (int round = 0; round < 4; ++round) {
    svc.apply({spec("a", a_path), spec("b", b_path)});   // b added, a kept
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    svc.apply({spec("b", b_path, 2)});                    // a removed, b changed
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_THROW(svc.apply({spec("b", b_path, 2), spec("c", "/nonexistent/c.gguf")}), NotFoundError);
    EXPECT_EQ(svc.names(), std::vector<std::string>{"b"});  // the failed load changed nothing
    svc.apply({spec("a", a_path)});                       // back to a alone
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  stop = true;
  for (auto& c : clients) c.join();
  std::printf("completions: %d answered, %d for a model not configured then\n", ok.load(), absent.load());
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(absent.load(), 0);
  EXPECT_EQ(svc.names(), std::vector<std::string>{"a"});
  EXPECT_EQ(complete(svc, "a"), 200);
  EXPECT_EQ(complete(svc, "b"), 404);
  EXPECT_THROW(svc.apply({spec("x", a_path), spec("x", b_path)}), InvalidArgumentError);  // a name twice
  std::filesystem::remove(a_path);
  std::filesystem::remove(b_path);
}

}  // namespace
}  // namespace kiln::serving

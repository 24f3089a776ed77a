#pragma once
// A Google Benchmark reporter that, besides the usual console table, pairs
// benchmarks named "<case>/kiln/<arg>" with "<case>/peer/<arg>" and prints the
// median time of each and the ratio peer_time / kiln_time (> 1: kiln is faster).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Aggregate || r.aggregate_name != "median") continue;
      std::string name = r.run_name.str();
      for (const char* who : {"/kiln/", "/peer/"}) {
        auto pos = name.find(who);
        if (pos == std::string::npos) continue;
        std::string key = name.substr(0, pos) + "/" + name.substr(pos + 6);
        auto& slot = pairs_[key];
        (who[1] == 'k' ? slot.kiln : slot.peer) = r.GetAdjustedRealTime();
        for (auto& [cname, c] : r.counters) (who[1] == 'k' ? slot.kiln_counters : slot.peer_counters)[cname] = c.value;
      }
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-34s %14s %14s %8s  %s\n", "case", "kiln (median)", "peer (median)", "ratio", "kiln/peer counters");
    for (auto& [k, p] : pairs_) {
      std::string extra;
      for (auto& [cn, v] : p.kiln_counters) {
        char buf[96];
        auto it = p.peer_counters.find(cn);
        std::snprintf(buf, sizeof buf, "%s=%.3g/%.3g ", cn.c_str(), v, it == p.peer_counters.end() ? 0.0 : it->second);
        extra += buf;
      }
      std::printf("%-34s %14.4g %14.4g %8.3f  %s\n", k.c_str(), p.kiln, p.peer, p.kiln > 0 ? p.peer / p.kiln : 0.0,
                  extra.c_str());
    }
    std::printf("(times in the benchmark's unit; ratio = peer/kiln, >= 1 means kiln is at least as fast)\n");
  }

 private:
  struct Pair {
    double kiln = 0, peer = 0;
    std::map<std::string, double> kiln_counters, peer_counters;
  };
  std::map<std::string, Pair> pairs_;
};

#define KILN_BENCH_MAIN()                                    \
  int main(int argc, char** argv) {                          \
    benchmark::Initialize(&argc, argv);                      \
    RatioReporter reporter;                                  \
    benchmark::RunSpecifiedBenchmarks(&reporter);            \
    benchmark::Shutdown();                                   \
    return 0;                                                \
  }

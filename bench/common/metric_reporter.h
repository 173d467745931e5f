// A Google Benchmark reporter that prints the console output as usual and, at the end, one
// machine-readable line per figure: `metric=NAME value=V unit=U` (the line format kiln's issue
// notes and docs/ tables are built from).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kiln::bench {

class MetricReporter : public benchmark::ConsoleReporter {
 public:
  // A figure derived from one benchmark run: name, unit, and a function of the run.
  struct Metric {
    std::string benchmark;  // run name to match (exact, e.g. "BM_CacheHit")
    std::string name;
    std::string unit;
    std::function<double(const Run&)> value;
  };

  explicit MetricReporter(std::vector<Metric> metrics) : metrics_(std::move(metrics)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration && r.aggregate_name != "median") continue;
      const std::string name = r.run_type == Run::RT_Iteration ? r.benchmark_name() : r.run_name.str();
      for (const Metric& m : metrics_)
        if (name == m.benchmark || name == m.benchmark + "/real_time") values_[m.name] = {m.unit, m.value(r)};
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    for (const auto& [name, v] : values_)
      std::printf("metric=%s value=%.4g unit=%s\n", name.c_str(), v.second, v.first.c_str());
    std::fflush(stdout);
  }

  // Seconds per iteration of a run (real time).
  static double seconds_per_iteration(const Run& r) { return r.GetAdjustedRealTime() * multiplier(r.time_unit); }

 private:
  static double multiplier(benchmark::TimeUnit u) {
    switch (u) {
      case benchmark::kNanosecond: return 1e-9;
      case benchmark::kMicrosecond: return 1e-6;
      case benchmark::kMillisecond: return 1e-3;
      case benchmark::kSecond: return 1.0;
    }
    return 1.0;
  }
  std::vector<Metric> metrics_;
  std::map<std::string, std::pair<std::string, double>> values_;
};

}  // namespace kiln::bench

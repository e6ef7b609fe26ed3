#pragma once
// A Prometheus text-format scrape, parsed into its series.

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace komputed::test_support {

class DaemonProcess;

// One scrape's samples, by series: a metric name and its labels (in any order).
class Samples {
 public:
  explicit Samples(const std::string& text);
  // A scrape of `daemon`'s metrics endpoint (empty when it does not answer).
  static Samples From(const DaemonProcess& daemon);

  // The value of a series; 0 when absent (a counter that never moved is not written yet).
  double Get(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // The sum over every series of `name` that carries `labels` (and any others): a device's
  // submissions over all its queues, say.
  double Sum(const std::string& name, const std::map<std::string, std::string>& labels) const;
  bool Has(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
  // Every metric name that has a # TYPE line, with its type.
  const std::map<std::string, std::string>& types() const { return types_; }
  size_t size() const { return values_.size(); }

 private:
  static std::string Key(const std::string& name, const std::map<std::string, std::string>& labels);
  struct Series {
    std::string name;
    std::map<std::string, std::string> labels;
    double value;
  };
  std::map<std::string, double> values_;
  std::vector<Series> series_;  // the labelled ones
  std::map<std::string, std::string> types_;
};

}  // namespace komputed::test_support

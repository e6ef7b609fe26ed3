#include "support/metrics.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "support/daemon_process.h"

namespace komputed::test_support {

Samples::Samples(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), ' ');
      if (parts.size() == 2) types_[parts[0]] = parts[1];
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double value = 0;
    const std::string number(line.substr(space + 1));
    if (!absl::SimpleAtod(number, &value)) continue;
    // name{label="value",...}: keyed with the labels in name order, whatever order they came in.
    const absl::string_view series = line.substr(0, space);
    const size_t brace = series.find('{');
    if (brace == absl::string_view::npos) {
      values_[std::string(series)] = value;
      continue;
    }
    std::map<std::string, std::string> labels;
    size_t i = brace + 1;
    while (i < series.size() && series[i] != '}') {
      const size_t eq = series.find("=\"", i);
      if (eq == absl::string_view::npos) break;
      std::string label(series.substr(i, eq - i));
      std::string text;
      size_t j = eq + 2;
      for (; j < series.size() && series[j] != '"'; ++j) {
        if (series[j] == '\\' && j + 1 < series.size()) ++j;
        text.push_back(series[j]);
      }
      labels[label] = text;
      i = j + 1;
      if (i < series.size() && series[i] == ',') ++i;
    }
    values_[Key(std::string(series.substr(0, brace)), labels)] = value;
    series_.push_back({std::string(series.substr(0, brace)), std::move(labels), value});
  }
}

std::string Samples::Key(const std::string& name,
                         const std::map<std::string, std::string>& labels) {
  if (labels.empty()) return name;
  std::string key = name + "{";
  bool first = true;
  for (const auto& [label, value] : labels) {
    absl::StrAppend(&key, first ? "" : ",", label, "=\"", value, "\"");
    first = false;
  }
  return key + "}";
}

double Samples::Get(const std::string& name,
                    const std::map<std::string, std::string>& labels) const {
  auto it = values_.find(Key(name, labels));
  return it == values_.end() ? 0 : it->second;
}

double Samples::Sum(const std::string& name,
                    const std::map<std::string, std::string>& labels) const {
  double sum = 0;
  for (const Series& s : series_) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [label, value] : labels) {
      auto it = s.labels.find(label);
      match &= it != s.labels.end() && it->second == value;
    }
    if (match) sum += s.value;
  }
  return sum;
}

bool Samples::Has(const std::string& name, const std::map<std::string, std::string>& labels) const {
  return values_.contains(Key(name, labels));
}

Samples Samples::From(const DaemonProcess& daemon) {
  return Samples(ScrapeMetrics(daemon.metrics_address()));
}

}  // namespace komputed::test_support

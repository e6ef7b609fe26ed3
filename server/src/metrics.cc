#include "metrics.h"

#include <netdb.h>
#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace komputed::server {

template <typename T, typename LabelNames>
Metric<T, LabelNames>::Metric(prometheus::Registry& registry, const char* name, const char* help,
                              LabelNames labels, prometheus::Histogram::BucketBoundaries buckets)
    : label_names_(labels), buckets_(std::move(buckets)) {
  if constexpr (std::is_same_v<T, prometheus::Counter>) {
    family_ = &prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
    family_ = &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
  } else {
    family_ = &prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
  }
  // A metric without labels has one series: show it (at zero) from the start.
  if constexpr (kLabels == 0) (*this)();
}

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>())
#define KD_INIT(member, name, help, ...) , member(*registry_, name, help, MetricLabels(__VA_ARGS__))
#define KD_INIT_HISTOGRAM(member, name, help, buckets, ...) \
  , member(*registry_, name, help, MetricLabels(__VA_ARGS__), buckets)
          KOMPUTED_METRICS(KD_INIT, KD_INIT, KD_INIT_HISTOGRAM)
#undef KD_INIT_HISTOGRAM
#undef KD_INIT
{
  // The series whose label values are known in advance start at zero, so that rate() and
  // increase() see their first events.
  for (const char* reason : {"idle", "drain"}) sessions_reaped_total(reason);
  for (const char* direction : {"upload", "download"}) {
    bytes_transferred_total(direction);
    execute_messages_total(direction);
  }
  for (const char* result : {"ok", "error"}) {
    shader_compilations_total(result);
    shader_validations_total(result);
  }
}

std::string Metrics::Text() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

std::string CodeLabel(int code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat("CODE_", code) : name;
}

// ---------------------------------------------------------------------------------------------
// MetricsEndpoint

struct MetricsEndpoint::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", listen, "\" is not host:port"));
  }
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  endpoint->impl_ = std::make_unique<Impl>();
  try {
    // prometheus-cpp reports a failure to listen by throwing (CivetWeb's exception).
    endpoint->impl_->exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, " (address in use?): ", e.what()));
  }
  endpoint->impl_->exposer->RegisterCollectable(registry, "/metrics");
  const std::vector<int> ports = endpoint->impl_->exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": no port was bound"));
  }
  endpoint->port_ = ports[0];
  endpoint->address_ = absl::StrCat(listen.substr(0, colon), ":", endpoint->port_);
  return endpoint;
}

namespace {

// Opens and closes a TCP connection to host:port (best effort).
void Knock(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

MetricsEndpoint::~MetricsEndpoint() {
  if (impl_ == nullptr || impl_->exposer == nullptr) return;
  // CivetWeb's listening thread polls with a 2 s timeout before it notices that it must stop;
  // connections wake it, so knock until the exposer is gone.
  std::string host = address_.substr(0, address_.rfind(':'));
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "[::]") host = "::1";
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  std::atomic<bool> stopped{false};
  std::thread knocker([&] {
    while (!stopped.load()) {
      Knock(host, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  impl_->exposer.reset();
  stopped.store(true);
  knocker.join();
}

}  // namespace komputed::server

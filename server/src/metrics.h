#pragma once
// Every metric that komputed exports, in one table (Envoy's stats-macro style): its name, type,
// help text and label names. The dashboard (deploy/grafana) and tests/deploy/check_deploy.py use
// these names; change them together. core never sees this file: the server counts what core does.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>

#include "absl/status/statusor.h"

namespace komputed::server {

// RPC durations: 10 µs to 10 s.
inline const prometheus::Histogram::BucketBoundaries kRpcDurationBuckets = {
    1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1,    2.5,  5,      10};

// COUNTER(member, name, help, label...), GAUGE(member, name, help, label...),
// HISTOGRAM(member, name, help, buckets, label...). Label values, in the order listed:
//   method     the gRPC method without its leading slash: "komputed.v1.Sequences/Eval"
//   code       the canonical gRPC code name: OK, INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE...
//   device     the daemon's device index (what OpenSession takes): "0"
//   queue      the device's queue index (every compute queue of the device, in family order)
//   reason     idle (no call for the idle timeout), drain (open when the daemon stopped)
//   direction  upload (client → daemon), download (daemon → client)
//   result     ok, error
//   tenant     a tenant's name (from the tenants file, a client certificate, or "default")
//   quota      a quota's name (tenants.h QuotaFields)
//   way        answer_word, socket
#define KOMPUTED_METRICS(COUNTER, GAUGE, HISTOGRAM)                                               \
  COUNTER(rpcs_total, "komputed_rpcs_total", "RPCs finished, by method and gRPC status code.",    \
          "method", "code")                                                                       \
  HISTOGRAM(rpc_duration_seconds, "komputed_rpc_duration_seconds",                                \
            "Seconds from an RPC's arrival to its status, by method (for a stream: its whole "    \
            "life).",                                                                             \
            kRpcDurationBuckets, "method")                                                        \
  GAUGE(sessions_open, "komputed_sessions_open", "Sessions open now.")                            \
  COUNTER(sessions_opened_total, "komputed_sessions_opened_total", "Sessions opened.")            \
  COUNTER(sessions_reaped_total, "komputed_sessions_reaped_total",                                \
          "Sessions that the daemon closed itself, by reason: idle (no call and no stream for "   \
          "the idle timeout), drain (still open when the daemon stopped).",                       \
          "reason")                                                                               \
  COUNTER(sequences_released_total, "komputed_sequences_released_total",                          \
          "Command buffers that idle sequences gave back to the driver "                          \
          "(--sequence_release_after); each is recorded again at its sequence's next "            \
          "submission.")                                                                          \
  COUNTER(shared_memory_tensors_total, "komputed_shared_memory_tensors_total",                    \
          "Tensors made over shared memory that a same-host client passed: their host data "      \
          "never crosses a socket.")                                                              \
  COUNTER(same_host_evals_total, "komputed_same_host_evals_total",                                \
          "Evals that same-host clients sent on the shared-memory socket's channel instead of "   \
          "gRPC.")                                                                                \
  COUNTER(same_host_rings_total, "komputed_same_host_rings_total",                                \
          "Same-host eval channels that passed a ring of shared memory: their evals and answers " \
          "go through it, without a system call while both ends poll.")                           \
  COUNTER(same_host_ring_evals_total, "komputed_same_host_ring_evals_total",                      \
          "Eval requests that came through same-host channels' rings, refused ones too.")         \
  COUNTER(same_host_ring_wakes_total, "komputed_same_host_ring_wakes_total",                      \
          "Ring answers after which the daemon woke a client that slept, by how: answer_word "    \
          "(a futex wake on the ring's answer number), socket (a doorbell record on the "         \
          "channel's socket, for a client that sleeps there).",                                   \
          "way")                                                                                  \
  GAUGE(device_memory_used_bytes, "komputed_device_memory_used_bytes",                            \
        "Tensor memory that sessions hold on the device, in bytes (a device tensor counts its "   \
        "buffer and its staging buffer).",                                                        \
        "device")                                                                                 \
  GAUGE(device_memory_limit_bytes, "komputed_device_memory_limit_bytes",                          \
        "Tensor memory the daemon lets sessions hold on the device: its device-local heaps, in "  \
        "bytes.",                                                                                 \
        "device")                                                                                 \
  COUNTER(submissions_total, "komputed_submissions_total",                                        \
          "Command buffers submitted to the device queue (evaluations that reached the device).", \
          "device", "queue")                                                                      \
  COUNTER(submitted_together_total, "komputed_submitted_together_total",                          \
          "Evaluations whose command buffers went to the device in one vkQueueSubmit with "       \
          "others (several evals of a stream ready at once; --submit_together).")                 \
  COUNTER(gpu_execution_seconds_total, "komputed_gpu_execution_seconds_total",                    \
          "GPU time of completed submissions, from their GPU timestamps (first to last); "        \
          "submissions of sequences without timestamps add nothing.",                             \
          "device", "queue")                                                                      \
  GAUGE(queue_depth, "komputed_queue_depth",                                                      \
        "Submissions in flight on the queue: submitted, and their evaluation not completed yet.", \
        "device", "queue")                                                                        \
  COUNTER(bytes_transferred_total, "komputed_bytes_transferred_total",                            \
          "Tensor data moved between clients and the daemon, in bytes: Eval uploads and "         \
          "downloads, CreateTensor data, WriteTensor and ReadTensor chunks.",                     \
          "direction")                                                                            \
  COUNTER(execute_messages_total, "komputed_execute_messages_total",                              \
          "Execute stream messages: requests read (upload) and events written (download). A "     \
          "client that batches sends several evals in one request, and gets several events in "   \
          "one.",                                                                                 \
          "direction")                                                                            \
  COUNTER(execute_evals_total, "komputed_execute_evals_total",                                    \
          "Evals that came on Execute streams (several to a request, from a client that "         \
          "batches).")                                                                            \
  GAUGE(execute_queued_bytes, "komputed_execute_queued_bytes",                                    \
        "Bytes of Execute events waiting to be written to their clients (being written "          \
        "included), all streams together; each stream holds at most --execute_window events.")    \
  COUNTER(shader_compilations_total, "komputed_shader_compilations_total",                        \
          "GLSL compute shaders compiled to SPIR-V, by result.", "result")                        \
  COUNTER(shader_validations_total, "komputed_shader_validations_total",                          \
          "Algorithm builds whose SPIR-V was validated, by result (error: the SPIR-V was "        \
          "rejected as invalid).",                                                                \
          "result")                                                                               \
  COUNTER(device_losses_total, "komputed_device_losses_total",                                    \
          "Devices lost (VK_ERROR_DEVICE_LOST).", "device")                                       \
  COUNTER(device_recoveries_total, "komputed_device_recoveries_total",                            \
          "Lost devices opened again (new sessions use the new opening).", "device")              \
  COUNTER(auth_failures_total, "komputed_auth_failures_total",                                    \
          "Calls refused as UNAUTHENTICATED, by reason: no_credentials, malformed, "              \
          "unknown_token, unknown_certificate.",                                                  \
          "reason")                                                                               \
  COUNTER(quota_refusals_total, "komputed_quota_refusals_total",                                  \
          "Requests refused as RESOURCE_EXHAUSTED by a tenant's quota, by quota name.", "quota")  \
  GAUGE(tenant_sessions_open, "komputed_tenant_sessions_open", "Sessions open now, by tenant.",   \
        "tenant")                                                                                 \
  GAUGE(tenant_memory_used_bytes, "komputed_tenant_memory_used_bytes",                            \
        "Tensor memory a tenant holds until the device has released it, in bytes, by kind: "      \
        "device (all of it, staging included) and host (host-visible).",                          \
        "tenant", "kind")                                                                         \
  GAUGE(tenant_submissions_in_flight, "komputed_tenant_submissions_in_flight",                    \
        "Evaluations a tenant has submitted that have not completed yet.", "tenant")              \
  COUNTER(tenant_errors_total, "komputed_tenant_errors_total",                                    \
          "Calls and evaluations of an authenticated tenant that failed, by gRPC status code.",   \
          "tenant", "code")

// The label names of a table entry, as an array whose size is the number of labels.
template <typename... Names>
constexpr std::array<const char*, sizeof...(Names)> MetricLabels(Names... names) {
  return {names...};
}

// One metric of the table: a prometheus-cpp family whose series are picked by label values given
// in the table's order. Lives as long as its Metrics. Thread-safe.
template <typename T, typename LabelNames>
class Metric {
 public:
  static constexpr size_t kLabels = std::tuple_size_v<LabelNames>;

  Metric(prometheus::Registry& registry, const char* name, const char* help, LabelNames labels,
         prometheus::Histogram::BucketBoundaries buckets = {});

  // The series with these label values (created at zero on first use). Keep the reference where
  // a value is used often: the lookup takes a lock.
  template <typename... Values>
  requires(sizeof...(Values) == kLabels) T& operator()(const Values&... values) {
    prometheus::Labels labels;
    size_t i = 0;
    ((labels.emplace(label_names_[i++], std::string(values))), ...);
    if constexpr (std::is_same_v<T, prometheus::Histogram>) {
      return family_->Add(labels, buckets_);
    } else {
      return family_->Add(labels);
    }
  }

  const std::string& name() const { return family_->GetName(); }
  const LabelNames& label_names() const { return label_names_; }

 private:
  prometheus::Family<T>* family_;
  LabelNames label_names_;
  prometheus::Histogram::BucketBoundaries buckets_;
};

// The metrics of one daemon, registered in one registry (the one that /metrics serves). Owned by
// the Server; everything that counts holds a pointer to it and lives shorter. Thread-safe.
class Metrics {
 public:
  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }
  // The exposition text of every metric (what /metrics returns).
  std::string Text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;  // before the metrics: they live in it

 public:
#define KD_METRIC_MEMBER(type, member, ...) \
  Metric<prometheus::type, decltype(MetricLabels(__VA_ARGS__))> member;
#define KD_COUNTER_MEMBER(member, name, help, ...) KD_METRIC_MEMBER(Counter, member, __VA_ARGS__)
#define KD_GAUGE_MEMBER(member, name, help, ...) KD_METRIC_MEMBER(Gauge, member, __VA_ARGS__)
#define KD_HISTOGRAM_MEMBER(member, name, help, buckets, ...) \
  KD_METRIC_MEMBER(Histogram, member, __VA_ARGS__)
  KOMPUTED_METRICS(KD_COUNTER_MEMBER, KD_GAUGE_MEMBER, KD_HISTOGRAM_MEMBER)
#undef KD_HISTOGRAM_MEMBER
#undef KD_GAUGE_MEMBER
#undef KD_COUNTER_MEMBER
#undef KD_METRIC_MEMBER
};

// The name of a gRPC (or absl, the same numbers) status code as a metric label: "NOT_FOUND".
std::string CodeLabel(int code);

// Serves a registry's metrics over HTTP at /metrics (prometheus-cpp's exposer, on its own
// threads) until destroyed. Thread-safe.
class MetricsEndpoint {
 public:
  // `listen` is host:port; port 0 picks a free port. UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  // The listen address with the bound port, e.g. "127.0.0.1:9464".
  const std::string& address() const { return address_; }

 private:
  MetricsEndpoint() = default;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string address_;
};

}  // namespace komputed::server

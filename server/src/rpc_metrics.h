#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "metrics.h"
#include "work_gate.h"

namespace komputed::server {

// A gRPC server interceptor factory that counts every RPC by method and status code
// (komputed_rpcs_total) and times it from its arrival to its status
// (komputed_rpc_duration_seconds): every service, health and reflection included, whatever
// reactor finishes it. It also tells the gate of each arrival (for the drain's quiet period).
// `metrics` and `gate` must outlive the gRPC server. Thread-safe.
class RpcMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsFactory(Metrics* metrics, WorkGate* gate) : metrics_(metrics), gate_(gate) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

  // The series of one method, created on its first call.
  struct MethodSeries {
    std::string method;  // "komputed.v1.Sequences/Eval"
    prometheus::Histogram* duration = nullptr;
    std::array<std::atomic<prometheus::Counter*>, 17> by_code{};  // by gRPC code
  };
  // Counts a finished call of `series`.
  void Record(MethodSeries& series, int code, double seconds);

 private:
  MethodSeries& SeriesFor(const char* method);

  Metrics* const metrics_;
  WorkGate* const gate_;
  absl::Mutex mu_;
  // Node map: the series stay where they are while the map grows.
  absl::node_hash_map<std::string, MethodSeries> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::server

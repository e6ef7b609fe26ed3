#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "metrics.h"
#include "work_gate.h"

namespace komputed::server {

// A gRPC server interceptor factory that counts every RPC by method and status code
// (komputed_rpcs_total) and times it from its arrival to its status
// (komputed_rpc_duration_seconds): every service, health and reflection included, whatever
// reactor finishes it. It also tells the gate of each arrival (for the drain's quiet period).
// A call of a method that the server does not serve (any path a client makes up) counts under the
// one method label kUnknownMethod, so that such calls cannot create series without bound.
// `metrics` and `gate` must outlive the gRPC server. Thread-safe.
class RpcMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // The method label of every call to a method outside `methods`.
  static constexpr absl::string_view kUnknownMethod = "unknown";

  // `methods`: the methods the server serves, as labelled ("komputed.v1.Sequences/Eval").
  RpcMetricsFactory(Metrics* metrics, WorkGate* gate, absl::flat_hash_set<std::string> methods)
      : metrics_(metrics), gate_(gate), known_(std::move(methods)) {}

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
  const absl::flat_hash_set<std::string> known_;
  absl::Mutex mu_;
  // Node map: the series stay where they are while the map grows.
  absl::node_hash_map<std::string, MethodSeries> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::server

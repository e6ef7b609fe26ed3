#include "rpc_metrics.h"

#include <chrono>

namespace komputed::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

// Lives as long as its call; gRPC calls Intercept for each batch of the call's operations.
class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcMetricsFactory* factory, RpcMetricsFactory::MethodSeries* series)
      : factory_(factory), series_(series), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      factory_->Record(*series_, static_cast<int>(status.error_code()), seconds);
    }
    methods->Proceed();
  }

 private:
  RpcMetricsFactory* const factory_;
  RpcMetricsFactory::MethodSeries* const series_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace

grpc::experimental::Interceptor* RpcMetricsFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  gate_->NoteCall();
  if (info->method() == nullptr) return nullptr;
  return new RpcMetricsInterceptor(this, &SeriesFor(info->method()));
}

RpcMetricsFactory::MethodSeries& RpcMetricsFactory::SeriesFor(const char* method) {
  absl::string_view name(method);
  if (!name.empty() && name.front() == '/') name.remove_prefix(1);
  if (!known_.contains(name)) name = kUnknownMethod;
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = methods_.try_emplace(std::string(name));
  MethodSeries& series = it->second;
  if (inserted) {
    series.method = it->first;
    series.duration = &metrics_->rpc_duration_seconds(series.method);
  }
  return series;
}

void RpcMetricsFactory::Record(MethodSeries& series, int code, double seconds) {
  series.duration->Observe(seconds);
  if (code < 0 || code >= static_cast<int>(series.by_code.size())) {
    metrics_->rpcs_total(series.method, CodeLabel(code)).Increment();
    return;
  }
  prometheus::Counter* counter = series.by_code[code].load(std::memory_order_acquire);
  if (counter == nullptr) {
    // Family::Add returns the same series to every thread that races here.
    counter = &metrics_->rpcs_total(series.method, CodeLabel(code));
    series.by_code[code].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

}  // namespace komputed::server

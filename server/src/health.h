#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "call_queue.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace komputed::server {

// The standard grpc.health.v1.Health service (what Kubernetes' gRPC probes ask). The server as a
// whole ("") and each service named at construction share one status: SERVING while the Server
// says so (a device is usable and the daemon is not draining), else NOT_SERVING. Check of an
// unknown service is NOT_FOUND; Watch of one answers SERVICE_UNKNOWN and stays open, as the
// protocol asks. Watch sends the status now, then each change. Owned by the Server; Shutdown
// must run before the gRPC server shuts down (it ends the Watch streams). Thread-safe.
class HealthService final : public grpc::health::v1::Health::AsyncService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // Starts NOT_SERVING.
  explicit HealthService(const std::vector<std::string>& services);
  ~HealthService() override = default;

  // Sets the status of "" and every known service, and tells the watchers of a change. After
  // Shutdown it stays NOT_SERVING.
  void SetServing(bool serving);
  bool serving() const;
  // NOT_SERVING for good, and ends every Watch stream (OK status after the last update). Later
  // Watch calls get the status and end at once.
  void Shutdown();

  using WatchOps =
      StreamOps<grpc::health::v1::HealthCheckRequest, grpc::health::v1::HealthCheckResponse>;
  // Adds Check and Watch to the queue that serves them.
  void AddTo(CallQueue& queue);
  void ServeCheck(grpc::ServerContext* context, const grpc::health::v1::HealthCheckRequest* request,
                  grpc::health::v1::HealthCheckResponse* response, Answer answer);
  StreamReactor<grpc::health::v1::HealthCheckRequest, grpc::health::v1::HealthCheckResponse>*
  ServeWatch(grpc::ServerContext* context, const grpc::health::v1::HealthCheckRequest* request,
             WatchOps* stream);

 private:
  class Watcher;
  friend class Watcher;

  // The status of `service` now: SERVICE_UNKNOWN for a service it does not know.
  ServingStatus StatusLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(Watcher* watcher);

  // Sets the status and collects what each watcher must be sent; then sends it.
  void Update(bool serving, bool shut_down);

  const absl::flat_hash_set<std::string> services_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::server

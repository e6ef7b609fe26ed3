#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "auth.h"
#include "call_queue.h"
#include "device_pool.h"
#include "health.h"
#include "metrics.h"
#include "reflection.h"
#include "server_options.h"
#include "services.h"
#include "session_manager.h"
#include "work_gate.h"

namespace komputed::server {

// The komputed daemon: its devices, its sessions, the gRPC server that serves them (with server
// reflection and the grpc.health.v1 health service), and its metrics (served over HTTP when
// metrics_listen is set). Start() returns once it is listening. Health is SERVING while at least
// one device is usable (not lost) and the daemon is not draining or stopped.
// Thread-safe; Drain and Shutdown may be called from any thread, more than once.
class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  // Shuts down (with a short grace period) if that was not done.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port actually bound (the one chosen when listen asked for port 0).
  int port() const { return port_; }
  // The listen address with the bound port, e.g. "127.0.0.1:43125".
  std::string address() const;
  // The metrics address with the bound port ("127.0.0.1:9464"); empty when not served.
  std::string metrics_address() const;
  // The health-only address with the bound port; empty when not served.
  std::string health_address() const;
  const ServerOptions& options() const { return options_; }
  Metrics& metrics() const { return *metrics_; }

  // The graceful stop (SIGTERM): health turns NOT_SERVING; new sessions and new evaluations
  // (Eval, and each Execute request) are refused with UNAVAILABLE ("komputed is draining");
  // evaluations in flight complete, for up to `timeout`, and the daemon keeps answering (with
  // refusals) until no call has come for 200 ms, within `timeout`; then Shutdown(1 s) lets the
  // last replies reach their clients, ends the remaining calls and streams (cancelled) and
  // frees every session. Returns when all of that is done.
  void Drain(absl::Duration timeout);
  // True once a drain has turned health NOT_SERVING and refuses new work: from then on every
  // new session and evaluation is refused.
  bool draining() const;

  // Reads the tenants file again (SIGHUP); on error the tenants in force stay and the error is
  // returned (and logged). OK without a tenants file.
  absl::Status ReloadTenants() { return auth_->Reload(); }
  const Authenticator& authenticator() const { return *auth_; }

  // Stops taking calls, lets calls in progress finish for up to `grace` (then cancels them and
  // waits for their submissions to complete), and closes every session.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  // Blocks until Shutdown has completed.
  void Wait();

 private:
  explicit Server(ServerOptions options) : options_(std::move(options)) {}

  // SERVING while a device is usable and the daemon is not draining.
  void UpdateHealth();

  const ServerOptions options_;
  int port_ = 0;
  // The socket file of a unix:PATH listen address. gRPC removes it when it stops listening; what
  // is left then (a start that failed after binding) is removed when the server goes, if it is
  // still the one made at start (same inode).
  std::string socket_path_;
  uint64_t socket_inode_ = 0;
  // Destroyed in reverse order: the metrics endpoint and gRPC first, then the services, the
  // sessions and the devices (whose waiters' last callbacks may still update health, the gate
  // and the metrics), then those.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<WorkGate> gate_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<HealthService> plain_health_;  // on health_listen, when set
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<Authenticator> auth_;
  std::atomic<bool> draining_{false};  // set as a drain starts: health turns NOT_SERVING
  std::atomic<bool> stopped_{false};   // set by Shutdown: health no longer follows the devices
  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<BuildPool> builds_;  // its jobs finish calls and hold sessions
  std::unique_ptr<DevicesService> devices_service_;
  std::unique_ptr<SessionsService> sessions_service_;
  std::unique_ptr<TensorsService> tensors_service_;
  std::unique_ptr<AlgorithmsService> algorithms_service_;
  std::unique_ptr<SequencesService> sequences_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<CallQueue> calls_;  // grpc_server_'s queue and threads: every call
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<CallQueue> health_calls_;  // health_server_'s
  int health_port_ = 0;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
};

}  // namespace komputed::server

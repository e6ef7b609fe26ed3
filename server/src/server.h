#pragma once

#include <grpcpp/server.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device_pool.h"
#include "services.h"
#include "session_manager.h"

namespace komputed::server {

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (see Server::port()).
  std::string listen = "127.0.0.1:50051";
  // Physical device indices to serve, in the daemon's order; empty: every device.
  std::vector<uint32_t> devices;
  absl::Duration session_idle_timeout = absl::Seconds(60);
  // Bound on an eval's wait for the device when the request gives none.
  absl::Duration eval_timeout = absl::Seconds(600);
  // Largest message received or sent.
  int max_message_bytes = 64 << 20;
};

// The komputed daemon: its devices, its sessions and the gRPC server that serves them (with
// server reflection and the standard health service). Start() returns once it is listening.
// Thread-safe; Shutdown may be called from any thread, more than once.
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
  const ServerOptions& options() const { return options_; }

  // Stops taking calls, lets calls in progress finish for up to `grace` (then cancels them and
  // waits for their submissions to complete), and closes every session.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  // Blocks until Shutdown has completed.
  void Wait();

 private:
  explicit Server(ServerOptions options) : options_(std::move(options)) {}

  const ServerOptions options_;
  int port_ = 0;
  // Destroyed in reverse order: gRPC first, then the sessions, then the devices.
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<DevicesService> devices_service_;
  std::unique_ptr<SessionsService> sessions_service_;
  std::unique_ptr<TensorsService> tensors_service_;
  std::unique_ptr<AlgorithmsService> algorithms_service_;
  std::unique_ptr<SequencesService> sequences_service_;
  std::unique_ptr<grpc::Server> grpc_server_;

  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace komputed::server

#include "server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"

namespace komputed::server {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.max_message_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes ", options.max_message_bytes,
                                                   " is too small (at least 4096)"));
  }
  if (options.session_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the session idle timeout must be positive");
  }
  if (options.eval_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the eval timeout must be positive");
  }
  auto server = std::unique_ptr<Server>(new Server(std::move(options)));
  const ServerOptions& o = server->options_;

  KD_ASSIGN_OR_RETURN(server->pool_, DevicePool::Create(o.devices));
  SessionManagerOptions session_options;
  session_options.idle_timeout = o.session_idle_timeout;
  session_options.eval_timeout = o.eval_timeout;
  session_options.max_message_bytes = static_cast<uint64_t>(o.max_message_bytes);
  server->sessions_ = std::make_unique<SessionManager>(server->pool_.get(), session_options);

  ServiceContext context{server->pool_.get(), server->sessions_.get(),
                         static_cast<uint64_t>(o.max_message_bytes)};
  server->devices_service_ = std::make_unique<DevicesService>(context);
  server->sessions_service_ = std::make_unique<SessionsService>(context);
  server->tensors_service_ = std::make_unique<TensorsService>(context);
  server->algorithms_service_ = std::make_unique<AlgorithmsService>(context);
  server->sequences_service_ = std::make_unique<SequencesService>(context);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.SetMaxReceiveMessageSize(o.max_message_bytes);
  builder.SetMaxSendMessageSize(o.max_message_bytes);
  builder.RegisterService(server->devices_service_.get());
  builder.RegisterService(server->sessions_service_.get());
  builder.RegisterService(server->tensors_service_.get());
  builder.RegisterService(server->algorithms_service_.get());
  builder.RegisterService(server->sequences_service_.get());
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", o.listen, " (address in use, or not a host:port?)"));
  }
  spdlog::info("komputed serving {} device(s) on {}", server->pool_->size(), server->address());
  return server;
}

Server::~Server() { Shutdown(); }

std::string Server::address() const {
  const std::string& listen = options_.listen;
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  return absl::StrCat(host, ":", port_);
}

void Server::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      mu_.Await(absl::Condition(&shut_down_));
      return;
    }
    shutting_down_ = true;
  }
  if (grpc_server_ != nullptr) {
    spdlog::info("komputed shutting down");
    // Waits for every call to end: those still running after `grace` are cancelled, and their
    // reactors finish once their submissions complete.
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  }
  if (sessions_ != nullptr) sessions_->Shutdown();
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

void Server::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

}  // namespace komputed::server

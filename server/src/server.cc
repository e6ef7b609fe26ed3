#include "server.h"

#include <google/protobuf/descriptor.h>
#include <grp.h>
#include <grpc/grpc.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "komputed/core/status.h"
#include "rpc_metrics.h"
#include "tls.h"

namespace komputed::server {
namespace {

// NVIDIA's driver ends a GPU context whose kernel has held the GPU for about 5 s while other work
// waits (kernel log: Xid 109, CTX SWITCH TIMEOUT), without reporting the device lost: the
// watchdog must stop a runaway before that. Measured on an H200 (driver 580): a runaway stopped
// at 2, 3 or 4 s left the device 40 to 105 ms later; one stopped at 5 s hung the device.
constexpr absl::Duration kNvidiaSafeKernelTime = absl::Seconds(4);

void WarnOfUnsafeKernelTime(const DevicePool& pool, absl::Duration max_kernel_time) {
  for (size_t i = 0; i < pool.size(); ++i) {
    const VkPhysicalDeviceProperties& p = pool.at(i).info().properties;
    constexpr uint32_t kNvidia = 0x10de;
    if (p.vendorID != kNvidia) continue;
    if (max_kernel_time > absl::ZeroDuration() && max_kernel_time <= kNvidiaSafeKernelTime) {
      continue;
    }
    spdlog::warn(
        "device {} ({}): --max_kernel_time={} is {}; NVIDIA's driver ends a context whose kernel "
        "holds the GPU about 5s while other work waits (Xid 109), which leaves the device "
        "unusable: keep it at most {}",
        i, p.deviceName, absl::FormatDuration(max_kernel_time),
        max_kernel_time == absl::ZeroDuration() ? "off" : "over that",
        absl::FormatDuration(kNvidiaSafeKernelTime));
  }
}

// After the evaluations of a drain have completed: how long no call may arrive before gRPC stops
// (clients still calling get refusals, not calls cut off), and then how long the last replies
// have to reach their clients before the remaining calls (idle streams) are cancelled.
constexpr absl::Duration kQuietPeriod = absl::Milliseconds(200);
constexpr absl::Duration kReplyGrace = absl::Seconds(1);

std::string SecondsSince(absl::Time start) {
  return absl::StrFormat("%.3fs", absl::ToDoubleSeconds(absl::Now() - start));
}

// A step of the teardown, timed in the debug log ("komputed stopping: <what> in <seconds>"), so
// that a slow one shows where.
template <typename Step>
void TimedStep(const char* what, Step step) {
  const absl::Time start = absl::Now();
  step();
  spdlog::debug("komputed stopping: {} in {}", what, SecondsSince(start));
}

// The methods of the services the daemon serves, as the metrics label them
// ("komputed.v1.Sequences/Eval"), from the services' descriptors: komputed's, health's, and server
// reflection's.
absl::flat_hash_set<std::string> ServedMethods(std::vector<std::string> services) {
  services.push_back(grpc::health::v1::Health::service_full_name());
  services.push_back("grpc.reflection.v1alpha.ServerReflection");
  absl::flat_hash_set<std::string> methods;
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const std::string& name : services) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    if (service == nullptr) continue;  // not linked in: its calls count as unknown
    for (int i = 0; i < service->method_count(); ++i) {
      methods.insert(absl::StrCat(name, "/", service->method(i)->name()));
    }
  }
  return methods;
}

absl::Status CheckGrpcLimits(const ServerOptions& o) {
  if (o.max_concurrent_streams < 0) {
    return absl::InvalidArgumentError("max_concurrent_streams must not be negative");
  }
  if (o.keepalive_time < absl::ZeroDuration() || o.keepalive_timeout <= absl::ZeroDuration() ||
      o.keepalive_min_client_interval < absl::ZeroDuration() || o.keepalive_max_ping_strikes < 0) {
    return absl::InvalidArgumentError(
        "keepalive_time, keepalive_min_client_interval and keepalive_max_ping_strikes must not be "
        "negative, and keepalive_timeout must be positive");
  }
  if (o.max_connection_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_connection_idle must not be negative");
  }
  // A message each way, the transport's read buffers and the previous call's buffers that are
  // still being released: with less, a client's back-to-back calls of the largest message are
  // refused (RST_STREAM, ENHANCE_YOUR_CALM) while a loaded host frees the last one.
  const uint64_t least_memory = 4 * static_cast<uint64_t>(o.max_message_bytes);
  if (o.grpc_memory_bytes != 0 && o.grpc_memory_bytes < least_memory) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc_memory_bytes ", o.grpc_memory_bytes,
                     " is too small for messages of max_message_bytes ", o.max_message_bytes,
                     ": give at least ", least_memory, " (or 0: no bound)"));
  }
  if (o.execute_window < 1) return absl::InvalidArgumentError("execute_window must be at least 1");
  return absl::OkStatus();
}

// A duration as the milliseconds of a gRPC argument (an int), at least 1 ms.
int ArgMilliseconds(absl::Duration d) {
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, std::numeric_limits<int>::max()));
}

// gRPC's limits on each connection (ServerOptions), for one listener.
void ApplyGrpcLimits(const ServerOptions& o, grpc::ServerBuilder& builder) {
  if (o.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, o.max_concurrent_streams);
  }
  // The daemon's own pings: INT_MAX milliseconds turns them off.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, o.keepalive_time == absl::ZeroDuration()
                                                             ? std::numeric_limits<int>::max()
                                                             : ArgMilliseconds(o.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ArgMilliseconds(o.keepalive_timeout));
  // A stream that carries no data (an Execute stream waiting for work) still gets pinged: that
  // is how a vanished client is noticed.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(o.keepalive_min_client_interval),
                                         std::numeric_limits<int>::max())));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, o.keepalive_max_ping_strikes);
  if (o.max_connection_idle > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               ArgMilliseconds(o.max_connection_idle));
  }
}

bool IsUnixAddress(const std::string& listen) {
  return absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:");
}

// The socket file of a unix:PATH address (gRPC's forms: unix:relative, unix:/absolute,
// unix:///absolute); none for other addresses and for unix-abstract:NAME.
std::optional<std::string> UnixSocketPath(const std::string& listen) {
  if (!absl::StartsWith(listen, "unix:")) return std::nullopt;
  std::string path = listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  return path;
}

// The group id of a name or a number.
absl::StatusOr<gid_t> GroupId(const std::string& group) {
  gid_t gid = 0;
  if (absl::SimpleAtoi(group, &gid)) return gid;
  std::vector<char> buffer(16384);
  struct group entry;
  struct group* found = nullptr;
  const int err = getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (err != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen_socket_group: no group '", group, "'",
                     err != 0 ? absl::StrCat(" (", std::strerror(err), ")") : ""));
  }
  return found->gr_gid;
}

// The inode of the socket file at `path`.
absl::StatusOr<uint64_t> SocketInode(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("listening on unix:", path, ", but there is no socket file at that path"));
  }
  return static_cast<uint64_t>(st.st_ino);
}

// Gives the socket file its mode and group (ServerOptions::listen_socket_*).
absl::Status SetSocketPermissions(const std::string& path, const ServerOptions& o) {
  if (o.listen_socket_mode != 0 && chmod(path.c_str(), o.listen_socket_mode) != 0) {
    return absl::UnavailableError(absl::StrFormat("--listen_socket_mode: chmod %04o %s: %s",
                                                  o.listen_socket_mode, path,
                                                  std::strerror(errno)));
  }
  if (!o.listen_socket_group.empty()) {
    KD_ASSIGN_OR_RETURN(gid_t gid, GroupId(o.listen_socket_group));
    if (chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      return absl::UnavailableError(
          absl::StrCat("--listen_socket_group: chown :", o.listen_socket_group, " ", path, ": ",
                       std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// A listen address (host:port) with the port actually bound; a Unix socket's address as given.
std::string WithPort(const std::string& listen, int port) {
  if (IsUnixAddress(listen)) return listen;
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.max_message_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes ", options.max_message_bytes,
                                                   " is too small (at least 4096)"));
  }
  if (options.session_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the session idle timeout must be positive");
  }
  if (options.sequence_release_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--sequence_release_after must be zero (never) or positive");
  }
  if (options.eval_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the eval timeout must be positive");
  }
  if (!(options.dispatch_share > 0.0 && options.dispatch_share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch_share ", options.dispatch_share, " is outside (0, 1]"));
  }
  if (options.eval_spin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the eval spin must not be negative");
  }
  if (options.eval_hold < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--eval_hold must not be negative");
  }
  if (options.eval_inline_waiters < 0) {
    return absl::InvalidArgumentError("the number of inline eval waiters must not be negative");
  }
  if (options.grpc_threads < 1 || options.grpc_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc_threads ", options.grpc_threads, " is outside [1, 64]"));
  }
  if (options.eval_poll.has_value() && *options.eval_poll < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--eval_poll must not be negative");
  }
  if (options.eval_inline_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the eval inline wait must not be negative");
  }
  if (options.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the drain timeout must not be negative");
  }
  if (options.device_recovery_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the device recovery interval must not be negative");
  }
  if ((options.listen_socket_mode != 0 || !options.listen_socket_group.empty()) &&
      !UnixSocketPath(options.listen).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen_socket_mode and --listen_socket_group apply to a unix:PATH --listen, not ",
        options.listen));
  }
  if (options.listen_socket_mode > 07777) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--listen_socket_mode %o is not a file mode (at most 7777, octal)",
                        options.listen_socket_mode));
  }
  KD_RETURN_IF_ERROR(CheckGrpcLimits(options));
  KD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      ServerCredentialsFor(options));
  if (!options.glsl_compiler.empty()) {
    if (access(options.glsl_compiler.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("the GLSL compiler ", options.glsl_compiler,
                                                     " is not an executable program"));
    }
  }
  auto server = std::unique_ptr<Server>(new Server(std::move(options)));
  Server* const s = server.get();
  const ServerOptions& o = s->options_;

  s->metrics_ = std::make_unique<Metrics>();
  s->gate_ = std::make_unique<WorkGate>();
  KD_ASSIGN_OR_RETURN(s->auth_, Authenticator::Create(o, s->metrics_.get()));
  const std::vector<std::string> services = {
      v1::Devices::service_full_name(), v1::Sessions::service_full_name(),
      v1::Tensors::service_full_name(), v1::Algorithms::service_full_name(),
      v1::Sequences::service_full_name()};
  s->health_ = std::make_unique<HealthService>(services);
  if (!o.health_listen.empty()) s->plain_health_ = std::make_unique<HealthService>(services);

  KD_ASSIGN_OR_RETURN(s->pool_, DevicePool::Create(o, s->metrics_.get()));
  s->pool_->SetStateListener([s] { s->UpdateHealth(); });
  WarnOfUnsafeKernelTime(*s->pool_, o.max_kernel_time);
  s->sessions_ =
      std::make_unique<SessionManager>(s->pool_.get(), o, s->metrics_.get(), s->gate_.get());

  s->builds_ = std::make_unique<BuildPool>(o.build_threads, o.max_queued_builds);
  ServiceContext context{s->pool_.get(),    s->sessions_.get(), s->auth_.get(), &o,
                         s->metrics_.get(), s->builds_.get()};
  s->devices_service_ = std::make_unique<DevicesService>(context);
  s->sessions_service_ = std::make_unique<SessionsService>(context);
  s->tensors_service_ = std::make_unique<TensorsService>(context);
  s->algorithms_service_ = std::make_unique<AlgorithmsService>(context);
  s->sequences_service_ = std::make_unique<SequencesService>(context);

  if (!o.metrics_listen.empty()) {
    KD_ASSIGN_OR_RETURN(s->metrics_endpoint_,
                        MetricsEndpoint::Start(o.metrics_listen, s->metrics_->registry()));
  }

  // The health and reflection services are komputed's own (HealthService, ReflectionService), on
  // its CallQueue: gRPC's default health service stays off, and its reflection plugin (a service
  // on gRPC's synchronous API, whose threads would do the reading for every call) is not used.
  std::vector<std::string> listed = services;
  listed.push_back(grpc::health::v1::Health::service_full_name());
  s->reflection_ = std::make_unique<ReflectionService>(std::move(listed));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(o.max_message_bytes);
  builder.SetMaxSendMessageSize(o.max_message_bytes);
  ApplyGrpcLimits(o, builder);
  if (o.grpc_memory_bytes != 0) {  // the plain health listener's few bytes are not counted
    grpc::ResourceQuota quota("komputed");
    quota.Resize(static_cast<size_t>(o.grpc_memory_bytes));
    builder.SetResourceQuota(quota);  // the builder holds a reference of its own
  }
  builder.RegisterService(s->devices_service_.get());
  builder.RegisterService(s->sessions_service_.get());
  builder.RegisterService(s->tensors_service_.get());
  builder.RegisterService(s->algorithms_service_.get());
  builder.RegisterService(s->sequences_service_.get());
  builder.RegisterService(s->health_.get());
  builder.RegisterService(s->reflection_.get());
  s->calls_ = std::make_unique<CallQueue>(
      builder, o.grpc_threads,
      o.eval_poll.value_or(s->pool_->any_gpu() ? kDefaultEvalPoll : absl::ZeroDuration()),
      o.eval_hold_off);
  s->devices_service_->AddTo(*s->calls_);
  s->sessions_service_->AddTo(*s->calls_);
  s->tensors_service_->AddTo(*s->calls_);
  s->algorithms_service_->AddTo(*s->calls_);
  s->sequences_service_->AddTo(*s->calls_);
  s->health_->AddTo(*s->calls_);
  s->reflection_->AddTo(*s->calls_);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsFactory>(s->metrics_.get(), s->gate_.get(),
                                                             ServedMethods(services)));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", o.listen, " (address in use, or not a host:port?)"));
  }
  s->calls_->Start();
  if (std::optional<std::string> path = UnixSocketPath(o.listen)) {
    KD_ASSIGN_OR_RETURN(s->socket_inode_, SocketInode(*path));
    s->socket_path_ = *path;  // removed with the server, also when the permissions fail
    KD_RETURN_IF_ERROR(SetSocketPermissions(*path, o));
  }
  if (s->plain_health_ != nullptr) {
    grpc::ServerBuilder health;
    health.AddListeningPort(o.health_listen, grpc::InsecureServerCredentials(), &s->health_port_);
    ApplyGrpcLimits(o, health);
    health.RegisterService(s->plain_health_.get());
    s->health_calls_ = std::make_unique<CallQueue>(health, /*threads=*/1, absl::ZeroDuration());
    s->plain_health_->AddTo(*s->health_calls_);
    s->health_server_ = health.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot serve health on ", o.health_listen,
                                                 " (address in use, or not a host:port?)"));
    }
    s->health_calls_->Start();
  }
  s->UpdateHealth();
  spdlog::info("komputed serving {} device(s) on {} ({}, {}){}", s->pool_->size(), s->address(),
               o.tls_cert.empty()        ? "plain text"
               : o.tls_client_ca.empty() ? "TLS"
                                         : "mutual TLS",
               !o.tenants_file.empty()   ? absl::StrCat(s->auth_->registry()->Names().size(),
                                                        " tenant(s) from ", o.tenants_file)
               : o.tls_client_ca.empty() ? std::string("no authentication")
                                         : std::string("tenants named by client certificates"),
               s->metrics_endpoint_ == nullptr
                   ? ", metrics not served"
                   : absl::StrCat(", metrics on http://", s->metrics_address(), "/metrics"));
  return server;
}

Server::~Server() {
  Shutdown();
  // Released in this order.
  TimedStep("metrics endpoint released", [this] { metrics_endpoint_.reset(); });
  TimedStep("gRPC server released", [this] {
    health_server_.reset();
    health_calls_.reset();
    grpc_server_.reset();
    calls_.reset();
    sequences_service_.reset();
    algorithms_service_.reset();
    tensors_service_.reset();
    sessions_service_.reset();
    devices_service_.reset();
  });
  // The build pool's last jobs may still hold sessions.
  TimedStep("sessions released", [this] {
    builds_.reset();
    sessions_.reset();
  });
  TimedStep("devices released", [this] { pool_.reset(); });
  // The socket file goes with the server (gRPC has removed it already after a normal start).
  struct stat st;
  if (!socket_path_.empty() && lstat(socket_path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      static_cast<uint64_t>(st.st_ino) == socket_inode_) {
    if (unlink(socket_path_.c_str()) != 0) {
      spdlog::warn("cannot remove the socket file {}: {}", socket_path_, std::strerror(errno));
    }
  }
}

std::string Server::address() const { return WithPort(options_.listen, port_); }

std::string Server::health_address() const {
  return health_server_ == nullptr ? std::string() : WithPort(options_.health_listen, health_port_);
}

std::string Server::metrics_address() const {
  return metrics_endpoint_ == nullptr ? std::string() : metrics_endpoint_->address();
}

void Server::UpdateHealth() {
  // After Shutdown the pool may be going (its waiters' last callbacks can report a loss).
  if (stopped_.load()) return;
  const bool serving = !draining_.load() && pool_->usable() > 0;
  health_->SetServing(serving);
  if (plain_health_ != nullptr) plain_health_->SetServing(serving);
}

bool Server::draining() const {
  // The gate closes after health has turned NOT_SERVING (Drain), so both already hold.
  return draining_.load() && gate_ != nullptr && gate_->closed();
}

void Server::Drain(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_ || draining_.load()) {
      mu_.Await(absl::Condition(&shut_down_));
      return;
    }
    draining_.store(true);
  }
  const absl::Time start = absl::Now();
  UpdateHealth();  // NOT_SERVING first: probes and load balancers stop sending work
  gate_->Close();  // then new sessions and evaluations are refused
  spdlog::info(
      "komputed draining: refusing new sessions and evaluations, waiting up to {} for "
      "{} evaluation(s) in flight",
      absl::FormatDuration(timeout), gate_->in_flight());
  if (gate_->WaitIdle(start + timeout)) {
    // Clients whose evaluations just completed may be calling again: answer them (UNAVAILABLE)
    // until they have stopped, within the drain timeout.
    gate_->WaitQuiet(kQuietPeriod, start + timeout);
    spdlog::info("komputed drained in {}", SecondsSince(start));
  } else {
    spdlog::warn("komputed drain timeout ({}): {} evaluation(s) still in flight are cancelled",
                 absl::FormatDuration(timeout), gate_->in_flight());
  }
  Shutdown(kReplyGrace);
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
  if (gate_ != nullptr) gate_->Close();
  stopped_.store(true);
  // NOT_SERVING, and the Watch streams end (else gRPC would wait for them until `grace`).
  if (health_ != nullptr) health_->Shutdown();
  if (plain_health_ != nullptr) plain_health_->Shutdown();
  if (health_server_ != nullptr) health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  if (health_calls_ != nullptr) health_calls_->Shutdown();
  if (grpc_server_ != nullptr) {
    spdlog::info("komputed shutting down");
    // Calls still running after `grace` are cancelled.
    TimedStep("gRPC calls ended",
              [&] { grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + grace)); });
  }
  // gRPC does not wait for the calls that it cancelled: the CallQueue waits for them to end (an
  // eval once its submission completes, a stream once its reactor has finished) before it shuts
  // its queue down.
  if (calls_ != nullptr) TimedStep("calls answered", [this] { calls_->Shutdown(); });
  if (sessions_ != nullptr) TimedStep("sessions freed", [this] { sessions_->Shutdown(); });
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

void Server::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

}  // namespace komputed::server

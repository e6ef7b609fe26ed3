// komputed: the GPU compute daemon. Parses flags, starts the server, serves until SIGINT or
// SIGTERM, then drains (see Server::Drain) and exits 0. Everything else lives in the
// komputed_server library.
//
// stdout carries two lines that scripts and tests read, in this order:
//   komputed listening on HOST:PORT
//   komputed metrics on HOST:PORT        (absent with --metrics_listen="")
//   komputed health on HOST:PORT         (with --health_listen only)
// Logs go to stderr. SIGHUP reads the tenants file again.
#include <grpc/grpc.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "komputed/core/malloc_tuning.h"
#include "server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve gRPC on (the komputed.v1 services, grpc.health.v1.Health and server "
          "reflection); port 0 picks a free port (printed at start); unix:PATH for a Unix socket "
          "(the file is made at start and removed at exit), unix-abstract:NAME for an abstract "
          "one");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port where clients reach this daemon directly, past any load balancer (in "
          "Kubernetes: $(POD_IP):50051 from the downward API); each session is told it, and its "
          "client opens the session's further connections (parallel transfers) there. Empty: "
          "clients keep every connection on the address they opened the session with");
ABSL_FLAG(bool, shared_memory, true,
          "offer clients on this host shared memory for their tensors' host data (sealed memfds "
          "passed over an abstract Unix socket), where the device can import host memory: their "
          "syncs then move no byte through a socket. Clients elsewhere, or in another network "
          "namespace, keep to the gRPC path");
ABSL_FLAG(std::string, listen_socket_mode, "",
          "with --listen=unix:PATH: the socket file's permission bits, in octal (e.g. 0660); "
          "empty: what the umask gives");
ABSL_FLAG(std::string, listen_socket_group, "",
          "with --listen=unix:PATH: the socket file's group, a name or a number (the daemon must "
          "be a member, or root); empty: the daemon's");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "host:port to serve Prometheus metrics on, at /metrics; port 0 picks a free port "
          "(printed at start); empty: no metrics endpoint");
ABSL_FLAG(std::string, health_listen, "",
          "host:port to serve only grpc.health.v1.Health on, in plain text, for probes that "
          "cannot speak TLS (Kubernetes' gRPC probes); port 0 picks a free port (printed at "
          "start); empty: health is served on --listen only");
ABSL_FLAG(std::vector<std::string>, devices, {},
          "comma-separated Vulkan device indices to serve (e.g. 0,2); empty: every device");
ABSL_FLAG(absl::Duration, session_idle_timeout, absl::Seconds(60),
          "close a session after this long with no call and no open Execute stream");
ABSL_FLAG(absl::Duration, sequence_release_after, absl::Seconds(10),
          "a sequence neither recorded nor submitted for this long gives its command buffer "
          "back to the driver (its memory: on some drivers hundreds of KiB), and records the same "
          "commands again at its next submission; 0: kept while the sequence lives");
ABSL_FLAG(absl::Duration, eval_timeout, absl::Seconds(600),
          "bound on an eval's wait for the device when the request gives no timeout_ms");
ABSL_FLAG(absl::Duration, eval_inline_wait, absl::Milliseconds(2),
          "a unary Eval waits this long for a short submission on the serving thread (at most "
          "2 threads per device) before handing it to the device's completion waiter; saves a "
          "thread hand-off per eval; 0 hands every submission off");
ABSL_FLAG(absl::Duration, eval_spin, absl::Microseconds(50),
          "within --eval_inline_wait: how long to poll the fence before blocking on it (a "
          "blocked thread wakes tens of microseconds late on an idle host); not done on CPU "
          "devices; 0: block at once");
ABSL_FLAG(absl::Duration, eval_hold, absl::Microseconds(100),
          "within --eval_inline_wait: how long a serving thread that waits for an eval keeps the "
          "gRPC queue before another serving thread takes it (other calls wait meanwhile); a "
          "short eval then wakes no other thread; none holds for 20ms after another client's "
          "call waited behind a hold; 0: hand it on before the wait");
ABSL_FLAG(int, grpc_threads, 4,
          "threads that serve every gRPC call, on gRPC's completion-queue API (an Eval may also "
          "wait inline on one, --eval_inline_wait); 1 to 64");
ABSL_FLAG(std::optional<absl::Duration>, eval_poll, std::nullopt,
          "an Eval serving thread that has just served a call polls for the next one this long "
          "before it sleeps (one thread at a time, its core busy meanwhile): a client's next eval "
          "finds it awake; unset: 250us where a GPU is served, never where only CPU devices are; "
          "0: never");
ABSL_FLAG(bool, submit_together, true,
          "evals of one Execute stream that are ready at once and submit sequences of one queue "
          "go to the device in one vkQueueSubmit (each still runs on what it would alone)");
ABSL_FLAG(bool, pool_tensor_memory, true,
          "small tensors' device memory comes from blocks that the sessions of one tenant share "
          "on each device, not from a Vulkan allocation each (each costs the driver host "
          "memory); tenants never share a block");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(25),
          "on SIGTERM or SIGINT: health turns NOT_SERVING, new sessions and evaluations are "
          "refused, and evaluations in flight get this long to complete before the daemon exits "
          "(keep Kubernetes' terminationGracePeriodSeconds above it)");
ABSL_FLAG(absl::Duration, device_recovery_interval, absl::Seconds(5),
          "a lost device (VK_ERROR_DEVICE_LOST) is opened again this long after the loss, and "
          "while that fails again after twice as long each time (up to 64 times this); sessions "
          "on the lost opening get UNAVAILABLE until they close; 0: a lost device stays lost "
          "until the daemon restarts");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "largest gRPC message received or sent, in bytes (at least 4096); larger tensor data "
          "moves in chunks (WriteTensor, ReadTensor)");
ABSL_FLAG(int, max_concurrent_streams, 1024,
          "calls in progress (HTTP/2 streams) on one client connection; further calls wait for "
          "a free one; 0: no limit");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Seconds(60),
          "ping a client connection that has sent nothing for this long, and close it when the "
          "ping is not answered within --keepalive_timeout (a vanished client's streams and "
          "sessions are let go); 0: no pings");
ABSL_FLAG(absl::Duration, keepalive_timeout, absl::Seconds(20),
          "how long a ping of --keepalive_time may go unanswered");
ABSL_FLAG(absl::Duration, keepalive_min_client_interval, absl::Seconds(10),
          "a client's keepalive pings while it sends no data must be at least this far apart: "
          "each ping sooner is a strike");
ABSL_FLAG(int, keepalive_max_ping_strikes, 2,
          "a client connection with more strikes is closed (GOAWAY too_many_pings); 0: no limit");
ABSL_FLAG(absl::Duration, max_connection_idle, absl::Minutes(10),
          "close a client connection without a call for this long (its client reconnects on its "
          "next call); 0: never");
ABSL_FLAG(uint64_t, grpc_memory_bytes, uint64_t{1} << 30,
          "memory gRPC may use for connection buffers and messages being received; under "
          "pressure it shrinks flow-control windows, past it streams are cancelled "
          "(RESOURCE_EXHAUSTED); at least 4 times --max_message_bytes; 0: no bound");
ABSL_FLAG(int, execute_window, 64,
          "evals of one Execute stream that may be evaluating or waiting for their event to be "
          "written; while it is full the stream's next request is not read (gRPC's flow "
          "control holds the client back); a request read carries at most 64 evals, so a "
          "stream may hold up to 63 beyond it");
ABSL_FLAG(std::string, tenants_file, "",
          "YAML file of the tenants allowed to call (name, token_sha256, certificate_names, "
          "admin, quota); read again on SIGHUP and when it changes; empty: no tenants (callers "
          "need no credentials, which only a loopback or Unix-socket --listen allows without "
          "--insecure)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve TLS with (with --tls_key); re-read when it changes");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: require client certificates signed by them (mutual TLS); a "
          "certificate's subject CN or a SAN names its tenant");
ABSL_FLAG(bool, insecure, false,
          "allow a --listen address that other hosts can reach without --tenants_file or "
          "--tls_client_ca (anyone who reaches the port can use the devices)");
ABSL_FLAG(uint64_t, default_quota_device_memory_bytes, 0,
          "tensor memory a tenant may hold on the devices, staging copies included (tenants "
          "without their own quota; 0: no limit)");
ABSL_FLAG(uint64_t, default_quota_host_memory_bytes, 0,
          "host-visible (pinned) tensor memory a tenant may hold (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_sessions, 0, "sessions a tenant may have open (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_objects_per_session, 0,
          "tensors, algorithms and sequences in one session (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_inflight_submissions, 0,
          "evaluations a tenant may have submitted and not completed (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_ops_per_sequence, 0,
          "operations recorded in one sequence (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_tensor_bytes, 0, "bytes of the largest tensor (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_dispatch_invocations, 0,
          "invocations of one dispatch: workgroups times local size (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_source_bytes, 0,
          "bytes of one algorithm's GLSL or SPIR-V (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_client_name_bytes, 0,
          "bytes of OpenSession's client_name (0: no limit)");
ABSL_FLAG(uint64_t, default_quota_kernel_time_ms, 0,
          "milliseconds one submission may run; lowers --max_kernel_time (0: that limit)");
ABSL_FLAG(int, build_threads, 2,
          "threads that compile GLSL, build pipelines and create large tensors, off the threads "
          "that serve calls");
ABSL_FLAG(absl::Duration, max_kernel_time, absl::Seconds(3),
          "a submission that runs longer is stopped by the kernel watchdog, and its session is "
          "closed (0: no watchdog); keep it under 4s on NVIDIA GPUs, whose driver ends a context "
          "that holds the GPU about 5s while other work waits, and with it the device");
ABSL_FLAG(absl::Duration, kernel_stop_grace, absl::Seconds(10),
          "a submission stopped by the kernel watchdog that has not left its device this long "
          "after: the device no longer answers; it is declared lost (its sessions' calls fail "
          "with UNAVAILABLE) and opened again for new sessions");
ABSL_FLAG(double, dispatch_share, 0.75,
          "the share of a GPU's invocation slots that one dispatch may hold at a time: a dispatch "
          "of more workgroups runs as a loop over fewer, so that a kernel that fills the GPU or "
          "never ends leaves room for other sessions' work (1: no bound; devices that report "
          "their compute units: NVIDIA, AMD)");
ABSL_FLAG(uint64_t, invocation_slots, 0,
          "the invocation slots (invocations resident at once when the GPU is full) to assume for "
          "--dispatch_share instead of what the device reports: for GPUs that report none "
          "(0: what the device reports; NVIDIA and AMD report theirs)");
ABSL_FLAG(std::string, glsl_compiler, "",
          "the komputed_glslc program that compiles clients' GLSL in a child process; empty: the "
          "one beside this program");
ABSL_FLAG(absl::Duration, glsl_compile_timeout, absl::Seconds(20),
          "a GLSL compile that runs longer is stopped (RESOURCE_EXHAUSTED)");
ABSL_FLAG(uint64_t, glsl_compile_memory_bytes, uint64_t{2} << 30,
          "address space of the GLSL compiler's child process; a compile that needs more fails "
          "(RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, log_level, "info",
          "log level: trace, debug, info, warning, error, critical or off");

int main(int argc, char** argv) {
  // Abseil's mutexes check every acquisition against a process-wide lock graph in builds without
  // NDEBUG, as Debian's is: a global lock and a hash lookup on every lock taken by the serving
  // path. The test suites keep the checks; the daemon does not pay for them.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // --help and --helpshort list the flags of this file (absl looks for komputed.cc by default).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("server/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "serves Vulkan compute devices over gRPC (the Kompute programming model).\n"
      "Usage: komputed [--flag=value]... (or --flagfile=FILE, one --flag=value a line)");
  absl::ParseCommandLine(argc, argv);

  const std::string level_name = absl::GetFlag(FLAGS_log_level);
  const spdlog::level::level_enum level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    std::fprintf(stderr, "komputed: unknown --log_level=%s\n", level_name.c_str());
    return 2;
  }
  // Logs go to stderr: stdout carries only the "listening on" line that scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("komputed"));
  spdlog::set_level(level);

  // Tensor data moves in messages of megabytes: keep their buffers' pages instead of faulting
  // fresh ones in for every message (KOMPUTED_MALLOC_TUNING=0 leaves malloc alone).
  komputed::core::TuneMallocForBulkTransfers();

  komputed::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  if (const std::string mode = absl::GetFlag(FLAGS_listen_socket_mode); !mode.empty()) {
    char* end = nullptr;
    const unsigned long bits = std::strtoul(mode.c_str(), &end, 8);
    if (*end != '\0' || mode[0] == '-' || bits == 0 || bits > 07777) {
      std::fprintf(stderr,
                   "komputed: --listen_socket_mode=%s is not a file mode in octal (e.g. 0660)\n",
                   mode.c_str());
      return 2;
    }
    options.listen_socket_mode = static_cast<uint32_t>(bits);
  }
  options.listen_socket_group = absl::GetFlag(FLAGS_listen_socket_group);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  for (const std::string& d : absl::GetFlag(FLAGS_devices)) {
    uint32_t index = 0;
    if (!absl::SimpleAtoi(d, &index)) {
      std::fprintf(stderr, "komputed: --devices: '%s' is not a device index\n", d.c_str());
      return 2;
    }
    options.devices.push_back(index);
  }
  options.session_idle_timeout = absl::GetFlag(FLAGS_session_idle_timeout);
  options.sequence_release_after = absl::GetFlag(FLAGS_sequence_release_after);
  options.eval_timeout = absl::GetFlag(FLAGS_eval_timeout);
  options.eval_inline_wait = absl::GetFlag(FLAGS_eval_inline_wait);
  options.eval_spin = absl::GetFlag(FLAGS_eval_spin);
  options.eval_hold = absl::GetFlag(FLAGS_eval_hold);
  options.grpc_threads = absl::GetFlag(FLAGS_grpc_threads);
  options.eval_poll = absl::GetFlag(FLAGS_eval_poll);
  options.submit_together = absl::GetFlag(FLAGS_submit_together);
  options.pool_tensor_memory = absl::GetFlag(FLAGS_pool_tensor_memory);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  options.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  options.keepalive_min_client_interval = absl::GetFlag(FLAGS_keepalive_min_client_interval);
  options.keepalive_max_ping_strikes = absl::GetFlag(FLAGS_keepalive_max_ping_strikes);
  options.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  options.grpc_memory_bytes = absl::GetFlag(FLAGS_grpc_memory_bytes);
  options.execute_window = absl::GetFlag(FLAGS_execute_window);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  options.device_recovery_interval = absl::GetFlag(FLAGS_device_recovery_interval);
  options.glsl_compiler = absl::GetFlag(FLAGS_glsl_compiler);
  if (options.glsl_compiler.empty())
    options.glsl_compiler = komputed::server::DefaultGlslCompiler();
  options.glsl_limits.wall_time = absl::GetFlag(FLAGS_glsl_compile_timeout);
  options.glsl_limits.memory_bytes = absl::GetFlag(FLAGS_glsl_compile_memory_bytes);
  options.tenants_file = absl::GetFlag(FLAGS_tenants_file);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  komputed::server::Quota& quota = options.default_quota;
  quota.device_memory_bytes = absl::GetFlag(FLAGS_default_quota_device_memory_bytes);
  quota.host_memory_bytes = absl::GetFlag(FLAGS_default_quota_host_memory_bytes);
  quota.sessions = absl::GetFlag(FLAGS_default_quota_sessions);
  quota.objects_per_session = absl::GetFlag(FLAGS_default_quota_objects_per_session);
  quota.inflight_submissions = absl::GetFlag(FLAGS_default_quota_inflight_submissions);
  quota.ops_per_sequence = absl::GetFlag(FLAGS_default_quota_ops_per_sequence);
  quota.tensor_bytes = absl::GetFlag(FLAGS_default_quota_tensor_bytes);
  quota.dispatch_invocations = absl::GetFlag(FLAGS_default_quota_dispatch_invocations);
  quota.source_bytes = absl::GetFlag(FLAGS_default_quota_source_bytes);
  quota.client_name_bytes = absl::GetFlag(FLAGS_default_quota_client_name_bytes);
  quota.kernel_time_ms = absl::GetFlag(FLAGS_default_quota_kernel_time_ms);
  options.max_kernel_time = absl::GetFlag(FLAGS_max_kernel_time);
  options.kernel_stop_grace = absl::GetFlag(FLAGS_kernel_stop_grace);
  options.dispatch_share = absl::GetFlag(FLAGS_dispatch_share);
  options.invocation_slots = absl::GetFlag(FLAGS_invocation_slots);
  options.build_threads = absl::GetFlag(FLAGS_build_threads);

  // A write to a reader that went away (a log piped to a program that exited) is an error for
  // the write, not the end of the daemon.
  signal(SIGPIPE, SIG_IGN);

  // Every thread started from here on inherits the blocked signals; main takes them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // One reference to gRPC's global state for the life of the process. Without it, destroying
  // the server (the last gRPC object) runs gRPC's global shutdown, which joins background
  // executor threads that may sit in a poll for many seconds after heavy traffic (measured: 9-15 s
  // after 1 GiB transfers on a 16-core host). The process exits right after the server and
  // devices are released, so those threads need no joining.
  grpc_init();

  auto server = komputed::server::Server::Start(options);
  if (!server.ok()) {
    spdlog::critical("komputed cannot start: {}", server.status().ToString());
    return 1;
  }
  std::printf("komputed listening on %s\n", (*server)->address().c_str());
  if (!(*server)->metrics_address().empty()) {
    std::printf("komputed metrics on %s\n", (*server)->metrics_address().c_str());
  }
  if (!(*server)->health_address().empty()) {
    std::printf("komputed health on %s\n", (*server)->health_address().c_str());
  }
  std::fflush(stdout);

  int signal_number = 0;
  while (sigwait(&stop_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    spdlog::info("komputed: SIGHUP received: reading the tenants file again");
    (void)(*server)->ReloadTenants();  // logs the outcome; the tenants in force stay on error
  }
  spdlog::info("komputed: {} received", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Drain(options.drain_timeout);
  server->reset();  // frees the sessions and devices before exit
  spdlog::info("komputed stopped");
  return 0;
}

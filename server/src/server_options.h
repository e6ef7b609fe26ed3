#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "glsl_compiler.h"
#include "komputed/core/vulkan_calls.h"
#include "tenants.h"

namespace komputed::server {

// Everything the daemon is configured with, in one place: main.cc fills it from its flags, and the
// Server, the DevicePool, the SessionManager and every Session read it (Server::Start checks the
// values). What is particular to one session lives in SessionFacts.
// ServerOptions::eval_poll where a GPU is served and the option is unset.
inline constexpr absl::Duration kDefaultEvalPoll = absl::Microseconds(250);

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (see Server::port()). Also unix:PATH (a
  // socket file, made at start and removed at exit) or unix-abstract:NAME.
  std::string listen = "127.0.0.1:50051";
  // For a unix:PATH listen address: the socket file's permission bits (e.g. 0660; 0 leaves what
  // the umask gave) and group (a name or a numeric id; empty leaves the daemon's).
  uint32_t listen_socket_mode = 0;
  std::string listen_socket_group;
  // host:port where clients reach this daemon directly, past any balancer (in Kubernetes, the
  // pod's IP): told to each session at OpenSession for its further connections. Empty: none.
  std::string advertise_address;
  // Offer same-host clients shared memory for their tensors' host data (an abstract Unix socket
  // that takes sealed memfds), where the device can import host memory.
  bool shared_memory = true;
  // host:port to serve Prometheus metrics on (/metrics); port 0 picks a free port. Empty: the
  // metrics are kept (Server::metrics()) but not served. (komputed's flag defaults to
  // 127.0.0.1:9464; the library's default is empty so that in-process servers do not collide.)
  std::string metrics_listen;
  // host:port serving only grpc.health.v1.Health, in plain text, for probes that cannot speak TLS
  // (Kubernetes' gRPC probes); port 0 picks a free port. Empty: health is served on `listen` only.
  std::string health_listen;
  // Physical device indices to serve, in the daemon's order; empty: every device.
  std::vector<uint32_t> devices;
  // A session with no call and no open Execute stream (or eval in flight) for this long is closed.
  absl::Duration session_idle_timeout = absl::Seconds(60);
  // A sequence neither recorded nor submitted for this long gives its command buffer back to the
  // driver (its memory), and records it again at its next submission; zero: kept while it lives.
  absl::Duration sequence_release_after = absl::Seconds(10);
  // Bound on an eval's wait for the device when the request gives none.
  absl::Duration eval_timeout = absl::Seconds(600);
  // The kernel watchdog (watchdog.h): a submission that runs longer is stopped and its session
  // closed; zero: no watchdog (shaders are then not rewritten with cancel checks).
  absl::Duration max_kernel_time = absl::Seconds(3);
  // A submission stopped by the watchdog that has not left its device this long after the stop:
  // the device is declared lost (its sessions fail with UNAVAILABLE) and opened again.
  absl::Duration kernel_stop_grace = absl::Seconds(10);
  // The share of a device's invocation slots that one dispatch may hold at a time (a dispatch of
  // more workgroups loops over fewer: core::DeviceOptions::dispatch_share), so that a kernel that
  // fills the GPU, or never ends, leaves room for other sessions' work on other queues. 1: no
  // bound. Applies to devices that report their compute units (NVIDIA, AMD).
  double dispatch_share = 0.75;
  // The invocation slots of each device to assume instead of what it reports
  // (core::DeviceOptions::invocation_slots): for devices that report none. 0: what they report.
  uint64_t invocation_slots = 0;
  // Threads that compile GLSL and build pipelines for CreateAlgorithm and RebuildAlgorithm, and
  // create large tensors for CreateTensor, off gRPC's serving threads, and how many such requests
  // may wait for them.
  int build_threads = 2;
  size_t max_queued_builds = 256;
  // How often the watchdog looks.
  absl::Duration watchdog_interval = absl::Milliseconds(100);
  // How long a unary Eval waits for its submission on the gRPC thread before handing it to the
  // device's completion waiter; zero: always hand it off.
  absl::Duration eval_inline_wait = absl::Milliseconds(2);
  // At most this many threads per device wait inline at a time.
  int eval_inline_waiters = 2;
  // Within that wait, how long to poll the fence before blocking on it (a blocked thread wakes
  // tens of microseconds late on an idle host). Not done on CPU devices, whose work needs the
  // cores.
  absl::Duration eval_spin = absl::Microseconds(50);
  // Within that wait, how long the serving thread keeps the gRPC queue (CallQueue::WillWait)
  // before it hands it to another serving thread: other calls wait for it meanwhile, and a short
  // eval costs no hand-off (a wake-up of another thread on the submission's path, and of it again
  // for the answer's completion). Zero: handed on before the wait begins.
  absl::Duration eval_hold = absl::Microseconds(100);
  // How long no serving thread keeps the queue so after one that did found other calls' events
  // waiting behind it (CallQueue::MayHold): where several clients are at work, each wait hands
  // the queue on at once.
  absl::Duration eval_hold_off = absl::Milliseconds(20);
  // Threads that serve every gRPC call (CallQueue); an Eval may also wait inline on one (above).
  int grpc_threads = 4;
  // How long an Eval serving thread that has just served a call polls for the next one before it
  // sleeps (one thread at a time): a client's next eval then finds it awake. Unset:
  // kDefaultEvalPoll where a GPU is served, and never where only CPU devices are (the polling
  // would take the cores their work needs). Zero: never.
  std::optional<absl::Duration> eval_poll;
  // Evals of one Execute stream that are ready at once and submit sequences of one queue go to
  // the device in one vkQueueSubmit (Session::EvalMany).
  bool submit_together = true;
  // Small tensors' device memory comes from blocks that the sessions of one tenant share on each
  // device (core::MemoryPool), not from an allocation each.
  bool pool_tensor_memory = true;
  // Largest message received or sent.
  int max_message_bytes = 64 << 20;
  // gRPC's limits on each client connection (Server::Start applies them to every listener).
  // Streams (calls in progress) on one connection; further calls wait for a free one. 0: gRPC's
  // default (no limit).
  int max_concurrent_streams = 1024;
  // The daemon pings a connection that has sent nothing for keepalive_time, and closes it when the
  // ping is not answered within keepalive_timeout: a client that vanished without closing its
  // connection lets go of its streams (and so its sessions) within their sum. Zero: no pings.
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // Clients' keepalive pings: a client that pings more often than this while it sends no data
  // gets a strike, and after keepalive_max_ping_strikes strikes its connection is closed
  // (GOAWAY "too_many_pings"). Pings are allowed on connections without calls too.
  absl::Duration keepalive_min_client_interval = absl::Seconds(10);
  int keepalive_max_ping_strikes = 2;
  // A connection without a call for this long is closed (GOAWAY; its client reconnects on its
  // next call). Zero: never.
  absl::Duration max_connection_idle = absl::Minutes(10);
  // The memory gRPC may use for every connection's buffers and the messages being received
  // (grpc::ResourceQuota): under pressure it shrinks flow-control windows, and over the budget it
  // cancels streams (RESOURCE_EXHAUSTED) rather than grow. 0: no bound; else at least
  // 4 * max_message_bytes.
  uint64_t grpc_memory_bytes = uint64_t{1} << 30;
  // Execute: evals of one stream that are being evaluated or whose events are not written yet,
  // at most (a request carries up to 64 evals: one read when the window had room may take it up
  // to 63 past). While the window is full the stream's next request is not read, so that a client
  // that does not read its events is held back by gRPC's flow control instead of growing the
  // daemon's memory.
  int execute_window = 64;
  // How long Drain waits for evaluations in flight.
  absl::Duration drain_timeout = absl::Seconds(25);
  // A lost device is opened again this long after the loss; while that fails, again after twice
  // as long each time (up to 64 times this); zero: it stays lost until the daemon restarts.
  absl::Duration device_recovery_interval = absl::Seconds(5);
  // Security (auth.h). The tenants file (tenants.h); empty: no tenants (one implicit tenant).
  std::string tenants_file;
  // How often the tenants file is checked for changes (it is also re-read on Reload/SIGHUP).
  absl::Duration tenants_poll_interval = absl::Seconds(2);
  // TLS: the server's certificate chain and private key (PEM files); both or neither.
  std::string tls_cert;
  std::string tls_key;
  // Mutual TLS: the CA (PEM) that client certificates must be signed by; requires tls_cert.
  std::string tls_client_ca;
  // How often the TLS files are checked for changes (certificate rotation), in seconds.
  unsigned int tls_refresh_seconds = 10;
  // Listening off loopback without tenants or client certificates is refused unless this is set.
  bool insecure = false;
  // The quotas of tenants that do not set their own (and of the implicit tenant); 0: no limit.
  Quota default_quota;
  // GLSL from clients is compiled by this program in a child process with these bounds
  // (glsl_compiler.h); empty: compiled inside the daemon (only for tests and tools that trust
  // their shaders).
  std::string glsl_compiler;
  GlslCompileLimits glsl_limits;
  // The Vulkan calls that can fail (tests inject faults); null: the real ones.
  std::shared_ptr<core::VulkanCalls> vulkan_calls;
  // core::DeviceOptions::map_device_memory (tests; no flag).
  bool map_device_memory = true;
};

}  // namespace komputed::server

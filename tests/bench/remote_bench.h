// The remote half of komputed_bench: komputed daemons on this host (each in a process of its own,
// or in this one) and kp::Managers connected to them over TCP loopback and a Unix socket, with the
// baselines a remote benchmark is judged against (a bare gRPC round trip, raw TCP throughput on
// the same loopback).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <kompute/Kompute.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "komputed/v1/komputed.grpc.pb.h"

namespace komputed_bench {

struct KpTiny;  // bench_common.h

// Benchmark names (the summary's keys).
inline constexpr char kPing[] = "ping";
// The same Ping on a bare completion-queue gRPC server of the same build.
inline constexpr char kPingBare[] = "ping/bare_async_server";
// The same Ping on a bare callback-API server of the same build.
inline constexpr char kPingBareCallback[] = "ping/bare_callback_server";
// The three in turn (komputed, bare completion queue, bare callback), each one's mean round trip a
// counter of this benchmark.
inline constexpr char kPingInterleaved[] = "ping/interleaved";
inline constexpr char kPingInterleavedKomputed[] = "komputed_us";
inline constexpr char kPingInterleavedBare[] = "bare_cq_us";
inline constexpr char kPingInterleavedCallback[] = "bare_callback_us";
inline constexpr char kTcpLoopback[] = "tcp_loopback";
// tcp_loopback, upload_256MiB/remote and download_256MiB/remote in turn, one of each per
// iteration, so that the remote transfers' ratios to the loopback share the host's load of the
// moment; each one's bytes per second a counter of this benchmark.
inline constexpr char kTransfersInterleaved[] = "transfers_256MiB/interleaved";
inline constexpr char kTransfersInterleavedTcp[] = "tcp_bytes_per_second";
inline constexpr char kTransfersInterleavedUpload[] = "upload_bytes_per_second";
inline constexpr char kTransfersInterleavedDownload[] = "download_bytes_per_second";
inline constexpr char kTinyEvalInprocess[] = "tiny_eval/inprocess";
inline constexpr char kTinyEvalRemote[] = "tiny_eval/remote";
// In-process, with kTinyEvalPacedGap between two evals (not timed): about what separates the
// submissions of the remote tiny evals, one round trip.
inline constexpr char kTinyEvalInprocessPaced[] = "tiny_eval/inprocess_paced";
inline constexpr absl::Duration kTinyEvalPacedGap = absl::Microseconds(150);
// In-process on kp's default queue family, where the daemon's sessions use another one.
inline constexpr char kTinyEvalInprocessDefaultFamily[] = "tiny_eval/inprocess_default_family";
// The same eval through the gRPC API alone, split into its stages (eval_stages.h).
inline constexpr char kTinyEvalStages[] = "tiny_eval/stages";
// The same eval on daemons that authenticate: a bearer token (tenants file) over plain text, and
// TLS without a token.
inline constexpr char kTinyEvalToken[] = "tiny_eval/remote_token";
inline constexpr char kTinyEvalTls[] = "tiny_eval/remote_tls";
inline constexpr char kAsyncInprocess[] = "async_evals/inprocess";
// The remote async evals through komputed's gRPC API alone, split into stages (eval_stages.h).
inline constexpr char kAsyncEvalStages[] = "async_evals/stages";
inline constexpr char kAsyncRemote[] = "async_evals/remote";
// The same with the Execute stream's batches turned off in the client (KOMPUTED_EXECUTE_BATCHES=0):
// one eval per request, one event per message.
inline constexpr char kAsyncRemoteUnbatched[] = "async_evals/remote_unbatched";
// The same on a daemon that submits every eval alone (--submit_together=false), where the remote
// one puts the evals of a stream that are ready at once into one vkQueueSubmit.
inline constexpr char kAsyncRemoteAlone[] = "async_evals/remote_alone";
// async_evals/remote's counter: the share of its evals that shared a vkQueueSubmit with others.
inline constexpr char kSubmittedTogether[] = "submitted_together";
// async_evals/same_host's counter: the share of its evals that the daemon took on the same-host
// channel (komputed_same_host_evals_total); the rest went over the Execute stream.
inline constexpr char kChannelShare[] = "channel_share";
// tiny_eval/same_host's counters: the share of its evals after which the daemon woke the client
// on the ring's answer number, and with a doorbell on the socket
// (komputed_same_host_ring_wakes_total); the rest found the client awake, polling.
inline constexpr char kWordWakeShare[] = "word_wakes";
inline constexpr char kSocketWakeShare[] = "socket_wakes";
// The async evals again with copy-only sequences (sync up, sync back: KpTiny without dispatch), on
// which the device spends next to no time: what remains is the path of an eval through the
// client and the daemon.
inline constexpr char kAsyncCopyInprocess[] = "async_copies/inprocess";
inline constexpr char kAsyncCopyRemote[] = "async_copies/remote";
inline constexpr char kAsyncCopySameHost[] = "async_copies/same_host";
inline constexpr char kUploadRemote[] = "upload_256MiB/remote";
inline constexpr char kDownloadRemote[] = "download_256MiB/remote";
// The same on a daemon reached over a Unix socket, the tensors' host data in shared memory.
inline constexpr char kTinyEvalSameHost[] = "tiny_eval/same_host";
// The same-host tiny eval's stages (eval_stages.h).
inline constexpr char kTinyEvalSameHostStages[] = "tiny_eval/same_host_stages";
// The tiny evals in turn (in-process, remote, same host) and komputed's Ping after them, each in a
// run of kTinyEvalInterleavedRun back to back, so that all share one stretch of the device's and
// the host's time (a GPU's clocks change under a light load; the host has other work): the means
// per eval and per ping are reported as counters (µs).
inline constexpr char kTinyEvalInterleaved[] = "tiny_eval/interleaved";
inline constexpr int kTinyEvalInterleavedRun = 16;
inline constexpr char kTinyEvalInterleavedInprocess[] = "inprocess_us";
inline constexpr char kTinyEvalInterleavedRemote[] = "remote_us";
inline constexpr char kTinyEvalInterleavedSameHost[] = "same_host_us";
inline constexpr char kTinyEvalInterleavedPing[] = "ping_us";
// Beside each lane's mean, the mean of the first eval of each of its runs, named as the lane's
// counter with "first_" in front: what a path costs when it is taken up again after the others.
inline std::string FirstOfRun(const char* counter) { return std::string("first_") + counter; }
// The remote tiny eval in turn, as tiny_eval/interleaved takes them, on the plain daemon
// (remote_us), on a daemon that checks a bearer token (token_us), on the plain daemon again with
// the token, which it does not check (token_sent_us: what sending one costs the client and the
// wire), and on a daemon that serves TLS (tls_us). Each run of evals follows one on another
// daemon: on a GPU, a run that follows one of another process (another device context) is slower
// throughout than one that follows its own.
inline constexpr char kTinyEvalSecureInterleaved[] = "tiny_eval/secure_interleaved";
inline constexpr char kTinyEvalInterleavedTokenSent[] = "token_sent_us";
inline constexpr char kTinyEvalInterleavedToken[] = "token_us";
inline constexpr char kTinyEvalInterleavedTls[] = "tls_us";
inline constexpr char kAsyncSameHost[] = "async_evals/same_host";
// The async evals in turn (in-process, remote, same host), each kAsyncInterleavedRounds rounds of
// its lanes with the pipeline full (filled before and drained after, untimed), so that all share
// one stretch of the host's and the device's time: on the GPU hosts, a run of its own at times
// goes at a quarter of its speed for a while, in-process as much as remote. The evals per second
// of each are reported as counters.
inline constexpr char kAsyncEvalsInterleaved[] = "async_evals/interleaved";
inline constexpr int kAsyncInterleavedRounds = 16;
inline constexpr char kAsyncInterleavedInprocess[] = "inprocess_per_s";
inline constexpr char kAsyncInterleavedRemote[] = "remote_per_s";
inline constexpr char kAsyncInterleavedSameHost[] = "same_host_per_s";
inline constexpr char kUploadSameHost[] = "upload_256MiB/same_host";
inline constexpr char kDownloadSameHost[] = "download_256MiB/same_host";
inline constexpr char kUploadGiBSameHost[] = "upload_1GiB/same_host";
inline constexpr char kDownloadGiBSameHost[] = "download_1GiB/same_host";

// komputed_bench run as `komputed_bench kBarePingServe=KIND` serves only Sessions.Ping on a bare
// gRPC server of KIND (kBarePingCq: the completion-queue API, one thread; kBarePingCallback: the
// callback API) on 127.0.0.1:0, prints "listening on ADDRESS" and serves until a signal ends it:
// the bare ping servers of a benchmark whose daemons run in their own processes.
inline constexpr char kBarePingServe[] = "--serve_bare_ping";
inline constexpr char kBarePingCq[] = "cq";
inline constexpr char kBarePingCallback[] = "callback";
int ServeBarePing(absl::string_view kind);

// Two programs evaluating on one device at once, as the users of a shared GPU server do: the tiny
// eval in-process while another process evaluates it in-process in a loop (each program its own
// device context, between which a GPU switches), and on the same-host daemon while another
// process evaluates it there in a loop in a session of its own (one context for both).
inline constexpr char kTinyEvalInprocessBeside[] = "tiny_eval/inprocess_beside_process";
inline constexpr char kTinyEvalSameHostBeside[] = "tiny_eval/same_host_beside_session";

// Their counter: the other program's mean eval meanwhile (µs), from its first answer to its end.
inline constexpr char kOtherEvalMicros[] = "other_us";

// komputed_bench run as `komputed_bench kTinyEvalLoop=TARGET` evaluates the tiny sequence in a
// loop: TARGET is kTinyEvalLoopInprocess:DEVICE:FAMILY (kp in this process, on that physical device
// and queue family) or a daemon's address (kp over it). It prints kTinyEvalLoopReady once its first
// eval has answered right, and evaluates until SIGTERM, then prints "kTinyEvalLoopDone EVALS
// MICROSECONDS" (the evals since the first answer and the time they took) and exits 0. It also
// stops, printing nothing, when its stdout pipe closes (the benchmark is gone; exit status 0), and
// after kTinyEvalLoopLimit without SIGTERM or on an error or a wrong result (exit status 1).
inline constexpr char kTinyEvalLoop[] = "--tiny_eval_loop";
inline constexpr char kTinyEvalLoopInprocess[] = "inprocess";
inline constexpr char kTinyEvalLoopReady[] = "evaluating";
inline constexpr char kTinyEvalLoopDone[] = "evaluated";
inline constexpr absl::Duration kTinyEvalLoopLimit = absl::Minutes(5);
int RunTinyEvalLoop(absl::string_view target, const std::vector<uint32_t>& tiny_spirv);

struct RemoteConfig {
  uint32_t physical_device = 0;            // the one device the daemon serves
  std::vector<uint32_t> tiny_spirv;        // the tiny sequence's shader
  double min_time_s = 1.5;                 // ping, tiny_eval, async_evals
  int64_t tcp_iterations = 5;              // 256 MiB each
  int64_t bulk_iterations = 3;             // remote 256 MiB transfers
  int64_t same_host_bulk_iterations = 10;  // same-host 256 MiB transfers (as the in-process ones)
  uint32_t async_depth = 16;               // evals kept in flight by async_evals
  bool gib_transfers = false;              // also 1 GiB same-host transfers (GPUs)
  // How long a same-host client polls for its answer before it blocks (kp's WaitSpin).
  absl::Duration client_spin = absl::ZeroDuration();
  // The queue families of in-process kp by default (the device's first compute family) and of
  // the daemon's sessions (DefaultSessionFamilies: compute-only ones where the device has them).
  // Where they differ, the in-process side of the remote ratios runs on a Manager of the
  // sessions' family (like against like), and tiny_eval/inprocess_default_family on kp's default.
  uint32_t kp_family = 0;
  uint32_t session_family = 0;
  // The daemons' --eval_spin and --eval_inline_wait (unset: their defaults).
  std::optional<absl::Duration> eval_spin;
  std::optional<absl::Duration> eval_inline_wait;
  // The daemons' --eval_poll and --eval_hold (unset: their defaults).
  std::optional<absl::Duration> eval_poll;
  std::optional<absl::Duration> eval_hold;
  // The daemons' --grpc_threads (unset: their default).
  std::optional<int> grpc_threads;
  // A daemon started by hand (host:port), serving the same device, that the TCP benchmarks (ping,
  // tiny_eval/remote and its stages, the remote async evals) reach instead of the benchmark's own
  // (another build's, say). Empty: the benchmark's own.
  std::string daemon_address;
  // Where the daemons and the bare ping servers run: false (the default), each in a process of
  // its own, as they are deployed (komputed: the komputed binary, KOMPUTED_BINARY or the build's;
  // the bare servers: this program, ServeBarePing); true, in this process beside the client, where
  // all share one set of gRPC pollers (gRPC 1.51 polls every completion queue of a process from one
  // epoll set) and one profile shows both sides.
  bool daemons_in_process = false;
  // The daemons' --max_kernel_time (zero: no watchdog) and --dispatch_share.
  std::optional<absl::Duration> max_kernel_time;
  std::optional<double> dispatch_share;
};

// Owns the daemons, the remote Managers and the objects of the remote and the in-process
// latency benchmarks. Client and daemons share this host: both sides' CPU work runs on the same
// cores, and the bytes cross the kernel's TCP loopback or a Unix socket.
class RemoteBench {
 public:
  // Starts the daemons (on 127.0.0.1:0 and a Unix socket) serving `config.physical_device` and
  // connects a kp::Manager to each. `inprocess` (the in-process Manager of the other benchmarks, on
  // the same device) must outlive this object.
  static absl::StatusOr<std::unique_ptr<RemoteBench>> Start(RemoteConfig config,
                                                            kp::Manager* inprocess);
  // Remote objects first, then the remote Manager (closing its session), then the daemon.
  ~RemoteBench();
  RemoteBench(const RemoteBench&) = delete;
  RemoteBench& operator=(const RemoteBench&) = delete;

  // The address of the daemon that the TCP benchmarks reach, and where it and the others run
  // ("in this process", "in a process of its own", "of another process").
  const std::string& address() const;
  const char* tcp_daemon_where() const;
  const char* daemons_where() const;
  // The same-host daemon's address, and how many tensors it has made over shared memory.
  std::string same_host_address() const;
  // Nothing where its metrics did not answer.
  std::optional<uint64_t> same_host_shared_tensors() const;
  // How many same-host eval channels passed a ring (komputed_same_host_rings_total).
  std::optional<uint64_t> same_host_rings() const;

  // ping, tcp_loopback, tiny_eval/{inprocess,remote,remote_token,remote_tls,same_host},
  // async_evals/{inprocess,remote,same_host}.
  void RegisterLatencyBenchmarks();
  // upload_256MiB/{remote,same_host}, download_256MiB/{remote,same_host} (each registered where
  // the caller wants it); RegisterDownload also registers transfers_256MiB/interleaved.
  void RegisterUpload();
  void RegisterDownload();
  // upload_1GiB/same_host and download_1GiB/same_host, where config.gib_transfers asks for them.
  bool gib_transfers() const;
  void RegisterGiBTransfers();

 private:
  struct State;
  explicit RemoteBench(std::unique_ptr<State> state);
  static void Ping(benchmark::State& state, komputed::v1::Sessions::Stub& stub);
  static void PingInterleaved(benchmark::State& state,
                              komputed::v1::Sessions::Stub* const stubs[3]);
  // A lane of TinyEvalInterleaved: its evals' mean goes into the counter named `counter`.
  struct TinyLane {
    const char* counter;
    KpTiny* tiny;
  };
  static void TinyEvalInterleaved(benchmark::State& state, std::vector<TinyLane> lanes,
                                  komputed::v1::Sessions::Stub* ping);
  // A lane of AsyncEvalsInterleaved: its evals per second go into the counter named `counter`.
  struct AsyncLane {
    const char* counter;
    std::vector<KpTiny>* lanes;
  };
  static void AsyncEvalsInterleaved(benchmark::State& state, std::vector<AsyncLane> lanes);
  static void TcpLoopback(benchmark::State& state);
  static void TransfersInterleaved(benchmark::State& state, kp::Manager& remote);
  std::unique_ptr<State> s_;
};

}  // namespace komputed_bench

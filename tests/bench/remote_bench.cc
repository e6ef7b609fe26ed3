#include "remote_bench.h"

#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench_common.h"
#include "eval_stages.h"
#include "komputed/core/status.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "server.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/process.h"
#include "support/scoped_env.h"
#include "support/test_certs.h"
#include "tenants.h"

namespace komputed_bench {
namespace {

namespace v1 = komputed::v1;

// The raw TCP benchmark's write (and read) size.
constexpr uint64_t kTcpWriteBytes = uint64_t{1} << 20;

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// The steady clock's time since construction: what one lane's turn took in the rows that take
// their lanes in turn.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double Micros() const { return Seconds() * 1e6; }

 private:
  const std::chrono::steady_clock::time_point start_;
};

// A socket fd closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

bool WriteAll(int fd, const char* p, uint64_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, std::min(n, kTcpWriteBytes));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on EOF or error.
bool ReadAll(int fd, char* p, uint64_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, std::min(n, kTcpWriteBytes));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

// A connected pair of TCP sockets over 127.0.0.1 (the receiver's end accepted).
absl::Status LoopbackPair(Fd* sender, Fd* receiver) {
  Fd listener(socket(AF_INET, SOCK_STREAM, 0));
  if (listener.get() < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind 127.0.0.1:0");
  }
  if (listen(listener.get(), 1) != 0) return Errno("listen");
  socklen_t len = sizeof(addr);
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  *sender = Fd(socket(AF_INET, SOCK_STREAM, 0));
  if (sender->get() < 0) return Errno("socket");
  if (connect(sender->get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect");
  }
  *receiver = Fd(accept(listener.get(), nullptr, nullptr));
  if (receiver->get() < 0) return Errno("accept");
  const int one = 1;
  setsockopt(receiver->get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // the ack byte
  return absl::OkStatus();
}

// The floor that komputed's Ping is judged against: a gRPC server of the same build that serves
// only Sessions.Ping, on the completion-queue (async) API with one thread, answering at once.
class BarePingServer {
 public:
  static absl::StatusOr<std::unique_ptr<BarePingServer>> Start() {
    auto s = std::unique_ptr<BarePingServer>(new BarePingServer());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&s->service_);
    s->cq_ = builder.AddCompletionQueue();
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr || port == 0) {
      return absl::UnavailableError("the bare ping server did not start");
    }
    s->address_ = absl::StrCat("127.0.0.1:", port);
    s->thread_ = std::thread([p = s.get()] { p->Run(); });
    return s;
  }
  ~BarePingServer() {
    server_->Shutdown();
    cq_->Shutdown();
    thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  struct Call {
    explicit Call(BarePingServer* s) : writer(&context) {
      s->service_.RequestPing(&context, &request, &writer, s->cq_.get(), s->cq_.get(), this);
    }
    grpc::ServerContext context;
    v1::PingRequest request;
    grpc::ServerAsyncResponseWriter<v1::PingResponse> writer;
    bool answered = false;
  };
  BarePingServer() = default;
  void Run() {
    new Call(this);
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) {
      auto* call = static_cast<Call*>(tag);
      if (!ok || call->answered) {
        delete call;
        continue;
      }
      new Call(this);  // the next one
      call->answered = true;
      v1::PingResponse response;
      response.set_payload(call->request.payload());
      call->writer.Finish(response, grpc::Status::OK, call);
    }
  }

  v1::Sessions::AsyncService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::thread thread_;
};

// The same Ping on the callback API, answered inside the handler: what a callback service of
// this build costs against the completion-queue one.
class BareCallbackPingServer final : public v1::Sessions::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<BareCallbackPingServer>> Start() {
    auto s = std::unique_ptr<BareCallbackPingServer>(new BareCallbackPingServer());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(s.get());
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr || port == 0) {
      return absl::UnavailableError("the bare callback ping server did not start");
    }
    s->address_ = absl::StrCat("127.0.0.1:", port);
    return s;
  }
  ~BareCallbackPingServer() override { server_->Shutdown(); }
  const std::string& address() const { return address_; }

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const v1::PingRequest* request,
                                 v1::PingResponse* response) override {
    response->set_payload(request->payload());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  BareCallbackPingServer() = default;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// How one of the benchmark's daemons differs from the others.
struct DaemonSpec {
  std::string listen = "127.0.0.1:0";
  bool shared_memory = false;  // every byte through gRPC: the remote path's figures
  bool submit_together = true;
  std::string tenants_file;
  std::string tls_cert;
  std::string tls_key;
};

// One of the benchmark's daemons: the komputed binary in a process of its own, as it is deployed
// (by default), or a Server in this process, beside the client (RemoteConfig::daemons_in_process).
class BenchDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<BenchDaemon>> Start(const RemoteConfig& c,
                                                            const DaemonSpec& spec) {
    auto d = std::unique_ptr<BenchDaemon>(new BenchDaemon());
    if (c.daemons_in_process) {
      komputed::server::ServerOptions o;
      o.listen = spec.listen;
      o.devices = {c.physical_device};
      o.shared_memory = spec.shared_memory;
      o.submit_together = spec.submit_together;
      o.tenants_file = spec.tenants_file;
      o.tls_cert = spec.tls_cert;
      o.tls_key = spec.tls_key;
      if (c.eval_spin.has_value()) o.eval_spin = *c.eval_spin;
      if (c.eval_poll.has_value()) o.eval_poll = c.eval_poll;
      if (c.eval_hold.has_value()) o.eval_hold = *c.eval_hold;
      if (c.grpc_threads.has_value()) o.grpc_threads = *c.grpc_threads;
      if (c.max_kernel_time.has_value()) o.max_kernel_time = *c.max_kernel_time;
      if (c.dispatch_share.has_value()) o.dispatch_share = *c.dispatch_share;
      if (c.eval_inline_wait.has_value()) o.eval_inline_wait = *c.eval_inline_wait;
      auto server = komputed::server::Server::Start(std::move(o));
      if (!server.ok()) return server.status();
      d->server_ = *std::move(server);
      d->address_ = d->server_->address();
      return d;
    }
    std::vector<std::string> flags = {
        "--listen=" + spec.listen, absl::StrCat("--devices=", c.physical_device),
        absl::StrCat("--shared_memory=", spec.shared_memory ? "true" : "false"),
        absl::StrCat("--submit_together=", spec.submit_together ? "true" : "false"),
        "--log_level=warn"};
    if (!spec.tenants_file.empty()) flags.push_back("--tenants_file=" + spec.tenants_file);
    if (!spec.tls_cert.empty()) flags.push_back("--tls_cert=" + spec.tls_cert);
    if (!spec.tls_key.empty()) flags.push_back("--tls_key=" + spec.tls_key);
    auto duration = [&flags](const char* flag, const std::optional<absl::Duration>& d) {
      if (d.has_value()) flags.push_back(absl::StrCat("--", flag, "=", absl::FormatDuration(*d)));
    };
    duration("eval_spin", c.eval_spin);
    duration("eval_poll", c.eval_poll);
    duration("eval_hold", c.eval_hold);
    duration("max_kernel_time", c.max_kernel_time);
    duration("eval_inline_wait", c.eval_inline_wait);
    if (c.grpc_threads.has_value())
      flags.push_back(absl::StrCat("--grpc_threads=", *c.grpc_threads));
    if (c.dispatch_share.has_value()) {
      flags.push_back(absl::StrCat("--dispatch_share=", *c.dispatch_share));
    }
    d->process_ = std::make_unique<komputed::test_support::DaemonProcess>(flags);
    if (!d->process_->started()) {
      return absl::UnavailableError(absl::StrCat(
          komputed::test_support::KomputedBinary(),
          " did not start (KOMPUTED_BINARY names another); its log:\n", d->process_->Log()));
    }
    d->address_ = d->process_->address();
    d->metrics_address_ = d->process_->metrics_address();
    CountUsageOf(d->process_->pid());  // its CPU is the remote rows' as much as the client's
    return d;
  }

  // A graceful stop, bounded; a process still running after it is killed by DaemonProcess.
  ~BenchDaemon() {
    if (server_ != nullptr) server_->Shutdown();
    if (process_ == nullptr) return;
    StopCountingUsageOf(process_->pid());
    process_->Stop(SIGTERM, absl::Seconds(30));
  }
  BenchDaemon(const BenchDaemon&) = delete;
  BenchDaemon& operator=(const BenchDaemon&) = delete;

  const std::string& address() const { return address_; }
  // Counters of the daemon's metrics; nothing where its metrics endpoint does not answer.
  std::optional<double> SharedMemoryTensors() const {
    if (server_ != nullptr) return server_->metrics().shared_memory_tensors_total().Value();
    return Scraped("komputed_shared_memory_tensors_total");
  }
  std::optional<double> SameHostRings() const {
    if (server_ != nullptr) return server_->metrics().same_host_rings_total().Value();
    return Scraped("komputed_same_host_rings_total");
  }
  std::optional<double> SameHostEvals() const {
    if (server_ != nullptr) return server_->metrics().same_host_evals_total().Value();
    return Scraped("komputed_same_host_evals_total");
  }
  std::optional<double> SameHostRingWakes(const std::string& way) const {
    if (server_ != nullptr) return server_->metrics().same_host_ring_wakes_total(way).Value();
    return Scraped("komputed_same_host_ring_wakes_total", {{"way", way}});
  }
  std::optional<double> SubmittedTogether() const {
    if (server_ != nullptr) return server_->metrics().submitted_together_total().Value();
    return Scraped("komputed_submitted_together_total");
  }

 private:
  BenchDaemon() = default;
  std::optional<double> Scraped(const std::string& name,
                                const std::map<std::string, std::string>& labels = {}) const {
    const std::string text = komputed::test_support::ScrapeMetrics(metrics_address_);
    if (text.empty()) return std::nullopt;
    return komputed::test_support::Samples(text).Get(name, labels);  // 0 while it never moved
  }
  std::unique_ptr<komputed::server::Server> server_;
  std::unique_ptr<komputed::test_support::DaemonProcess> process_;
  std::string address_;
  std::string metrics_address_;  // of a process
};

// This program run again in a child process with one argument, its stdout on a pipe: the
// helpers a benchmark starts beside itself. Stopped (SIGTERM, then SIGKILL) and reaped on
// destruction at the latest.
class ChildProgram {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProgram>> Start(const std::string& argument) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return Errno("readlink /proc/self/exe");
    auto c = std::unique_ptr<ChildProgram>(new ChildProgram());
    c->pid_ = komputed::test_support::Spawn({std::string(self, static_cast<size_t>(n)), argument},
                                            &c->stdout_fd_);
    if (c->pid_ < 0) return Errno(absl::StrCat("starting this program with ", argument).c_str());
    return c;
  }
  ~ChildProgram() {
    if (pid_ > 0) {
      Signal(SIGTERM);
      Reap(absl::Seconds(10));
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }
  ChildProgram(const ChildProgram&) = delete;
  ChildProgram& operator=(const ChildProgram&) = delete;

  // One line of its stdout (without its '\n'): what came by `deadline`, "" at the pipe's end.
  std::string ReadLine(absl::Time deadline) {
    return komputed::test_support::ReadLine(stdout_fd_, deadline);
  }
  // Lines of its stdout until one that `wanted` takes, skipping the others (a log line): that
  // line, or the last one read where none came by the pipe's end or `deadline`.
  std::string ReadLineWhere(const std::function<bool(absl::string_view)>& wanted,
                            absl::Time deadline) {
    std::string line;
    do {
      line = ReadLine(deadline);
    } while (!wanted(line) && !line.empty() && absl::Now() < deadline);
    return line;
  }
  void Signal(int signal) {
    if (pid_ > 0) kill(pid_, signal);
  }
  // Waits up to `timeout` for its exit, then kills it (SIGKILL, up to 10 s more): its wait
  // status, or -1 where it had not exited within `timeout`. Once only.
  int Reap(absl::Duration timeout) {
    const int status = komputed::test_support::WaitExit(pid_, timeout);
    if (status == -1) {
      kill(pid_, SIGKILL);
      komputed::test_support::WaitExit(pid_, absl::Seconds(10));
    }
    pid_ = -1;
    return status;
  }

 private:
  ChildProgram() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
};

// A bare ping server (kBarePingServe's kinds) in a child process of this program, as komputed
// runs in one: started with `/proc/self/exe kBarePingServe=KIND`, it prints its address and
// serves until it gets SIGTERM.
class BarePingProcess {
 public:
  static absl::StatusOr<std::unique_ptr<BarePingProcess>> Start(const char* kind) {
    auto p = std::unique_ptr<BarePingProcess>(new BarePingProcess());
    absl::StatusOr<std::unique_ptr<ChildProgram>> child =
        ChildProgram::Start(absl::StrCat(kBarePingServe, "=", kind));
    if (!child.ok()) {
      return absl::Status(child.status().code(),
                          absl::StrCat("the bare ping server: ", child.status().message()));
    }
    p->child_ = *std::move(child);
    const std::string line = p->child_->ReadLine(absl::Now() + absl::Seconds(30));
    constexpr absl::string_view kListening = "listening on ";
    if (!absl::StartsWith(line, kListening)) {
      return absl::UnavailableError(
          absl::StrCat("the bare ", kind, " ping server did not start: '", line, "'"));
    }
    p->address_ = line.substr(kListening.size());
    return p;
  }
  const std::string& address() const { return address_; }

 private:
  BarePingProcess() = default;
  std::unique_ptr<ChildProgram> child_;
  std::string address_;
};

// Another program evaluating the tiny sequence in a loop (kTinyEvalLoop): this program run again
// in a child process, evaluating from the moment Start returns until Stop.
class TinyEvalLoopProcess {
 public:
  static absl::StatusOr<std::unique_ptr<TinyEvalLoopProcess>> Start(const std::string& target) {
    auto p = std::unique_ptr<TinyEvalLoopProcess>(new TinyEvalLoopProcess());
    KD_ASSIGN_OR_RETURN(p->child_, ChildProgram::Start(absl::StrCat(kTinyEvalLoop, "=", target)));
    const std::string line =
        p->child_->ReadLineWhere([](absl::string_view l) { return l == kTinyEvalLoopReady; },
                                 absl::Now() + absl::Seconds(60));
    if (line != kTinyEvalLoopReady) {
      return absl::UnavailableError(absl::StrCat("the other program's eval loop on ", target,
                                                 " did not start (its stderr says why)"));
    }
    return p;
  }
  // Ends the loop (SIGTERM) and returns the mean time of its evals from its first answer to the
  // end; an error where one of them failed or answered wrong. Once only.
  absl::StatusOr<absl::Duration> Stop() {
    if (child_ == nullptr)
      return absl::FailedPreconditionError("the other program's loop has stopped");
    child_->Signal(SIGTERM);
    // Its last line counts its evals.
    const std::string line = child_->ReadLineWhere(
        [](absl::string_view l) { return absl::StartsWith(l, kTinyEvalLoopDone); },
        absl::Now() + absl::Seconds(30));
    const int status = child_->Reap(absl::Seconds(30));
    child_.reset();
    if (status == -1) return absl::DeadlineExceededError("the other program's eval loop hung");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError("the other program's eval loop failed (its stderr says why)");
    }
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    uint64_t evals = 0;
    double micros = 0;
    if (parts.size() != 3 || parts[0] != kTinyEvalLoopDone || !absl::SimpleAtoi(parts[1], &evals) ||
        !absl::SimpleAtod(parts[2], &micros) || evals == 0) {
      return absl::InternalError(
          absl::StrCat("the other program's eval loop ended with '", line, "'"));
    }
    return absl::Microseconds(micros / static_cast<double>(evals));
  }

 private:
  TinyEvalLoopProcess() = default;
  std::unique_ptr<ChildProgram> child_;  // null once stopped
};

// RunKpTiny while another program evaluates the tiny sequence in a loop on `target`
// (kTinyEvalLoop's).
void RunKpTinyBeside(benchmark::State& state, KpTiny& tiny, const char* what,
                     const std::string& target) {
  absl::StatusOr<std::unique_ptr<TinyEvalLoopProcess>> other = TinyEvalLoopProcess::Start(target);
  if (!other.ok()) {
    state.SkipWithError(absl::StrCat(what, ": ", other.status().message()).c_str());
    for (auto _ : state) {
    }
    return;
  }
  RunKpTiny(state, tiny, what);
  const absl::StatusOr<absl::Duration> other_eval = (*other)->Stop();
  if (!other_eval.ok()) {
    state.SkipWithError(absl::StrCat(what, ": ", other_eval.status().message()).c_str());
    return;
  }
  state.counters[kOtherEvalMicros] = absl::ToDoubleMicroseconds(*other_eval);
}

// A bare ping server of a kind (kBarePingCq or kBarePingCallback) in this process.
struct BareServer {
  std::unique_ptr<BarePingServer> cq;
  std::unique_ptr<BareCallbackPingServer> callback;
  std::string address;
};

absl::StatusOr<BareServer> StartBareServer(absl::string_view kind) {
  BareServer server;
  if (kind == kBarePingCq) {
    KD_ASSIGN_OR_RETURN(server.cq, BarePingServer::Start());
    server.address = server.cq->address();
  } else if (kind == kBarePingCallback) {
    KD_ASSIGN_OR_RETURN(server.callback, BareCallbackPingServer::Start());
    server.address = server.callback->address();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("no bare ping server of kind '", kind, "' (",
                                                   kBarePingCq, " or ", kBarePingCallback, ")"));
  }
  return server;
}

// A bare ping server and a client of it. The server runs in a child process where the daemons
// run in theirs, else in this process.
struct BarePeer {
  BareServer in_process;
  std::unique_ptr<BarePingProcess> process;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Sessions::Stub> stub;
};

absl::StatusOr<std::unique_ptr<BarePeer>> StartBarePeer(absl::string_view kind, bool in_process) {
  auto peer = std::make_unique<BarePeer>();
  std::string address;
  if (!in_process) {
    absl::StatusOr<std::unique_ptr<BarePingProcess>> process =
        BarePingProcess::Start(std::string(kind).c_str());
    if (!process.ok()) return process.status();
    peer->process = *std::move(process);
    address = peer->process->address();
  } else {
    KD_ASSIGN_OR_RETURN(peer->in_process, StartBareServer(kind));
    address = peer->in_process.address;
  }
  peer->channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  peer->stub = v1::Sessions::NewStub(peer->channel);
  grpc::ClientContext context;  // connects before the timing starts
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PingRequest request;
  v1::PingResponse response;
  const grpc::Status st = peer->stub->Ping(&context, request, &response);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("ping of the bare ", kind, " server: ", st.error_message()));
  }
  return peer;
}

}  // namespace

struct RemoteBench::State {
  RemoteConfig config;
  kp::Manager* inprocess = nullptr;  // on the sessions' queue family
  // Where kp's default family is not the sessions': the Manager on theirs, and the given one's
  // tiny sequence.
  std::unique_ptr<kp::Manager> session_family_inprocess;
  kp::Manager* default_family_inprocess = nullptr;
  KpTiny tiny_default_family;
  std::unique_ptr<BenchDaemon> server;
  std::string address;
  std::shared_ptr<grpc::Channel> ping_channel;
  std::unique_ptr<v1::Sessions::Stub> ping_stub;
  std::unique_ptr<BarePeer> bare;  // the completion-queue one
  // The callback one where the bare servers run in processes of their own (BareCallback).
  std::unique_ptr<BarePeer> bare_callback;

  // The bare callback server's client: the one kept from the start where the servers run in
  // processes of their own; in this process, one started for the benchmark that pings it (`held`
  // keeps it meanwhile), whose threads would otherwise do the reading for every other gRPC call of
  // the process and slow those down too.
  absl::StatusOr<BarePeer*> BareCallback(std::unique_ptr<BarePeer>& held) {
    if (bare_callback != nullptr) return bare_callback.get();
    absl::StatusOr<std::unique_ptr<BarePeer>> peer =
        StartBarePeer(kBarePingCallback, /*in_process=*/true);
    if (!peer.ok()) return peer.status();
    held = *std::move(peer);
    return held.get();
  }
  std::unique_ptr<kp::Manager> remote;
  // The daemons that authenticate, and their clients.
  komputed::test_support::TestCertificates certs;
  std::unique_ptr<BenchDaemon> token_server;
  std::unique_ptr<BenchDaemon> tls_server;
  std::unique_ptr<kp::Manager> token_remote;
  std::unique_ptr<kp::Manager> tls_remote;
  // The plain daemon's client that sends the token all the same (the daemon does not check it).
  std::unique_ptr<kp::Manager> token_sent_remote;
  KpTiny tiny_token_sent;
  KpTiny tiny_token;
  KpTiny tiny_tls;
  KpTiny tiny_inprocess;
  KpTiny tiny_remote;
  std::vector<KpTiny> async_inprocess;
  std::vector<KpTiny> async_remote;
  std::unique_ptr<kp::Manager> remote_unbatched;  // KOMPUTED_EXECUTE_BATCHES=0 as it opened
  std::vector<KpTiny> async_remote_unbatched;
  // The daemon that submits each eval alone (--submit_together=false), and its client.
  std::unique_ptr<BenchDaemon> alone_server;
  std::unique_ptr<kp::Manager> remote_alone;
  std::vector<KpTiny> async_remote_alone;
  // The same-host daemon (a Unix socket, shared memory) and its client.
  std::unique_ptr<BenchDaemon> same_host_server;
  std::unique_ptr<kp::Manager> same_host;
  KpTiny tiny_same_host;
  std::vector<KpTiny> async_same_host;
  // Copy-only lanes (kAsyncCopy*).
  std::vector<KpTiny> copies_inprocess;
  std::vector<KpTiny> copies_remote;
  std::vector<KpTiny> copies_same_host;
};

RemoteBench::RemoteBench(std::unique_ptr<State> state) : s_(std::move(state)) {}

RemoteBench::~RemoteBench() {
  if (s_ == nullptr) return;
  s_->copies_remote.clear();
  s_->copies_same_host.clear();
  s_->async_remote.clear();
  s_->async_remote_unbatched.clear();
  s_->remote_unbatched.reset();
  s_->async_remote_alone.clear();
  s_->remote_alone.reset();
  s_->alone_server.reset();
  s_->async_same_host.clear();
  s_->tiny_same_host = KpTiny{};
  s_->same_host.reset();
  s_->same_host_server.reset();
  s_->tiny_remote = KpTiny{};
  s_->tiny_token = KpTiny{};
  s_->tiny_tls = KpTiny{};
  s_->tiny_token_sent = KpTiny{};
  s_->token_sent_remote.reset();
  s_->remote.reset();  // closes the session
  s_->token_remote.reset();
  s_->tls_remote.reset();
  s_->token_server.reset();
  s_->tls_server.reset();
  s_->async_inprocess.clear();
  s_->copies_inprocess.clear();
  s_->tiny_inprocess = KpTiny{};
  s_->tiny_default_family = KpTiny{};
  s_->ping_stub.reset();
  s_->ping_channel.reset();
  s_->bare.reset();
  s_->bare_callback.reset();
  s_->server.reset();
}

const std::string& RemoteBench::address() const { return s_->address; }
const char* RemoteBench::daemons_where() const {
  if (s_->config.daemons_in_process) return "in this process";
  return "in a process of its own";
}
const char* RemoteBench::tcp_daemon_where() const {
  return s_->config.daemon_address.empty() ? daemons_where() : "of another process";
}
std::string RemoteBench::same_host_address() const { return s_->same_host_server->address(); }
std::optional<uint64_t> RemoteBench::same_host_shared_tensors() const {
  const std::optional<double> n = s_->same_host_server->SharedMemoryTensors();
  if (!n.has_value()) return std::nullopt;
  return static_cast<uint64_t>(*n);
}

std::optional<uint64_t> RemoteBench::same_host_rings() const {
  const std::optional<double> n = s_->same_host_server->SameHostRings();
  if (!n.has_value()) return std::nullopt;
  return static_cast<uint64_t>(*n);
}

absl::StatusOr<std::unique_ptr<RemoteBench>> RemoteBench::Start(RemoteConfig config,
                                                                kp::Manager* inprocess) {
  auto s = std::make_unique<State>();
  s->config = std::move(config);
  s->inprocess = inprocess;
  if (s->config.async_depth == 0) s->config.async_depth = 1;
  if (s->config.session_family != s->config.kp_family) {
    try {
      s->session_family_inprocess = std::make_unique<kp::Manager>(
          s->config.physical_device, std::vector<uint32_t>{s->config.session_family});
    } catch (const kp::Error& e) {
      return absl::InternalError(absl::StrCat("an in-process Manager on queue family ",
                                              s->config.session_family, ": ", e.what()));
    }
    s->default_family_inprocess = inprocess;
    s->inprocess = s->session_family_inprocess.get();
  }

  // The daemons: komputed processes (or Servers in this process) serving the same device. The
  // ones in this process would interleave their log lines with the results: warnings only.
  spdlog::set_level(spdlog::level::warn);
  const RemoteConfig& c = s->config;
  if (c.daemon_address.empty()) {
    KD_ASSIGN_OR_RETURN(s->server, BenchDaemon::Start(c, DaemonSpec{}));
    s->address = s->server->address();
  } else {
    s->address = c.daemon_address;
  }

  // A daemon with one tenant (its token's hash in a tenants file), and one that serves TLS.
  if (!s->certs.ok()) return s->certs.status();
  constexpr char kToken[] = "bench-token";
  const std::string tenants = s->certs.dir() + "/tenants.yaml";
  std::ofstream(tenants) << "tenants:\n  - name: bench\n    token_sha256: "
                         << komputed::server::HexDigest(komputed::server::Sha256(kToken)) << "\n";
  DaemonSpec token_spec;
  token_spec.tenants_file = tenants;
  KD_ASSIGN_OR_RETURN(s->token_server, BenchDaemon::Start(c, token_spec));
  DaemonSpec tls_spec;
  tls_spec.tls_cert = s->certs.server_cert();
  tls_spec.tls_key = s->certs.server_key();
  KD_ASSIGN_OR_RETURN(s->tls_server, BenchDaemon::Start(c, tls_spec));
  DaemonSpec alone_spec;
  alone_spec.submit_together = false;
  KD_ASSIGN_OR_RETURN(s->alone_server, BenchDaemon::Start(c, alone_spec));
  DaemonSpec same_host_spec;
  same_host_spec.listen = "unix:" + s->certs.dir() + "/komputed.sock";
  same_host_spec.shared_memory = true;
  KD_ASSIGN_OR_RETURN(s->same_host_server, BenchDaemon::Start(c, same_host_spec));

  s->ping_channel = grpc::CreateChannel(s->address, grpc::InsecureChannelCredentials());
  s->ping_stub = v1::Sessions::NewStub(s->ping_channel);
  KD_ASSIGN_OR_RETURN(s->bare, StartBarePeer(kBarePingCq, c.daemons_in_process));
  if (!c.daemons_in_process) {
    KD_ASSIGN_OR_RETURN(s->bare_callback, StartBarePeer(kBarePingCallback, /*in_process=*/false));
  }
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PingRequest request;
    v1::PingResponse response;
    grpc::Status st = s->ping_stub->Ping(&context, request, &response);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("ping of the daemon at ", s->address, ": ", st.error_message()));
    }
  }

  try {
    s->remote = std::make_unique<kp::Manager>(s->address);
    const std::string local_name = inprocess->getDeviceProperties().deviceName.data();
    const std::string remote_name = s->remote->getDeviceProperties().deviceName.data();
    if (local_name != remote_name) {
      return absl::InternalError(absl::StrCat("the daemon serves \"", remote_name,
                                              "\", the in-process Manager runs on \"", local_name,
                                              "\""));
    }
    s->tiny_inprocess = MakeKpTiny(*s->inprocess, s->config.tiny_spirv);
    if (s->default_family_inprocess != nullptr) {
      s->tiny_default_family = MakeKpTiny(*s->default_family_inprocess, s->config.tiny_spirv);
    }
    s->tiny_remote = MakeKpTiny(*s->remote, s->config.tiny_spirv);
    kp::Remote token_remote;
    token_remote.address = s->token_server->address();
    token_remote.token = kToken;
    s->token_remote = std::make_unique<kp::Manager>(token_remote);
    s->tiny_token = MakeKpTiny(*s->token_remote, s->config.tiny_spirv);
    token_remote.address = s->address;
    s->token_sent_remote = std::make_unique<kp::Manager>(token_remote);
    s->tiny_token_sent = MakeKpTiny(*s->token_sent_remote, s->config.tiny_spirv);
    s->tiny_token_sent.sequence->eval();
    kp::Remote tls_remote;
    tls_remote.address = s->tls_server->address();
    tls_remote.tlsCa = s->certs.ca();
    s->tls_remote = std::make_unique<kp::Manager>(tls_remote);
    s->tiny_tls = MakeKpTiny(*s->tls_remote, s->config.tiny_spirv);
    s->tiny_token.sequence->eval();
    s->tiny_tls.sequence->eval();
    s->same_host = std::make_unique<kp::Manager>(s->same_host_server->address());
    s->tiny_same_host = MakeKpTiny(*s->same_host, s->config.tiny_spirv);
    s->tiny_same_host.sequence->eval();
    {
      // The client reads the setting as its session opens.
      const komputed::test_support::ScopedEnv unbatched("KOMPUTED_EXECUTE_BATCHES", "0");
      s->remote_unbatched = std::make_unique<kp::Manager>(s->address);
    }
    s->remote_alone = std::make_unique<kp::Manager>(s->alone_server->address());
    for (uint32_t i = 0; i < s->config.async_depth; ++i) {
      s->async_inprocess.push_back(MakeKpTiny(*s->inprocess, s->config.tiny_spirv));
      s->async_remote.push_back(MakeKpTiny(*s->remote, s->config.tiny_spirv));
      s->async_remote_unbatched.push_back(MakeKpTiny(*s->remote_unbatched, s->config.tiny_spirv));
      s->async_remote_alone.push_back(MakeKpTiny(*s->remote_alone, s->config.tiny_spirv));
      s->async_same_host.push_back(MakeKpTiny(*s->same_host, s->config.tiny_spirv));
      s->copies_inprocess.push_back(MakeKpTiny(*s->inprocess, {}, /*dispatch=*/false));
      s->copies_remote.push_back(MakeKpTiny(*s->remote, {}, /*dispatch=*/false));
      s->copies_same_host.push_back(MakeKpTiny(*s->same_host, {}, /*dispatch=*/false));
    }
    for (KpTiny& t : s->async_same_host) t.sequence->eval();
    for (KpTiny& t : s->copies_same_host) t.sequence->eval();
    for (KpTiny& t : s->copies_remote) t.sequence->eval();
    // Warm up: every remote sequence sent once (its recording travels with its first eval).
    s->tiny_remote.sequence->eval();
    for (KpTiny& t : s->async_remote) t.sequence->eval();
    for (KpTiny& t : s->async_remote_unbatched) t.sequence->eval();
    for (KpTiny& t : s->async_remote_alone) t.sequence->eval();
  } catch (const kp::Error& e) {
    return absl::Status(static_cast<absl::StatusCode>(e.code()), e.what());
  }
  return std::unique_ptr<RemoteBench>(new RemoteBench(std::move(s)));
}

// A bare unary round trip on its own channel: no session, no deadline, empty payload.
void RemoteBench::Ping(benchmark::State& state, v1::Sessions::Stub& stub) {
  v1::PingRequest request;
  v1::PingResponse response;
  for (auto _ : state) {
    grpc::ClientContext context;
    const grpc::Status st = stub.Ping(&context, request, &response);
    if (!st.ok()) {
      state.SkipWithError(absl::StrCat("ping: ", st.error_message()).c_str());
      break;
    }
  }
}

// Pings taken in turn on komputed, the bare completion-queue server and the bare callback server,
// so that the three share one stretch of the host's time (its clocks, its other load): each
// round trip timed on its own, their means reported as counters (µs).
void RemoteBench::PingInterleaved(benchmark::State& state, v1::Sessions::Stub* const stubs[3]) {
  v1::PingRequest request;
  v1::PingResponse response;
  double total_us[3] = {0, 0, 0};
  for (auto _ : state) {
    for (int k = 0; k < 3; ++k) {
      grpc::ClientContext context;
      const Stopwatch watch;
      const grpc::Status st = stubs[k]->Ping(&context, request, &response);
      total_us[k] += watch.Micros();
      if (!st.ok()) {
        state.SkipWithError(absl::StrCat("ping: ", st.error_message()).c_str());
        return;
      }
    }
  }
  const double n = static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.counters[kPingInterleavedKomputed] = total_us[0] / n;
  state.counters[kPingInterleavedBare] = total_us[1] / n;
  state.counters[kPingInterleavedCallback] = total_us[2] / n;
}

// The tiny evals of each of `lanes` and then, with `ping`, Pings of komputed, in turn, each in a
// run of kTinyEvalInterleavedRun back to back (as a program that evaluates in a loop sends them),
// each run timed as a whole.
void RemoteBench::TinyEvalInterleaved(benchmark::State& state, std::vector<TinyLane> lanes,
                                      v1::Sessions::Stub* ping) {
  v1::PingRequest request;
  v1::PingResponse response;
  std::vector<double> total_us(lanes.size() + 1, 0.0);
  std::vector<double> first_us(lanes.size(), 0.0);  // the first eval of each run
  uint64_t i = 0;
  try {
    for (auto _ : state) {
      for (size_t k = 0; k < lanes.size(); ++k) {
        const Stopwatch watch;
        for (int e = 0; e < kTinyEvalInterleavedRun; ++e) {
          if (!EvalTinyStep(*lanes[k].tiny, i++)) {
            state.SkipWithError(absl::StrCat(lanes[k].counter, ": wrong result").c_str());
            return;
          }
          if (e == 0) first_us[k] += watch.Micros();
        }
        total_us[k] += watch.Micros();
      }
      if (ping == nullptr) continue;
      const Stopwatch watch;
      for (int e = 0; e < kTinyEvalInterleavedRun; ++e) {
        grpc::ClientContext context;
        const grpc::Status st = ping->Ping(&context, request, &response);
        if (!st.ok()) {
          state.SkipWithError(absl::StrCat("ping: ", st.error_message()).c_str());
          return;
        }
      }
      total_us.back() += watch.Micros();
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const double runs = static_cast<double>(std::max<int64_t>(1, state.iterations()));
  const double n = runs * kTinyEvalInterleavedRun;
  for (size_t k = 0; k < lanes.size(); ++k) {
    state.counters[lanes[k].counter] = total_us[k] / n;
    state.counters[FirstOfRun(lanes[k].counter)] = first_us[k] / runs;
  }
  if (ping != nullptr) state.counters[kTinyEvalInterleavedPing] = total_us.back() / n;
}

namespace {

// A daemon counter read around a row: the counter's name in the row, and how to read it (nothing
// where the daemon's metrics do not answer).
struct DaemonShare {
  const char* counter;
  std::function<std::optional<double>()> read;
};

// Runs `row`, then sets each share's counter to how much its daemon counter grew over the row's
// evals: its iterations and `extra` more.
void RunCounting(benchmark::State& state, const std::vector<DaemonShare>& shares, size_t extra,
                 const std::function<void()>& row) {
  std::vector<std::optional<double>> before;
  for (const DaemonShare& share : shares) before.push_back(share.read());
  row();
  if (state.iterations() <= 0) return;
  const double evals = static_cast<double>(state.iterations()) + static_cast<double>(extra);
  for (size_t k = 0; k < shares.size(); ++k) {
    if (!before[k].has_value()) continue;
    if (const std::optional<double> after = shares[k].read(); after.has_value()) {
      state.counters[shares[k].counter] = (*after - *before[k]) / evals;
    }
  }
}

// RunKpAsync, with `counter` set to the share of its evals by which the daemon's counter that
// `read` returns grew: the lanes' first evals and one per iteration.
void RunKpAsyncCounting(benchmark::State& state, std::vector<KpTiny>& lanes, const char* what,
                        const char* counter, std::function<std::optional<double>()> read) {
  RunCounting(state, {{counter, std::move(read)}}, lanes.size(),
              [&] { RunKpAsync(state, lanes, what); });
}

}  // namespace

void RemoteBench::AsyncEvalsInterleaved(benchmark::State& state, std::vector<AsyncLane> lanes) {
  std::vector<double> seconds(lanes.size(), 0.0);
  std::vector<double> evals(lanes.size(), 0.0);
  for (auto _ : state) {
    for (size_t k = 0; k < lanes.size(); ++k) {
      AsyncLanes async(*lanes[k].lanes);
      const size_t n = kAsyncInterleavedRounds * lanes[k].lanes->size();
      std::string error;
      try {
        async.Fill();
        const Stopwatch watch;
        for (size_t e = 0; e < n && error.empty(); ++e) {
          if (!async.Step()) error = absl::StrCat(lanes[k].counter, ": wrong result");
        }
        seconds[k] += watch.Seconds();
        evals[k] += static_cast<double>(n);
      } catch (const kp::Error& e) {
        error = absl::StrCat(lanes[k].counter, ": ", e.what());
      }
      async.Drain();
      if (!error.empty()) {
        state.SkipWithError(error.c_str());
        return;
      }
    }
  }
  for (size_t k = 0; k < lanes.size(); ++k) {
    if (seconds[k] > 0) state.counters[lanes[k].counter] = evals[k] / seconds[k];
  }
}

// The ceiling for any protocol here: 256 MiB at a time from one buffer into another through a
// TCP loopback connection, 1 MiB per write() and read(), a receiver thread acknowledging each
// 256 MiB with one byte (a move's time includes it) and checking one element of it.
class LoopbackTransfer {
 public:
  LoopbackTransfer() : src_(PatternVector(kBulkCount)), dst_(kBulkCount) {}
  ~LoopbackTransfer() {
    if (!rx_.joinable()) return;
    shutdown(sender_.get(), SHUT_WR);  // the receiver reads EOF and stops
    rx_.join();
  }
  LoopbackTransfer(const LoopbackTransfer&) = delete;
  LoopbackTransfer& operator=(const LoopbackTransfer&) = delete;

  absl::Status Start() {
    if (absl::Status st = LoopbackPair(&sender_, &receiver_); !st.ok()) return st;
    rx_ = std::thread([this, fd = receiver_.get()] {
      char* p = reinterpret_cast<char*>(dst_.data());
      uint64_t round = 0;
      while (ReadAll(fd, p, kBulkBytes)) {
        const uint64_t k = (round++ * 7919) % kBulkCount;
        if (dst_[k] != Pattern(k)) wrong_ = true;
        const char ack = 1;
        if (write(fd, &ack, 1) != 1) break;
      }
    });
    return absl::OkStatus();
  }
  // 256 MiB through, acknowledged; the error where it failed.
  absl::Status Move() {
    char ack;
    if (!WriteAll(sender_.get(), reinterpret_cast<const char*>(src_.data()), kBulkBytes) ||
        read(sender_.get(), &ack, 1) != 1) {
      return Errno("tcp_loopback");
    }
    return wrong_ ? absl::DataLossError("tcp_loopback: wrong data") : absl::OkStatus();
  }

 private:
  const std::vector<float> src_;
  std::vector<float> dst_;
  Fd sender_, receiver_;
  std::atomic<bool> wrong_{false};
  std::thread rx_;
};

void RemoteBench::TcpLoopback(benchmark::State& state) {
  LoopbackTransfer tcp;
  if (absl::Status st = tcp.Start(); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  const ProcessUsage usage = ProcessUsage::Now();
  for (auto _ : state) {
    if (absl::Status st = tcp.Move(); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  SetTransferCounters(state, usage, state.iterations() * kBulkBytes);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBulkBytes));
}

void RemoteBench::TransfersInterleaved(benchmark::State& state, kp::Manager& remote) {
  LoopbackTransfer tcp;
  if (absl::Status st = tcp.Start(); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  double seconds[3] = {0, 0, 0};  // loopback, upload, download
  auto timed = [&seconds](int k, const std::function<void()>& move) {
    const Stopwatch watch;
    move();
    seconds[k] += watch.Seconds();
  };
  try {
    KpBulk bulk(remote, kBulkBytes, /*downloads=*/true);
    uint64_t i = 0;
    for (auto _ : state) {
      absl::Status st;
      timed(0, [&] { st = tcp.Move(); });
      if (!st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        break;
      }
      timed(1, [&] { bulk.Upload(); });
      state.PauseTiming();
      bulk.ClearHost();  // what the download brings back comes from the device
      state.ResumeTiming();
      bool right = false;
      timed(2, [&] { right = bulk.Download(i++); });
      if (!right) {
        state.SkipWithError("transfers: the download did not bring back the upload");
        break;
      }
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(absl::StrCat("transfers: ", e.what()).c_str());
  }
  remote.clear();
  const double bytes = static_cast<double>(state.iterations()) * static_cast<double>(kBulkBytes);
  const char* const counters[3] = {kTransfersInterleavedTcp, kTransfersInterleavedUpload,
                                   kTransfersInterleavedDownload};
  for (int k = 0; k < 3; ++k) {
    if (seconds[k] > 0) state.counters[counters[k]] = bytes / seconds[k];
  }
}

void RemoteBench::RegisterLatencyBenchmarks() {
  State* s = s_.get();
  const RemoteConfig& c = s->config;

  benchmark::RegisterBenchmark(kPing, [s](benchmark::State& state) { Ping(state, *s->ping_stub); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kPingBare,
                               [s](benchmark::State& state) { Ping(state, *s->bare->stub); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kPingBareCallback,
                               [s](benchmark::State& state) {
                                 std::unique_ptr<BarePeer> held;
                                 absl::StatusOr<BarePeer*> peer = s->BareCallback(held);
                                 if (!peer.ok()) {
                                   state.SkipWithError(peer.status().ToString().c_str());
                                   return;
                                 }
                                 Ping(state, *(*peer)->stub);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kPingInterleaved,
                               [s](benchmark::State& state) {
                                 std::unique_ptr<BarePeer> held;
                                 absl::StatusOr<BarePeer*> peer = s->BareCallback(held);
                                 if (!peer.ok()) {
                                   state.SkipWithError(peer.status().ToString().c_str());
                                   return;
                                 }
                                 v1::Sessions::Stub* const stubs[3] = {
                                     s->ping_stub.get(), s->bare->stub.get(), (*peer)->stub.get()};
                                 PingInterleaved(state, stubs);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTcpLoopback, TcpLoopback)
      ->UseRealTime()
      ->Iterations(c.tcp_iterations)
      ->Unit(benchmark::kMillisecond);

  benchmark::RegisterBenchmark(
      kTinyEvalInprocess,
      [s](benchmark::State& state) { RunKpTiny(state, s->tiny_inprocess, kTinyEvalInprocess); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(kTinyEvalInprocessPaced,
                               [s](benchmark::State& state) {
                                 RunKpTinyPaced(state, s->tiny_inprocess, kTinyEvalInprocessPaced,
                                                kTinyEvalPacedGap);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  if (s->default_family_inprocess != nullptr) {
    benchmark::RegisterBenchmark(kTinyEvalInprocessDefaultFamily,
                                 [s](benchmark::State& state) {
                                   RunKpTiny(state, s->tiny_default_family,
                                             kTinyEvalInprocessDefaultFamily);
                                 })
        ->UseRealTime()
        ->MinTime(c.min_time_s)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark(
      kTinyEvalRemote,
      [s](benchmark::State& state) { RunKpTiny(state, s->tiny_remote, kTinyEvalRemote); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(
      kTinyEvalStages,
      [s](benchmark::State& state) { RunEvalStages(state, s->address, s->config.tiny_spirv); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(kTinyEvalSameHostStages,
                               [s](benchmark::State& state) {
                                 RunSameHostEvalStages(state, s->same_host_server->address(),
                                                       s->config.tiny_spirv, s->config.client_spin);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(
      kTinyEvalSameHost,
      [s](benchmark::State& state) {
        // How the daemon woke the client for the answers: on the ring's word, or on the socket.
        BenchDaemon& d = *s->same_host_server;
        RunCounting(state,
                    {{kWordWakeShare, [&d] { return d.SameHostRingWakes("answer_word"); }},
                     {kSocketWakeShare, [&d] { return d.SameHostRingWakes("socket"); }}},
                    0, [&] { RunKpTiny(state, s->tiny_same_host, kTinyEvalSameHost); });
      })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  // One call each (a fixed count of evals), so that the other program starts once per row.
  const int64_t beside_evals = std::max<int64_t>(500, static_cast<int64_t>(c.min_time_s * 5000));
  const std::string inprocess_target =
      absl::StrCat(kTinyEvalLoopInprocess, ":", c.physical_device, ":", c.session_family);
  benchmark::RegisterBenchmark(kTinyEvalInprocessBeside,
                               [s, inprocess_target](benchmark::State& state) {
                                 RunKpTinyBeside(state, s->tiny_inprocess, kTinyEvalInprocessBeside,
                                                 inprocess_target);
                               })
      ->UseRealTime()
      ->Iterations(beside_evals)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyEvalSameHostBeside,
                               [s](benchmark::State& state) {
                                 RunKpTinyBeside(state, s->tiny_same_host, kTinyEvalSameHostBeside,
                                                 s->same_host_server->address());
                               })
      ->UseRealTime()
      ->Iterations(beside_evals)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyEvalInterleaved,
                               [s](benchmark::State& state) {
                                 TinyEvalInterleaved(
                                     state,
                                     {{kTinyEvalInterleavedInprocess, &s->tiny_inprocess},
                                      {kTinyEvalInterleavedRemote, &s->tiny_remote},
                                      {kTinyEvalInterleavedSameHost, &s->tiny_same_host}},
                                     s->ping_stub.get());
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyEvalSecureInterleaved,
                               [s](benchmark::State& state) {
                                 TinyEvalInterleaved(
                                     state,
                                     {{kTinyEvalInterleavedRemote, &s->tiny_remote},
                                      {kTinyEvalInterleavedToken, &s->tiny_token},
                                      {kTinyEvalInterleavedTokenSent, &s->tiny_token_sent},
                                      {kTinyEvalInterleavedTls, &s->tiny_tls}},
                                     nullptr);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(
      kTinyEvalToken,
      [s](benchmark::State& state) { RunKpTiny(state, s->tiny_token, kTinyEvalToken); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      kTinyEvalTls, [s](benchmark::State& state) { RunKpTiny(state, s->tiny_tls, kTinyEvalTls); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);

  benchmark::RegisterBenchmark(kAsyncEvalStages,
                               [s](benchmark::State& state) {
                                 RunAsyncEvalStages(state, s->address, s->config.tiny_spirv,
                                                    s->config.async_depth);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      kAsyncInprocess,
      [s](benchmark::State& state) { RunKpAsync(state, s->async_inprocess, kAsyncInprocess); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      kAsyncRemote,
      [s](benchmark::State& state) {
        // The share of the evals that went to the device with others in
        // one vkQueueSubmit (known of the benchmark's own daemon).
        RunKpAsyncCounting(state, s->async_remote, kAsyncRemote, kSubmittedTogether, [s] {
          return s->server != nullptr ? s->server->SubmittedTogether() : std::nullopt;
        });
      })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kAsyncRemoteUnbatched,
                               [s](benchmark::State& state) {
                                 RunKpAsync(state, s->async_remote_unbatched,
                                            kAsyncRemoteUnbatched);
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      kAsyncRemoteAlone,
      [s](benchmark::State& state) { RunKpAsync(state, s->async_remote_alone, kAsyncRemoteAlone); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kAsyncEvalsInterleaved,
                               [s](benchmark::State& state) {
                                 AsyncEvalsInterleaved(
                                     state, {{kAsyncInterleavedInprocess, &s->async_inprocess},
                                             {kAsyncInterleavedRemote, &s->async_remote},
                                             {kAsyncInterleavedSameHost, &s->async_same_host}});
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kAsyncSameHost,
                               [s](benchmark::State& state) {
                                 // The share of the evals that the daemon took on the channel, not
                                 // the Execute stream.
                                 RunKpAsyncCounting(
                                     state, s->async_same_host, kAsyncSameHost, kChannelShare,
                                     [s] { return s->same_host_server->SameHostEvals(); });
                               })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  const std::pair<const char*, std::vector<KpTiny>*> copies[] = {
      {kAsyncCopyInprocess, &s->copies_inprocess},
      {kAsyncCopyRemote, &s->copies_remote},
      {kAsyncCopySameHost, &s->copies_same_host}};
  for (const auto& [name, lanes] : copies) {
    benchmark::RegisterBenchmark(
        name,
        [name = name, lanes = lanes](benchmark::State& state) { RunKpAsync(state, *lanes, name); })
        ->UseRealTime()
        ->MinTime(c.min_time_s)
        ->Unit(benchmark::kMicrosecond);
  }
}

void RemoteBench::RegisterUpload() {
  State* s = s_.get();
  benchmark::RegisterBenchmark(
      kUploadRemote,
      [s](benchmark::State& state) { RunKpUpload(state, *s->remote, kUploadRemote); })
      ->UseRealTime()
      ->Iterations(s->config.bulk_iterations)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(
      kUploadSameHost,
      [s](benchmark::State& state) { RunKpUpload(state, *s->same_host, kUploadSameHost); })
      ->UseRealTime()
      ->Iterations(s->config.same_host_bulk_iterations)
      ->Unit(benchmark::kMillisecond);
}

void RemoteBench::RegisterDownload() {
  State* s = s_.get();
  benchmark::RegisterBenchmark(
      kDownloadRemote,
      [s](benchmark::State& state) { RunKpDownload(state, *s->remote, kDownloadRemote); })
      ->UseRealTime()
      ->Iterations(s->config.bulk_iterations)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(
      kDownloadSameHost,
      [s](benchmark::State& state) { RunKpDownload(state, *s->same_host, kDownloadSameHost); })
      ->UseRealTime()
      ->Iterations(s->config.same_host_bulk_iterations)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(
      kTransfersInterleaved,
      [s](benchmark::State& state) { TransfersInterleaved(state, *s->remote); })
      ->UseRealTime()
      ->Iterations(s->config.tcp_iterations)
      ->Unit(benchmark::kMillisecond);
}

bool RemoteBench::gib_transfers() const { return s_->config.gib_transfers; }

void RemoteBench::RegisterGiBTransfers() {
  State* s = s_.get();
  benchmark::RegisterBenchmark(kUploadGiBSameHost,
                               [s](benchmark::State& state) {
                                 RunKpUpload(state, *s->same_host, kUploadGiBSameHost, kGiBBytes);
                               })
      ->UseRealTime()
      ->Iterations(s->config.same_host_bulk_iterations)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(kDownloadGiBSameHost,
                               [s](benchmark::State& state) {
                                 RunKpDownload(state, *s->same_host, kDownloadGiBSameHost,
                                               kGiBBytes);
                               })
      ->UseRealTime()
      ->Iterations(s->config.same_host_bulk_iterations)
      ->Unit(benchmark::kMillisecond);
}

namespace {
// Set by SIGTERM in RunTinyEvalLoop (a lock-free atomic: safe to store from a signal handler).
std::atomic<int> g_tiny_eval_loop_stop{0};
static_assert(std::atomic<int>::is_always_lock_free);
}  // namespace

int RunTinyEvalLoop(absl::string_view target, const std::vector<uint32_t>& tiny_spirv) {
  spdlog::set_level(spdlog::level::warn);
  const std::string what = absl::StrCat("komputed_bench ", kTinyEvalLoop, "=", target, ": ");
  try {
    std::unique_ptr<kp::Manager> mgr;
    absl::string_view local = target;
    if (absl::ConsumePrefix(&local, absl::StrCat(kTinyEvalLoopInprocess, ":"))) {
      const std::vector<absl::string_view> parts = absl::StrSplit(local, ':');
      uint32_t device = 0;
      uint32_t family = 0;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &device) ||
          !absl::SimpleAtoi(parts[1], &family)) {
        std::fprintf(stderr, "%snot %s:DEVICE:FAMILY\n", what.c_str(), kTinyEvalLoopInprocess);
        return 1;
      }
      mgr = std::make_unique<kp::Manager>(device, std::vector<uint32_t>{family});
    } else {
      mgr = std::make_unique<kp::Manager>(std::string(target));
    }
    KpTiny tiny = MakeKpTiny(*mgr, tiny_spirv);
    uint64_t i = 0;
    if (!EvalTinyStep(tiny, i++)) {
      std::fprintf(stderr, "%sa wrong result\n", what.c_str());
      return 1;
    }
    struct sigaction stop = {};
    stop.sa_handler = [](int) { g_tiny_eval_loop_stop.store(1, std::memory_order_relaxed); };
    stop.sa_flags = SA_RESTART;  // an eval's waits go on where the signal lands in them
    sigaction(SIGTERM, &stop, nullptr);
    std::printf("%s\n", kTinyEvalLoopReady);
    std::fflush(stdout);
    // Evaluates until SIGTERM, or until the benchmark is gone (its end of the stdout pipe closed,
    // which poll reports as an error on this end), looking every 16 evals.
    const absl::Time began = absl::Now();
    const absl::Time until = began + kTinyEvalLoopLimit;
    pollfd out{STDOUT_FILENO, 0, 0};
    uint64_t evals = 0;
    while (g_tiny_eval_loop_stop.load(std::memory_order_relaxed) == 0) {
      for (int k = 0; k < 16; ++k, ++evals) {
        if (!EvalTinyStep(tiny, i++)) {
          std::fprintf(stderr, "%sa wrong result\n", what.c_str());
          return 1;
        }
      }
      if (poll(&out, 1, 0) > 0 && (out.revents & (POLLERR | POLLHUP)) != 0) return 0;
      // Stopping on its own would leave the benchmark's lane alone for the rest of its row: a
      // failure, not a count.
      if (absl::Now() >= until) {
        std::fprintf(stderr, "%sno SIGTERM within %s\n", what.c_str(),
                     absl::FormatDuration(kTinyEvalLoopLimit).c_str());
        return 1;
      }
    }
    std::printf("%s %llu %.1f\n", kTinyEvalLoopDone, static_cast<unsigned long long>(evals),
                absl::ToDoubleMicroseconds(absl::Now() - began));
    std::fflush(stdout);
  } catch (const kp::Error& e) {
    std::fprintf(stderr, "%s%s\n", what.c_str(), e.what());
    return 1;
  }
  return 0;
}

int ServeBarePing(absl::string_view kind) {
  absl::StatusOr<BareServer> server = StartBareServer(kind);
  if (!server.ok()) {
    std::fprintf(stderr, "komputed_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("listening on %s\n", server->address.c_str());
  std::fflush(stdout);
  // Serves until a signal ends the process (the benchmark's SIGTERM), or until the benchmark is
  // gone: its end of the stdout pipe closed, which poll reports on this end as an error.
  pollfd out{STDOUT_FILENO, 0, 0};
  while (poll(&out, 1, -1) <= 0 || (out.revents & (POLLERR | POLLHUP)) == 0) {
  }
  return 0;
}

}  // namespace komputed_bench

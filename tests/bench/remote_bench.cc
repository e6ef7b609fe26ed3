#include "remote_bench.h"

#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench_common.h"
#include "eval_stages.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "server.h"
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

// The bare callback server and a client of it, alive only while a benchmark that pings it runs:
// a callback server's threads would do the reading for every other gRPC call of the process, and
// slow those down too.
struct CallbackPeer {
  std::unique_ptr<BareCallbackPingServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Sessions::Stub> stub;
};

absl::StatusOr<std::unique_ptr<CallbackPeer>> StartCallbackPeer() {
  auto peer = std::make_unique<CallbackPeer>();
  absl::StatusOr<std::unique_ptr<BareCallbackPingServer>> server = BareCallbackPingServer::Start();
  if (!server.ok()) return server.status();
  peer->server = *std::move(server);
  peer->channel = grpc::CreateChannel(peer->server->address(), grpc::InsecureChannelCredentials());
  peer->stub = v1::Sessions::NewStub(peer->channel);
  grpc::ClientContext context;  // connects before the timing starts
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PingRequest request;
  v1::PingResponse response;
  const grpc::Status st = peer->stub->Ping(&context, request, &response);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("ping of the bare callback server: ", st.error_message()));
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
  std::unique_ptr<komputed::server::Server> server;
  std::string address;
  std::shared_ptr<grpc::Channel> ping_channel;
  std::unique_ptr<v1::Sessions::Stub> ping_stub;
  std::unique_ptr<BarePingServer> bare_server;
  std::shared_ptr<grpc::Channel> bare_channel;
  std::unique_ptr<v1::Sessions::Stub> bare_stub;
  std::unique_ptr<kp::Manager> remote;
  // The daemons that authenticate, and their clients.
  komputed::test_support::TestCertificates certs;
  std::unique_ptr<komputed::server::Server> token_server;
  std::unique_ptr<komputed::server::Server> tls_server;
  std::unique_ptr<kp::Manager> token_remote;
  std::unique_ptr<kp::Manager> tls_remote;
  KpTiny tiny_token;
  KpTiny tiny_tls;
  KpTiny tiny_inprocess;
  KpTiny tiny_remote;
  std::vector<KpTiny> async_inprocess;
  std::vector<KpTiny> async_remote;
  std::unique_ptr<kp::Manager> remote_unbatched;  // KOMPUTED_EXECUTE_BATCHES=0 as it opened
  std::vector<KpTiny> async_remote_unbatched;
  // The daemon that submits each eval alone (--submit_together=false), and its client.
  std::unique_ptr<komputed::server::Server> alone_server;
  std::unique_ptr<kp::Manager> remote_alone;
  std::vector<KpTiny> async_remote_alone;
  // The same-host daemon (a Unix socket, shared memory) and its client.
  std::unique_ptr<komputed::server::Server> same_host_server;
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
  if (s_->alone_server != nullptr) s_->alone_server->Shutdown();
  s_->alone_server.reset();
  s_->async_same_host.clear();
  s_->tiny_same_host = KpTiny{};
  s_->same_host.reset();
  if (s_->same_host_server != nullptr) s_->same_host_server->Shutdown();
  s_->same_host_server.reset();
  s_->tiny_remote = KpTiny{};
  s_->tiny_token = KpTiny{};
  s_->tiny_tls = KpTiny{};
  s_->remote.reset();  // closes the session
  s_->token_remote.reset();
  s_->tls_remote.reset();
  for (auto* server : {&s_->token_server, &s_->tls_server}) {
    if (*server != nullptr) (*server)->Shutdown();
    server->reset();
  }
  s_->async_inprocess.clear();
  s_->copies_inprocess.clear();
  s_->tiny_inprocess = KpTiny{};
  s_->tiny_default_family = KpTiny{};
  s_->ping_stub.reset();
  s_->ping_channel.reset();
  s_->bare_stub.reset();
  s_->bare_channel.reset();
  s_->bare_server.reset();
  if (s_->server != nullptr) s_->server->Shutdown();
  s_->server.reset();
}

const std::string& RemoteBench::address() const { return s_->address; }
bool RemoteBench::daemon_in_process() const { return s_->config.daemon_address.empty(); }
std::string RemoteBench::same_host_address() const { return s_->same_host_server->address(); }
uint64_t RemoteBench::same_host_shared_tensors() const {
  return static_cast<uint64_t>(
      s_->same_host_server->metrics().shared_memory_tensors_total().Value());
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

  // The daemon, in this process: its gRPC threads, device and completion waiter live beside the
  // client's, as on one host. Its log lines would interleave with the results: warnings only.
  spdlog::set_level(spdlog::level::warn);
  komputed::server::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.devices = {s->config.physical_device};
  options.shared_memory = false;  // every byte through gRPC: the remote path's figures
  if (s->config.eval_spin.has_value()) options.eval_spin = *s->config.eval_spin;
  options.eval_poll = s->config.eval_poll;
  if (s->config.grpc_threads.has_value()) options.grpc_threads = *s->config.grpc_threads;
  if (s->config.max_kernel_time.has_value()) {
    options.max_kernel_time = *s->config.max_kernel_time;
  }
  if (s->config.dispatch_share.has_value()) options.dispatch_share = *s->config.dispatch_share;
  if (s->config.eval_inline_wait.has_value())
    options.eval_inline_wait = *s->config.eval_inline_wait;
  auto server = komputed::server::Server::Start(options);
  if (!server.ok()) return server.status();
  s->server = *std::move(server);
  s->address = s->config.daemon_address.empty() ? s->server->address() : s->config.daemon_address;

  // A daemon with one tenant (its token's hash in a tenants file), and one that serves TLS.
  if (!s->certs.ok()) return s->certs.status();
  constexpr char kToken[] = "bench-token";
  const std::string tenants = s->certs.dir() + "/tenants.yaml";
  std::ofstream(tenants) << "tenants:\n  - name: bench\n    token_sha256: "
                         << komputed::server::HexDigest(komputed::server::Sha256(kToken)) << "\n";
  komputed::server::ServerOptions token_options = options;
  token_options.tenants_file = tenants;
  auto token_server = komputed::server::Server::Start(token_options);
  if (!token_server.ok()) return token_server.status();
  s->token_server = *std::move(token_server);
  komputed::server::ServerOptions tls_options = options;
  tls_options.tls_cert = s->certs.server_cert();
  tls_options.tls_key = s->certs.server_key();
  auto tls_server = komputed::server::Server::Start(tls_options);
  if (!tls_server.ok()) return tls_server.status();
  s->tls_server = *std::move(tls_server);

  komputed::server::ServerOptions alone_options = options;
  alone_options.submit_together = false;
  auto alone_server = komputed::server::Server::Start(alone_options);
  if (!alone_server.ok()) return alone_server.status();
  s->alone_server = *std::move(alone_server);

  komputed::server::ServerOptions same_host_options = options;
  same_host_options.listen = "unix:" + s->certs.dir() + "/komputed.sock";
  same_host_options.shared_memory = true;
  auto same_host_server = komputed::server::Server::Start(same_host_options);
  if (!same_host_server.ok()) return same_host_server.status();
  s->same_host_server = *std::move(same_host_server);

  s->ping_channel = grpc::CreateChannel(s->address, grpc::InsecureChannelCredentials());
  s->ping_stub = v1::Sessions::NewStub(s->ping_channel);
  auto bare = BarePingServer::Start();
  if (!bare.ok()) return bare.status();
  s->bare_server = *std::move(bare);
  s->bare_channel =
      grpc::CreateChannel(s->bare_server->address(), grpc::InsecureChannelCredentials());
  s->bare_stub = v1::Sessions::NewStub(s->bare_channel);
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
      const auto start = std::chrono::steady_clock::now();
      const grpc::Status st = stubs[k]->Ping(&context, request, &response);
      total_us[k] +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
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

// The tiny evals of `lanes` (in-process, remote, same host) and Pings of komputed, in turn, each
// in a run of kTinyEvalInterleavedRun back to back (as a program that evaluates in a loop sends
// them), each run timed as a whole.
void RemoteBench::TinyEvalInterleaved(benchmark::State& state, KpTiny* const lanes[3],
                                      v1::Sessions::Stub& ping) {
  static constexpr const char* kWhat[3] = {"in-process", "remote", "same host"};
  v1::PingRequest request;
  v1::PingResponse response;
  double total_us[4] = {0, 0, 0, 0};
  auto since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
        .count();
  };
  uint64_t i = 0;
  try {
    for (auto _ : state) {
      for (int k = 0; k < 3; ++k) {
        const auto start = std::chrono::steady_clock::now();
        for (int e = 0; e < kTinyEvalInterleavedRun; ++e) {
          if (!EvalTinyStep(*lanes[k], i++)) {
            state.SkipWithError(absl::StrCat(kWhat[k], ": wrong result").c_str());
            return;
          }
        }
        total_us[k] += since(start);
      }
      const auto start = std::chrono::steady_clock::now();
      for (int e = 0; e < kTinyEvalInterleavedRun; ++e) {
        grpc::ClientContext context;
        const grpc::Status st = ping.Ping(&context, request, &response);
        if (!st.ok()) {
          state.SkipWithError(absl::StrCat("ping: ", st.error_message()).c_str());
          return;
        }
      }
      total_us[3] += since(start);
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const double n =
      static_cast<double>(std::max<int64_t>(1, state.iterations()) * kTinyEvalInterleavedRun);
  state.counters[kTinyEvalInterleavedInprocess] = total_us[0] / n;
  state.counters[kTinyEvalInterleavedRemote] = total_us[1] / n;
  state.counters[kTinyEvalInterleavedSameHost] = total_us[2] / n;
  state.counters[kTinyEvalInterleavedPing] = total_us[3] / n;
}

// The ceiling for any protocol here: 256 MiB from one buffer into another through a TCP loopback
// connection, 1 MiB per write() and read(), a receiver thread acknowledging each 256 MiB with one
// byte (the time includes it).
void RemoteBench::TcpLoopback(benchmark::State& state) {
  Fd sender, receiver;
  if (absl::Status st = LoopbackPair(&sender, &receiver); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  const std::vector<float> src = PatternVector(kBulkCount);
  std::vector<float> dst(kBulkCount);
  std::atomic<bool> wrong{false};
  std::thread rx([&, fd = receiver.get()] {
    char* p = reinterpret_cast<char*>(dst.data());
    uint64_t round = 0;
    while (ReadAll(fd, p, kBulkBytes)) {
      const uint64_t k = (round++ * 7919) % kBulkCount;
      if (dst[k] != Pattern(k)) wrong = true;
      const char ack = 1;
      if (write(fd, &ack, 1) != 1) break;
    }
  });
  const char* p = reinterpret_cast<const char*>(src.data());
  const ProcessUsage usage = ProcessUsage::Now();
  for (auto _ : state) {
    char ack;
    if (!WriteAll(sender.get(), p, kBulkBytes) || read(sender.get(), &ack, 1) != 1) {
      state.SkipWithError(absl::StrCat("tcp_loopback: ", std::strerror(errno)).c_str());
      break;
    }
  }
  SetTransferCounters(state, usage, state.iterations() * kBulkBytes);
  shutdown(sender.get(), SHUT_WR);  // the receiver reads EOF and stops
  rx.join();
  if (wrong) state.SkipWithError("tcp_loopback: wrong data");
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBulkBytes));
}

void RemoteBench::RegisterLatencyBenchmarks() {
  State* s = s_.get();
  const RemoteConfig& c = s->config;

  benchmark::RegisterBenchmark(kPing, [s](benchmark::State& state) { Ping(state, *s->ping_stub); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kPingBare,
                               [s](benchmark::State& state) { Ping(state, *s->bare_stub); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kPingBareCallback,
                               [](benchmark::State& state) {
                                 absl::StatusOr<std::unique_ptr<CallbackPeer>> peer =
                                     StartCallbackPeer();
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
                                 absl::StatusOr<std::unique_ptr<CallbackPeer>> peer =
                                     StartCallbackPeer();
                                 if (!peer.ok()) {
                                   state.SkipWithError(peer.status().ToString().c_str());
                                   return;
                                 }
                                 v1::Sessions::Stub* const stubs[3] = {
                                     s->ping_stub.get(), s->bare_stub.get(), (*peer)->stub.get()};
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
      [s](benchmark::State& state) { RunKpTiny(state, s->tiny_same_host, kTinyEvalSameHost); })
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(
      kTinyEvalInterleaved,
      [s](benchmark::State& state) {
        KpTiny* const lanes[3] = {&s->tiny_inprocess, &s->tiny_remote, &s->tiny_same_host};
        TinyEvalInterleaved(state, lanes, *s->ping_stub);
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
        // The share of the evals that went to the device with others in one vkQueueSubmit.
        prometheus::Counter& together = s->server->metrics().submitted_together_total();
        const double before = together.Value();
        RunKpAsync(state, s->async_remote, kAsyncRemote);
        if (state.iterations() > 0) {
          state.counters[kSubmittedTogether] =
              (together.Value() - before) / static_cast<double>(state.iterations());
        }
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
  benchmark::RegisterBenchmark(
      kAsyncSameHost,
      [s](benchmark::State& state) { RunKpAsync(state, s->async_same_host, kAsyncSameHost); })
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

}  // namespace komputed_bench

// The client's credentials (client/src/remote/credentials.h) as kp and komputectl present them:
// the bearer token on every call, unary and streaming, TLS and mTLS, and the errors that say
// what to set. The daemon here is a small fake served in the test's own process, which records
// what each call brought; TLS certificates are made at run time with the openssl command.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <kompute/Kompute.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "support/process.h"
#include "support/scoped_env.h"
#include "support/test_certs.h"

namespace kptest {
namespace {

namespace v1 = komputed::v1;
using komputed::test_support::ScopedEnv;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- certificates

// A fresh directory under /tmp, removed with the object.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/credentials-test-XXXXXX";
    path_ = mkdtemp(name);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string Write(const std::string& file, const std::string& text) const {
    const std::string path = Path(file);
    std::ofstream(path) << text;
    return path;
  }
  std::string Path(const std::string& file) const { return path_ + "/" + file; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The test program's certificates (support/test_certs.h: a CA, another CA that signed nothing
// here, a server certificate for localhost and 127.0.0.1, a client certificate with CN
// ci-runner), made once.
struct Certificates {
  komputed::test_support::TestCertificates made;
  std::string ca = made.ca(), other_ca = made.other_ca();
  std::string server_cert = made.server_cert(), server_key = made.server_key();
  std::string client_cert = made.client_cert(), client_key = made.client_key();
  std::string error = made.ok() ? "" : made.status().ToString();  // empty when all were made
};

const Certificates& Certs() {
  static const Certificates* certs = new Certificates();  // its directory outlives every test
  return *certs;
}

// ---- the fake daemon

// What one call brought.
struct Call {
  std::string method;                        // "OpenSession"
  std::optional<std::string> authorization;  // the metadata's value; none when absent
  std::string peer;                          // the client's address: one per connection
  std::string client_cn;                     // the client certificate's CN (mTLS)
};

struct FakeOptions {
  std::string cert, key;         // PEM files; set, the fake serves TLS
  std::string client_ca;         // PEM file; set, client certificates are required and verified
  std::string required_token;    // set, OpenSession and ListSessions refuse other tokens
  bool deny_open = false;        // OpenSession answers PERMISSION_DENIED
  uint64_t idle_timeout_ms = 0;  // told to clients (their keep-alive period is a third of it)
};

// komputed.v1 enough for a kp::Manager and komputectl: sessions, devices, tensors created and
// written, sequences created and evaluated (Eval and the Execute stream), each call recorded.
// Listens on 127.0.0.1, port chosen by the system. Thread-safe.
class FakeDaemon final : public v1::Sessions::Service,
                         public v1::Devices::Service,
                         public v1::Tensors::Service,
                         public v1::Sequences::Service {
 public:
  explicit FakeDaemon(FakeOptions options = {}) : options_(std::move(options)) {
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
    if (!options_.cert.empty()) {
      grpc::SslServerCredentialsOptions ssl(
          options_.client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      if (!options_.client_ca.empty()) ssl.pem_root_certs = ReadAll(options_.client_ca);
      ssl.pem_key_cert_pairs.push_back({ReadAll(options_.key), ReadAll(options_.cert)});
      credentials = grpc::SslServerCredentials(ssl);
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port_);
    builder.SetMaxReceiveMessageSize(-1);  // bulk chunks are 4 MiB and a header
    builder.RegisterService(static_cast<v1::Sessions::Service*>(this));
    builder.RegisterService(static_cast<v1::Devices::Service*>(this));
    builder.RegisterService(static_cast<v1::Tensors::Service*>(this));
    builder.RegisterService(static_cast<v1::Sequences::Service*>(this));
    server_ = builder.BuildAndStart();
  }
  ~FakeDaemon() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  bool started() const { return server_ != nullptr && port_ > 0; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }

  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // The calls of `method`, waiting up to 10 s for at least `count` of them.
  std::vector<Call> CallsOf(const std::string& method, size_t count = 1) const {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<Call> out;
    cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      out.clear();
      for (const Call& c : calls_) {
        if (c.method == method) out.push_back(c);
      }
      return out.size() >= count;
    });
    return out;
  }

  // Sessions
  grpc::Status OpenSession(grpc::ServerContext* context, const v1::OpenSessionRequest*,
                           v1::OpenSessionResponse* response) override {
    if (grpc::Status s = Authenticate(Note(context, "OpenSession")); !s.ok()) return s;
    if (options_.deny_open) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "tenant may not open sessions");
    }
    response->set_session_id("s-1");
    response->mutable_device()->set_name("fake device");
    response->set_queue_count(1);
    response->set_idle_timeout_ms(options_.idle_timeout_ms);
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext* context, const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override {
    Note(context, "CloseSession");
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest*,
                         v1::KeepAliveResponse*) override {
    Note(context, "KeepAlive");
    return grpc::Status::OK;
  }
  grpc::Status ListSessions(grpc::ServerContext* context, const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse*) override {
    return Authenticate(Note(context, "ListSessions"));
  }
  grpc::Status Ping(grpc::ServerContext* context, const v1::PingRequest*,
                    v1::PingResponse*) override {
    Note(context, "Ping");
    return grpc::Status::OK;
  }

  // Devices
  grpc::Status ListDevices(grpc::ServerContext* context, const v1::ListDevicesRequest*,
                           v1::ListDevicesResponse* response) override {
    Note(context, "ListDevices");
    response->add_devices()->set_name("fake device");
    return grpc::Status::OK;
  }

  // Tensors
  grpc::Status CreateTensor(grpc::ServerContext* context, const v1::CreateTensorRequest*,
                            v1::CreateTensorResponse*) override {
    Note(context, "CreateTensor");
    return grpc::Status::OK;
  }
  grpc::Status WriteTensor(grpc::ServerContext* context,
                           grpc::ServerReader<v1::TensorChunk>* reader,
                           v1::WriteTensorResponse* response) override {
    Note(context, "WriteTensor");
    v1::TensorChunk chunk;
    uint64_t bytes = 0;
    while (reader->Read(&chunk)) bytes += chunk.data().size();
    response->set_bytes_written(bytes);
    return grpc::Status::OK;
  }

  // Zeros, in chunks of the size asked for.
  grpc::Status ReadTensor(grpc::ServerContext* context, const v1::ReadTensorRequest* request,
                          grpc::ServerWriter<v1::TensorChunk>* writer) override {
    Note(context, "ReadTensor");
    const uint64_t step = request->chunk_bytes() > 0 ? request->chunk_bytes() : 4u << 20;
    const uint64_t end = request->offset() + request->length();
    for (uint64_t at = request->offset(); at < end; at += step) {
      v1::TensorChunk chunk;
      chunk.set_offset(at);
      chunk.mutable_data()->assign(std::min(step, end - at), '\0');
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }

  // Sequences
  grpc::Status CreateSequence(grpc::ServerContext* context, const v1::CreateSequenceRequest*,
                              v1::CreateSequenceResponse*) override {
    Note(context, "CreateSequence");
    return grpc::Status::OK;
  }
  grpc::Status Eval(grpc::ServerContext* context, const v1::EvalRequest*,
                    v1::EvalResponse*) override {
    Note(context, "Eval");
    return grpc::Status::OK;
  }
  grpc::Status Execute(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ExecuteEvent, v1::ExecuteRequest>* stream) override {
    Note(context, "Execute");
    v1::ExecuteRequest request;
    while (stream->Read(&request)) {
      v1::ExecuteEvent event;
      event.set_request_id(request.eval().request_id());
      if (!stream->Write(event)) break;
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Authenticate(const Call& call) const {
    if (!options_.required_token.empty() &&
        call.authorization != absl::StrCat("Bearer ", options_.required_token)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no known bearer token");
    }
    return grpc::Status::OK;
  }

  // Records the call (what it brought) and returns it.
  Call Note(grpc::ServerContext* context, const std::string& method) {
    Call call{method, std::nullopt, context->peer(), ""};
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      call.authorization = std::string(it->second.data(), it->second.size());
    }
    for (const auto& cn : context->auth_context()->FindPropertyValues("x509_common_name")) {
      call.client_cn = std::string(cn.data(), cn.size());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back(call);
    }
    cv_.notify_all();
    return call;
  }

  const FakeOptions options_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<Call> calls_;  // guarded by mu_
};

// ---- helpers

// The kp::Error that `f` throws; none when it throws nothing.
template <typename F>
std::optional<kp::Error> KpErrorOf(F&& f) {
  try {
    f();
  } catch (const kp::Error& e) {
    return e;
  }
  return std::nullopt;
}

kp::Remote RemoteTo(const std::string& address) {
  kp::Remote remote;
  remote.address = address;
  return remote;
}

// Every credential variable unset for the test (and put back after it), so that the machine's
// environment cannot leak in.
class CredentialsTest : public ::testing::Test {
 protected:
  ScopedEnv token_{"KOMPUTED_TOKEN", std::nullopt};
  ScopedEnv token_file_{"KOMPUTED_TOKEN_FILE", std::nullopt};
  ScopedEnv ca_{"KOMPUTED_TLS_CA", std::nullopt};
  ScopedEnv cert_{"KOMPUTED_TLS_CERT", std::nullopt};
  ScopedEnv key_{"KOMPUTED_TLS_KEY", std::nullopt};
  ScopedEnv address_{"KOMPUTED_ADDRESS", std::nullopt};
  TempDir dir_;
};

class TlsTest : public CredentialsTest {
 protected:
  void SetUp() override { ASSERT_EQ(Certs().error, ""); }
};

// ---- the token

TEST_F(CredentialsTest, TokenReachesUnaryAndStreamingCallsOnEveryChannel) {
  FakeDaemon daemon({.idle_timeout_ms = 300});  // a keep-alive every 100 ms
  ASSERT_TRUE(daemon.started());
  // Two bulk lanes: a large tensor goes up and comes back over the session's channel and a
  // second one.
  ScopedEnv lanes("KOMPUTED_TRANSFER_STREAMS", "2");
  {
    kp::Remote remote = RemoteTo(daemon.address());
    remote.token = "secret-1";
    kp::Manager mgr(remote);
    auto big = mgr.tensorT<float>(std::vector<float>(8u << 20, 1.0f));  // 32 MiB: 8 chunks
    EXPECT_TRUE(big->isInit());
    auto small = mgr.tensor({1, 2, 3});
    auto seq = mgr.sequence();
    seq->evalAsync<kp::OpTensorSyncDevice>({small});  // the Execute stream
    seq->evalAwait();
    seq->eval<kp::OpTensorSyncDevice>({small});
    seq->eval<kp::OpTensorSyncLocal>({big});  // comes back streamed: the fake's zeros
    EXPECT_EQ(big->data()[0], 0.0f);
    daemon.CallsOf("KeepAlive");
  }
  std::set<std::string> methods, write_peers, read_peers;
  for (const Call& c : daemon.calls()) {
    methods.insert(c.method);
    EXPECT_EQ(c.authorization, "Bearer secret-1") << c.method;
    if (c.method == "WriteTensor") write_peers.insert(c.peer);
    if (c.method == "ReadTensor") read_peers.insert(c.peer);
  }
  for (const char* m : {"OpenSession", "CreateTensor", "WriteTensor", "ReadTensor",
                        "CreateSequence", "Execute", "Eval", "KeepAlive", "CloseSession"}) {
    EXPECT_TRUE(methods.count(m)) << m << " was not called";
  }
  EXPECT_EQ(write_peers.size(), 2u) << "the tensor did not go up over two connections";
  EXPECT_EQ(read_peers.size(), 2u) << "the tensor did not come back over two connections";
}

TEST_F(CredentialsTest, NoTokenConfiguredSendsNoAuthorization) {
  FakeDaemon daemon;
  ASSERT_TRUE(daemon.started());
  {
    kp::Manager mgr(RemoteTo(daemon.address()));
    auto t = mgr.tensor({1, 2, 3});
    mgr.sequence()->evalAsync<kp::OpTensorSyncDevice>({t})->evalAwait();
  }
  ASSERT_FALSE(daemon.calls().empty());
  for (const Call& c : daemon.calls()) EXPECT_EQ(c.authorization, std::nullopt) << c.method;
}

TEST_F(CredentialsTest, TokenFromTheEnvironmentAndItsOrder) {
  FakeDaemon daemon;
  ASSERT_TRUE(daemon.started());
  auto token_of_open = [&] {
    kp::Manager mgr(RemoteTo(daemon.address()));
    return daemon.calls().back().authorization.value_or("<none>");
  };
  {
    ScopedEnv file("KOMPUTED_TOKEN_FILE", dir_.Write("token", "from-file\n\n"));
    EXPECT_EQ(token_of_open(), "Bearer from-file");  // the trailing newlines trimmed
    ScopedEnv token("KOMPUTED_TOKEN", "from-env");
    EXPECT_EQ(token_of_open(), "Bearer from-env");  // KOMPUTED_TOKEN wins over the file
    kp::Remote remote = RemoteTo(daemon.address());
    remote.token = "from-code";
    { kp::Manager mgr(remote); }
    EXPECT_EQ(daemon.CallsOf("OpenSession", 3)[2].authorization, "Bearer from-code");
  }
  {
    // Manager(), as a program without changes runs remote.
    ScopedEnv address("KOMPUTED_ADDRESS", daemon.address());
    ScopedEnv token("KOMPUTED_TOKEN", "default-manager");
    { kp::Manager mgr; }
    EXPECT_EQ(daemon.CallsOf("OpenSession", 4)[3].authorization, "Bearer default-manager");
  }
}

TEST_F(CredentialsTest, MissingTokenFileNamesTheVariableAndThePath) {
  const std::string missing = dir_.Path("no-such-token");
  ScopedEnv file("KOMPUTED_TOKEN_FILE", missing);
  auto e = KpErrorOf([&] { kp::Manager mgr(RemoteTo("127.0.0.1:1")); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kFailedPrecondition);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("KOMPUTED_TOKEN_FILE"), HasSubstr(missing),
                               HasSubstr("No such file")));
}

TEST_F(CredentialsTest, EmptyTokenFileIsAnError) {
  ScopedEnv file("KOMPUTED_TOKEN_FILE", dir_.Write("token", " \n"));
  auto e = KpErrorOf([&] { kp::Manager mgr(RemoteTo("127.0.0.1:1")); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kFailedPrecondition);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("KOMPUTED_TOKEN_FILE"), HasSubstr("empty")));
}

TEST_F(CredentialsTest, TokenThatCannotGoInMetadataIsRefusedWithoutShowingIt) {
  kp::Remote remote = RemoteTo("127.0.0.1:1");
  remote.token = "hunter2\nhunter3";
  auto e = KpErrorOf([&] { kp::Manager mgr(remote); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kInvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("kp::Remote::token"), Not(HasSubstr("hunter"))));
}

// ---- errors from the daemon

TEST_F(CredentialsTest, UnauthenticatedBecomesKpErrorThatSaysWhatToSet) {
  FakeDaemon daemon({.required_token = "right"});
  ASSERT_TRUE(daemon.started());
  for (const std::string token : {"", "wrong-token"}) {
    kp::Remote remote = RemoteTo(daemon.address());
    remote.token = token;
    auto e = KpErrorOf([&] { kp::Manager mgr(remote); });
    ASSERT_TRUE(e.has_value()) << token;
    EXPECT_EQ(e->code(), kp::ErrorCode::kUnauthenticated);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("no known bearer token"), HasSubstr("KOMPUTED_TOKEN"),
                                 HasSubstr("KOMPUTED_TOKEN_FILE"), Not(HasSubstr("wrong-token"))));
  }
  kp::Remote remote = RemoteTo(daemon.address());
  remote.token = "right";
  EXPECT_FALSE(KpErrorOf([&] { kp::Manager mgr(remote); }).has_value());
}

TEST_F(CredentialsTest, PermissionDeniedBecomesKpError) {
  FakeDaemon daemon({.deny_open = true});
  ASSERT_TRUE(daemon.started());
  auto e = KpErrorOf([&] { kp::Manager mgr(RemoteTo(daemon.address())); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kPermissionDenied);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("tenant may not open sessions"), HasSubstr("KOMPUTED_")));
}

// ---- TLS

TEST_F(TlsTest, RightCaConnectsAndCarriesTheToken) {
  FakeDaemon daemon({.cert = Certs().server_cert, .key = Certs().server_key});
  ASSERT_TRUE(daemon.started());
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    kp::Remote remote = RemoteTo(absl::StrCat(host, ":", daemon.port()));
    remote.token = "over-tls";
    remote.tlsCa = Certs().ca;
    kp::Manager mgr(remote);
    EXPECT_STREQ(mgr.getDeviceProperties().deviceName, "fake device");
  }
  for (const Call& c : daemon.calls()) EXPECT_EQ(c.authorization, "Bearer over-tls") << c.method;
}

TEST_F(TlsTest, CaFromTheEnvironment) {
  FakeDaemon daemon({.cert = Certs().server_cert, .key = Certs().server_key});
  ASSERT_TRUE(daemon.started());
  ScopedEnv ca("KOMPUTED_TLS_CA", Certs().ca);
  EXPECT_FALSE(KpErrorOf([&] { kp::Manager mgr(RemoteTo(daemon.address())); }).has_value());
  EXPECT_EQ(daemon.calls().size(), 2u);  // OpenSession, CloseSession
}

TEST_F(TlsTest, WrongCaFailsWithAClearError) {
  FakeDaemon daemon({.cert = Certs().server_cert, .key = Certs().server_key});
  ASSERT_TRUE(daemon.started());
  kp::Remote remote = RemoteTo(daemon.address());
  remote.tlsCa = Certs().other_ca;
  auto e = KpErrorOf([&] { kp::Manager mgr(remote); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kUnavailable);
  EXPECT_THAT(e->what(), AllOf(HasSubstr(daemon.address()), HasSubstr("KOMPUTED_TLS_CA")));
  EXPECT_TRUE(daemon.calls().empty());
}

TEST_F(TlsTest, ClientCertificateIsPresentedWhereTheDaemonRequiresOne) {
  FakeDaemon daemon(
      {.cert = Certs().server_cert, .key = Certs().server_key, .client_ca = Certs().ca});
  ASSERT_TRUE(daemon.started());
  kp::Remote remote = RemoteTo(daemon.address());
  remote.tlsCa = Certs().ca;
  {
    auto e = KpErrorOf([&] { kp::Manager mgr(remote); });  // no client certificate
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), kp::ErrorCode::kUnavailable);
    EXPECT_THAT(e->what(), HasSubstr("KOMPUTED_TLS_CERT"));
  }
  remote.tlsCert = Certs().client_cert;
  remote.tlsKey = Certs().client_key;
  { kp::Manager mgr(remote); }
  const std::vector<Call> opens = daemon.CallsOf("OpenSession");
  ASSERT_EQ(opens.size(), 1u);
  EXPECT_EQ(opens[0].client_cn, "ci-runner");
}

TEST_F(TlsTest, CertificateWithoutKeyNamesBoth) {
  ScopedEnv cert("KOMPUTED_TLS_CERT", Certs().client_cert);
  ScopedEnv ca("KOMPUTED_TLS_CA", Certs().ca);
  auto e = KpErrorOf([&] { kp::Manager mgr(RemoteTo("127.0.0.1:1")); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kInvalidArgument);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("KOMPUTED_TLS_CERT"), HasSubstr("KOMPUTED_TLS_KEY")));

  kp::Remote remote = RemoteTo("127.0.0.1:1");
  remote.tlsKey = Certs().client_key;  // the certificate from the environment, the key from code
  remote.tlsCert = "";
  {
    ScopedEnv no_cert("KOMPUTED_TLS_CERT", std::nullopt);
    e = KpErrorOf([&] { kp::Manager mgr(remote); });
    ASSERT_TRUE(e.has_value());
    EXPECT_THAT(e->what(), AllOf(HasSubstr("kp::Remote::tlsKey"), HasSubstr("KOMPUTED_TLS_CERT"),
                                 HasSubstr("KOMPUTED_TLS_KEY")));
  }
}

TEST_F(TlsTest, ClientCertificateWithoutCaIsAnError) {
  kp::Remote remote = RemoteTo("127.0.0.1:1");
  remote.tlsCert = Certs().client_cert;
  remote.tlsKey = Certs().client_key;
  auto e = KpErrorOf([&] { kp::Manager mgr(remote); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kInvalidArgument);
  EXPECT_THAT(e->what(), HasSubstr("KOMPUTED_TLS_CA"));
}

TEST_F(TlsTest, UnreadableOrNonPemFilesNameTheSettingAndThePath) {
  const std::string missing = dir_.Path("missing.pem");
  {
    ScopedEnv ca("KOMPUTED_TLS_CA", missing);
    auto e = KpErrorOf([&] { kp::Manager mgr(RemoteTo("127.0.0.1:1")); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), kp::ErrorCode::kFailedPrecondition);
    EXPECT_THAT(e->what(), AllOf(HasSubstr("KOMPUTED_TLS_CA"), HasSubstr(missing)));
  }
  kp::Remote remote = RemoteTo("127.0.0.1:1");
  remote.tlsCa = Certs().ca;
  remote.tlsCert = Certs().client_cert;
  remote.tlsKey = dir_.Write("key.txt", "not a key\n");
  auto e = KpErrorOf([&] { kp::Manager mgr(remote); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kFailedPrecondition);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("kp::Remote::tlsKey"), HasSubstr(remote.tlsKey),
                               HasSubstr("not a PEM file")));
}

// ---- komputectl

// Runs komputectl with `args` (its environment: this process's).
int Komputectl(std::vector<std::string> args, std::string* out, std::string* err) {
  args.insert(args.begin(), komputed::test_support::KomputectlBinary());
  return komputed::test_support::RunProgram(args, out, err);
}

TEST_F(CredentialsTest, KomputectlFlagsReachTheDaemonAndWinOverTheEnvironment) {
  FakeDaemon daemon;
  ASSERT_TRUE(daemon.started());
  ScopedEnv env_token("KOMPUTED_TOKEN", "from-env");
  std::string out, err;
  EXPECT_EQ(Komputectl({"--address=" + daemon.address(), "sessions"}, &out, &err), 0) << err;
  EXPECT_EQ(daemon.CallsOf("ListSessions", 1)[0].authorization, "Bearer from-env");
  EXPECT_EQ(
      Komputectl({"--address=" + daemon.address(), "--token=from-flag", "sessions"}, &out, &err), 0)
      << err;
  EXPECT_EQ(daemon.CallsOf("ListSessions", 2)[1].authorization, "Bearer from-flag");
  const std::string file = dir_.Write("token", "from-flag-file\n");
  EXPECT_EQ(
      Komputectl({"--address=" + daemon.address(), "--token_file=" + file, "devices"}, &out, &err),
      0)
      << err;
  EXPECT_EQ(daemon.CallsOf("ListDevices", 1)[0].authorization, "Bearer from-flag-file");
  // bench goes through kp::Manager after its pings: the same token on both paths.
  EXPECT_EQ(Komputectl({"--address=" + daemon.address(), "--token_file=" + file, "bench",
                        "--seconds=0", "--megabytes=0"},
                       &out, &err),
            0)
      << err;
  EXPECT_EQ(daemon.CallsOf("Ping", 1)[0].authorization, "Bearer from-flag-file");
  EXPECT_EQ(daemon.CallsOf("OpenSession", 1)[0].authorization, "Bearer from-flag-file");
}

TEST_F(CredentialsTest, KomputectlUnauthenticatedSaysWhatToPass) {
  FakeDaemon daemon({.required_token = "right"});
  ASSERT_TRUE(daemon.started());
  std::string out, err;
  EXPECT_EQ(Komputectl({"--address=" + daemon.address(), "--token=wrong", "sessions"}, &out, &err),
            1);
  EXPECT_THAT(err, AllOf(HasSubstr("komputectl: error: "), HasSubstr("no known bearer token"),
                         HasSubstr("--token"), HasSubstr("--token_file")));
  // Through kp (run): the variables, which komputectl reads as well.
  EXPECT_NE(Komputectl({"--address=" + daemon.address(), "run", "--shader=/dev/null",
                        "--tensors=float32:zeros:4"},
                       &out, &err),
            0);
  EXPECT_THAT(err, AllOf(HasSubstr("komputectl: error: "), HasSubstr("KOMPUTED_TOKEN")));
  ASSERT_EQ(Komputectl({"--address=" + daemon.address(), "--token_file=" + dir_.Path("missing"),
                        "sessions"},
                       &out, &err),
            1);
  EXPECT_THAT(err, AllOf(HasSubstr("--token_file"), HasSubstr(dir_.Path("missing"))));
}

TEST_F(TlsTest, KomputectlTlsFlagsPresentTheClientCertificate) {
  FakeDaemon daemon(
      {.cert = Certs().server_cert, .key = Certs().server_key, .client_ca = Certs().ca});
  ASSERT_TRUE(daemon.started());
  std::string out, err;
  EXPECT_EQ(Komputectl(
                {"--address=" + daemon.address(), "--tls_ca=" + Certs().ca,
                 "--tls_cert=" + Certs().client_cert, "--tls_key=" + Certs().client_key, "devices"},
                &out, &err),
            0)
      << err;
  EXPECT_THAT(out, HasSubstr("fake device"));
  EXPECT_EQ(daemon.CallsOf("ListDevices")[0].client_cn, "ci-runner");

  EXPECT_NE(Komputectl({"--address=" + daemon.address(), "--tls_ca=" + Certs().ca, "devices"}, &out,
                       &err),
            0);
  EXPECT_THAT(err, HasSubstr("--tls_cert"));
  EXPECT_NE(Komputectl({"--address=" + daemon.address(), "--tls_ca=" + Certs().ca,
                        "--tls_cert=" + Certs().client_cert, "devices"},
                       &out, &err),
            0);
  EXPECT_THAT(err, AllOf(HasSubstr("--tls_cert"), HasSubstr("KOMPUTED_TLS_KEY")));
}

TEST_F(TlsTest, PlainClientOfATlsDaemonIsToldToSetTheCa) {
  FakeDaemon daemon({.cert = Certs().server_cert, .key = Certs().server_key});
  ASSERT_TRUE(daemon.started());
  auto e = KpErrorOf([&] { kp::Manager mgr(RemoteTo(daemon.address())); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kUnavailable);
  EXPECT_THAT(e->what(), HasSubstr("set KOMPUTED_TLS_CA"));
}

TEST_F(TlsTest, TlsClientOfAPlainDaemonIsToldItDoesNotServeTls) {
  FakeDaemon daemon;
  ASSERT_TRUE(daemon.started());
  kp::Remote remote = RemoteTo(daemon.address());
  remote.tlsCa = Certs().ca;
  auto e = KpErrorOf([&] { kp::Manager mgr(remote); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), kp::ErrorCode::kUnavailable);
  EXPECT_THAT(e->what(), AllOf(HasSubstr("does not serve TLS"), HasSubstr("KOMPUTED_TLS_CA")));
}

}  // namespace
}  // namespace kptest

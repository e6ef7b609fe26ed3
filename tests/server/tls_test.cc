// Transport security: a TLS daemon refuses plain-text clients and clients that do not trust its
// CA; under mutual TLS a client without a certificate, or with one of another CA, is refused,
// and a verified certificate names the tenant. Bad TLS files stop the daemon from starting.
#include <grpcpp/security/credentials.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "support/test_certs.h"
#include "tenant_client.h"
#include "test_options.h"

namespace komputed::server::testing {
namespace {

using test_support::TestCertificates;
using ::testing::HasSubstr;

// TLS client credentials trusting `ca`, presenting `cert`/`key` when given.
std::shared_ptr<grpc::ChannelCredentials> TlsClient(const std::string& ca,
                                                    const std::string& cert = "",
                                                    const std::string& key = "") {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = TestCertificates::Read(ca);
  if (!cert.empty()) {
    options.pem_cert_chain = TestCertificates::Read(cert);
    options.pem_private_key = TestCertificates::Read(key);
  }
  return grpc::SslCredentials(options);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(certs_.ok()) << certs_.status(); }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  void Start(bool mutual, const std::string& tenants_file = "",
             const std::string& health_listen = "") {
    ServerOptions options = TestServerOptions();
    options.listen = "127.0.0.1:0";
    options.health_listen = health_listen;
    options.tls_cert = certs_.server_cert();
    options.tls_key = certs_.server_key();
    if (mutual) options.tls_client_ca = certs_.ca();
    options.tenants_file = tenants_file;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("localhost:", server_->port());
  }
  std::unique_ptr<Stubs> Connect(std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 const std::string& authorization = "") {
    return std::make_unique<Stubs>(
        AuthorizedChannel(address_, authorization, std::move(credentials)));
  }
  // OpenSession bounded to a few seconds (a failing handshake is retried until the deadline).
  static grpc::Status OpenWithin(Stubs& c, std::string* id = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::OpenSessionRequest req;
    v1::OpenSessionResponse resp;
    grpc::Status s = c.sessions->OpenSession(&ctx, req, &resp);
    if (id != nullptr) *id = resp.session_id();
    return s;
  }

  TestCertificates certs_;
  std::unique_ptr<Server> server_;
  std::string address_;
};

TEST_F(TlsTest, ServesOnlyClientsThatSpeakTlsAndTrustItsCa) {
  Start(/*mutual=*/false);
  auto plain = Connect(grpc::InsecureChannelCredentials());
  grpc::Status refused = OpenWithin(*plain);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  auto wrong_ca = Connect(TlsClient(certs_.other_ca()));
  EXPECT_FALSE(OpenWithin(*wrong_ca).ok());
  auto good = Connect(TlsClient(certs_.ca()));
  EXPECT_THAT(OpenWithin(*good), IsOk());
}

TEST_F(TlsTest, MutualTlsNeedsACertificateOfTheTrustedCa) {
  Start(/*mutual=*/true);
  auto anonymous = Connect(TlsClient(certs_.ca()));
  EXPECT_FALSE(OpenWithin(*anonymous).ok());
  auto stranger =
      Connect(TlsClient(certs_.ca(), certs_.other_client_cert(), certs_.other_client_key()));
  EXPECT_FALSE(OpenWithin(*stranger).ok());

  // Without a tenants file, the certificate's CN is the tenant.
  auto runner = Connect(TlsClient(certs_.ca(), certs_.client_cert(), certs_.client_key()));
  std::string id;
  ASSERT_THAT(OpenWithin(*runner, &id), IsOk());
  const v1::ListSessionsResponse list = List(*runner);
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).tenant(), "ci-runner");
  EXPECT_EQ(list.sessions(0).session_id(), id);
}

TEST_F(TlsTest, ACertificateNameOrATokenNamesATenantOfTheFile) {
  TenantsDir tenants;
  tenants.Write(absl::StrCat("tenants:\n", Entry("alice"),
                             "  - name: ci\n    certificate_names: [ci.example.org]\n"));
  Start(/*mutual=*/true, tenants.path());
  auto ci = Connect(TlsClient(certs_.ca(), certs_.client_cert(), certs_.client_key()));
  std::string id;
  ASSERT_THAT(OpenWithin(*ci, &id), IsOk());
  EXPECT_EQ(List(*ci).sessions(0).tenant(), "ci");
  // A token wins over the certificate: the same connection, as alice, does not see ci's session.
  auto alice = Connect(TlsClient(certs_.ca(), certs_.client_cert(), certs_.client_key()),
                       Bearer(Token("alice")));
  EXPECT_THAT(OpenWithin(*alice), IsOk());
  const v1::ListSessionsResponse mine = List(*alice);
  ASSERT_EQ(mine.sessions_size(), 1);
  EXPECT_EQ(mine.sessions(0).tenant(), "alice");
  EXPECT_THAT(KeepAlive(*alice, id), HasCode(grpc::StatusCode::NOT_FOUND));
}

TEST_F(TlsTest, CertificateOfNoTenantIsUnauthenticated) {
  TenantsDir tenants;
  tenants.Write(absl::StrCat("tenants:\n", Entry("alice")));
  Start(/*mutual=*/true, tenants.path());
  auto runner = Connect(TlsClient(certs_.ca(), certs_.client_cert(), certs_.client_key()));
  grpc::Status s = OpenWithin(*runner);
  EXPECT_THAT(s, HasCode(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_THAT(s.error_message(), HasSubstr("ci-runner"));
}

// Kubernetes' gRPC probes speak no TLS: the health-only port answers them in plain text.
TEST_F(TlsTest, AHealthOnlyPortAnswersPlainTextProbes) {
  Start(/*mutual=*/true, "", "127.0.0.1:0");
  ASSERT_FALSE(server_->health_address().empty());
  auto channel = grpc::CreateChannel(server_->health_address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_THAT(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp), IsOk());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // It serves nothing else.
  Stubs plain(channel);
  grpc::ClientContext list_ctx;
  v1::ListDevicesResponse devices;
  EXPECT_THAT(plain.devices->ListDevices(&list_ctx, v1::ListDevicesRequest(), &devices),
              HasCode(grpc::StatusCode::UNIMPLEMENTED));
  server_->Shutdown();
  grpc::ClientContext after;
  grpc::Status gone = health->Check(&after, grpc::health::v1::HealthCheckRequest(), &resp);
  EXPECT_TRUE(!gone.ok() || resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

TEST_F(TlsTest, BadTlsFilesStopTheStartWithTheFlagNamed) {
  struct Case {
    std::string cert, key, client_ca, expected;
  };
  const std::string missing = certs_.dir() + "/missing.pem";
  for (const Case& c : std::vector<Case>{
           {certs_.server_cert(), "", "", "--tls_cert and --tls_key go together"},
           {"", certs_.server_key(), "", "--tls_cert and --tls_key go together"},
           {"", "", certs_.ca(), "--tls_client_ca needs TLS"},
           {missing, certs_.server_key(), "", "--tls_cert=" + missing + ": cannot be opened"},
           {certs_.server_key(), certs_.server_key(), "", "not a PEM certificate"},
           {certs_.server_cert(), certs_.server_cert(), "",
            "--tls_key=" + certs_.server_cert() + ": not a PEM private key"},
           {certs_.server_cert(), certs_.server_key(), missing, "--tls_client_ca="},
       }) {
    ServerOptions options = TestServerOptions();
    options.listen = "127.0.0.1:0";
    options.tls_cert = c.cert;
    options.tls_key = c.key;
    options.tls_client_ca = c.client_ca;
    auto refused = Server::Start(options);
    ASSERT_FALSE(refused.ok()) << c.expected;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr(c.expected));
  }
}

}  // namespace
}  // namespace komputed::server::testing

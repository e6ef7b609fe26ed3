// The real daemon, secured: the Kompute example runs against it over mutual TLS with a token, set
// only through KOMPUTED_* variables; without the credentials it fails and says what to set. The
// daemon refuses to listen off loopback without authentication, reads its tenants file again on
// SIGHUP, and logs authentication failures without the token, at most about one line a second.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "support/daemon_process.h"
#include "support/process.h"
#include "support/test_certs.h"

namespace {

using komputed::test_support::DaemonProcess;
using komputed::test_support::KomputedBinary;
using komputed::test_support::RunProgram;
using komputed::test_support::TestCertificates;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ExampleProgram() {
  const char* value = std::getenv("ARRAY_MULTIPLICATION");
  return value != nullptr && value[0] != '\0' ? value : ARRAY_MULTIPLICATION;
}

// SHA-256 hex of `text`, by the sha256sum command (as the README tells operators to make it).
std::string Sha256Hex(const std::string& text) {
  std::string out, err;
  RunProgram({"/bin/sh", "-c", "printf %s \"$1\" | sha256sum | cut -d' ' -f1", "sh", text}, &out,
             &err);
  return std::string(absl::StripAsciiWhitespace(out));
}

class SecureDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certs_.ok()) << certs_.status();
    tenants_ = certs_.dir() + "/tenants.yaml";
    token_file_ = certs_.dir() + "/alice.token";
    std::ofstream(token_file_) << "alice-secret-token\n";
    WriteTenants({{"alice", "alice-secret-token"}});
  }
  void WriteTenants(const std::vector<std::pair<std::string, std::string>>& tenants) {
    std::string yaml = "tenants:\n  - name: ci\n    certificate_names: [ci.example.org]\n";
    for (const auto& [name, token] : tenants) {
      absl::StrAppend(&yaml, "  - name: ", name, "\n    token_sha256: ", Sha256Hex(token), "\n");
    }
    const std::string tmp = tenants_ + ".new";
    std::ofstream(tmp) << yaml;
    std::filesystem::rename(tmp, tenants_);
  }
  std::unique_ptr<DaemonProcess> StartDaemon() {
    auto daemon = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--tls_cert=" + certs_.server_cert(), "--tls_key=" + certs_.server_key(),
        "--tls_client_ca=" + certs_.ca(), "--tenants_file=" + tenants_});
    EXPECT_TRUE(daemon->started());
    return daemon;
  }
  // Runs the example with these variables set (and KOMPUTED_ADDRESS); its exit code.
  int RunExample(const DaemonProcess& daemon, const std::vector<std::string>& env, std::string* out,
                 std::string* err) {
    std::vector<std::string> argv = {"/usr/bin/env",        "-u",
                                     "KOMPUTED_TOKEN",      "-u",
                                     "KOMPUTED_TOKEN_FILE", "KOMPUTED_ADDRESS=" + daemon.address()};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(ExampleProgram());
    return RunProgram(argv, out, err, absl::Seconds(120));
  }

  TestCertificates certs_;
  std::string tenants_;
  std::string token_file_;
};

TEST_F(SecureDaemonTest, TheExampleRunsOverMutualTlsWithAToken) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->started());
  const std::vector<std::string> tls = {"KOMPUTED_TLS_CA=" + certs_.ca(),
                                        "KOMPUTED_TLS_CERT=" + certs_.client_cert(),
                                        "KOMPUTED_TLS_KEY=" + certs_.client_key()};
  std::string out, err;
  std::vector<std::string> env = tls;
  env.push_back("KOMPUTED_TOKEN_FILE=" + token_file_);
  ASSERT_EQ(RunExample(*daemon, env, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("out_a: 4 8 12"));
  EXPECT_THAT(out, HasSubstr("out_b: 10 10 10"));
  // The certificate alone names the tenant "ci".
  ASSERT_EQ(RunExample(*daemon, tls, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("out_a: 4 8 12"));
  EXPECT_THAT(daemon->Log(), HasSubstr("for tenant alice"));
  EXPECT_THAT(daemon->Log(), HasSubstr("for tenant ci"));

  // A wrong token: refused, and the message says what to set.
  env = tls;
  env.push_back("KOMPUTED_TOKEN=not-the-token");
  EXPECT_NE(RunExample(*daemon, env, &out, &err), 0);
  EXPECT_THAT(err, HasSubstr("KOMPUTED_TOKEN"));
  EXPECT_THAT(daemon->Log(), Not(HasSubstr("not-the-token")));
  EXPECT_THAT(daemon->Log(), Not(HasSubstr("alice-secret-token")));
  // No client certificate: the handshake fails, and the message says what to set.
  EXPECT_NE(
      RunExample(*daemon, {"KOMPUTED_TLS_CA=" + certs_.ca(), "KOMPUTED_TOKEN_FILE=" + token_file_},
                 &out, &err),
      0);
  EXPECT_THAT(err, HasSubstr("KOMPUTED_TLS_CERT"));
  // Plain text against the TLS daemon.
  EXPECT_NE(RunExample(*daemon, {"KOMPUTED_TOKEN_FILE=" + token_file_}, &out, &err), 0);
  EXPECT_THAT(err, HasSubstr("KOMPUTED_TLS_CA"));
}

TEST_F(SecureDaemonTest, SighupGrantsAndRevokes) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->started());
  const std::vector<std::string> bob = {
      "KOMPUTED_TLS_CA=" + certs_.ca(), "KOMPUTED_TLS_CERT=" + certs_.client_cert(),
      "KOMPUTED_TLS_KEY=" + certs_.client_key(), "KOMPUTED_TOKEN=bob-token"};
  std::string out, err;
  EXPECT_NE(RunExample(*daemon, bob, &out, &err), 0);
  WriteTenants({{"alice", "alice-secret-token"}, {"bob", "bob-token"}});
  ASSERT_EQ(kill(daemon->pid(), SIGHUP), 0);
  ASSERT_TRUE(daemon->WaitForLog("SIGHUP received", absl::Seconds(10)));
  ASSERT_TRUE(daemon->WaitForLog("3 tenant(s)", absl::Seconds(10))) << daemon->Log();
  EXPECT_EQ(RunExample(*daemon, bob, &out, &err), 0) << err;
  EXPECT_THAT(daemon->Log(), HasSubstr("for tenant bob"));
}

TEST_F(SecureDaemonTest, AuthenticationFailuresAreLoggedAtMostAboutOnceASecond) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->started());
  const std::vector<std::string> wrong = {
      "KOMPUTED_TLS_CA=" + certs_.ca(), "KOMPUTED_TLS_CERT=" + certs_.client_cert(),
      "KOMPUTED_TLS_KEY=" + certs_.client_key(), "KOMPUTED_TOKEN=guess"};
  std::string out, err;
  const absl::Time start = absl::Now();
  int tries = 0;
  for (; tries < 6; ++tries) EXPECT_NE(RunExample(*daemon, wrong, &out, &err), 0);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string log = daemon->Log();
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "authentication failed (unknown_token)")) {
      ++lines;
      EXPECT_THAT(std::string(line), HasSubstr("127.0.0.1"));  // the peer
    }
  }
  EXPECT_GE(lines, 1) << log;
  EXPECT_LE(lines, static_cast<int>(seconds) + 1) << log;
  EXPECT_THAT(log, Not(HasSubstr("guess")));
}

TEST(SecureByDefault, OffLoopbackWithoutAuthenticationRefusesToStart) {
  std::string out, err;
  const int code =
      RunProgram({KomputedBinary(), "--listen=0.0.0.0:0", "--metrics_listen=", "--log_level=info"},
                 &out, &err, absl::Seconds(60));
  EXPECT_EQ(code, 1);
  std::vector<std::string> lines = absl::StrSplit(err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], HasSubstr("--tenants_file"));
  EXPECT_THAT(lines[0], HasSubstr("--insecure"));

  DaemonProcess insecure({"--listen=0.0.0.0:0", "--insecure"});
  ASSERT_TRUE(insecure.started());
  EXPECT_THAT(insecure.Log(), HasSubstr("--insecure: anyone who can reach the port"));
}

}  // namespace

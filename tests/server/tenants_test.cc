// Tests of tenants.h: parsing the tenants file, tokens, certificate names, reloading.

#include "tenants.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/status_matchers.h"
#include "tenant_client.h"

namespace komputed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string TokenLine(absl::string_view token) {
  return "token_sha256: " + HexDigest(Sha256(token));
}

using TenantsFile = testing::TenantsDir;  // tenant_client.h

TEST(Tenants, Sha256IsTheStandardOne) {
  // sha256("test"), as sha256sum prints it.
  EXPECT_EQ(HexDigest(Sha256("test")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
}

TEST(Tenants, ParsesTokensAdminsCertificatesAndQuotas) {
  Quota defaults;
  defaults.sessions = 8;
  defaults.tensor_bytes = 1 << 20;
  const std::string yaml =
      "tenants:\n"
      "  - name: alice\n"
      "    " +
      TokenLine("alice-token") +
      "\n"
      "    quota: {device_memory_bytes: 8589934592, sessions: 4}\n"
      "  - name: ops\n"
      "    " +
      TokenLine("ops-token") +
      "\n"
      "    admin: true\n"
      "  - name: ci\n"
      "    certificate_names: [ci.example.org, ci-runner]\n";
  ASSERT_OK_AND_ASSIGN(std::vector<Tenant> tenants, ParseTenants(yaml, defaults));
  ASSERT_EQ(tenants.size(), 3u);
  EXPECT_EQ(tenants[0].name, "alice");
  EXPECT_TRUE(tenants[0].has_token);
  EXPECT_FALSE(tenants[0].admin);
  EXPECT_EQ(tenants[0].quota.device_memory_bytes, 8589934592u);
  EXPECT_EQ(tenants[0].quota.sessions, 4u);
  EXPECT_EQ(tenants[0].quota.tensor_bytes, 1u << 20);  // the default
  EXPECT_TRUE(tenants[1].admin);
  EXPECT_EQ(tenants[1].quota.sessions, 8u);
  EXPECT_FALSE(tenants[2].has_token);
  EXPECT_THAT(tenants[2].certificate_names, ElementsAre("ci.example.org", "ci-runner"));
}

TEST(Tenants, ATenantWithoutTokenIsNamedByItsCertificate) {
  ASSERT_OK_AND_ASSIGN(std::vector<Tenant> tenants,
                       ParseTenants("tenants: [{name: lab.example.org}]", Quota{}));
  EXPECT_THAT(tenants[0].certificate_names, ElementsAre("lab.example.org"));
}

TEST(Tenants, MalformedFilesSayWhatIsWrong) {
  struct Case {
    std::string yaml;
    std::string message;
  };
  const std::string token = TokenLine("x");
  const std::vector<Case> cases = {
      {"tenants: [", "tenants file"},
      {"users: []", "needs a \"tenants\" list"},
      {"tenants: {alice: 1}", "must be a list"},
      {"tenants: [{" + token + "}]", "tenant #1: needs a name"},
      {"tenants: [{name: 'a b', " + token + "}]", "must be 1 to 63 letters"},
      {"tenants: [{name: a, token_sha256: abc}]", "tenant a: token_sha256 must be 64 hex digits"},
      {"tenants: [{name: a, " + token + "}, {name: a, " + TokenLine("y") + "}]",
       "tenant a: is listed twice"},
      {"tenants: [{name: a, " + token + "}, {name: b, " + token + "}]",
       "tenant b: has a token that is listed already"},
      {"tenants: [{name: a, " + token + ", admin: maybe}]", "admin must be true or false"},
      {"tenants: [{name: a, " + token + ", quota: {sessions: -1}}]",
       "tenant a: quota.sessions: must be a non-negative integer"},
      {"tenants: [{name: a, " + token + ", quota: {gpus: 1}}]", "unknown quota \"gpus\""},
      {"tenants: [{name: a, " + token + ", role: admin}]", "unknown field \"role\""},
      {"tenants: [{name: a, " + token + "}, {name: b, certificate_names: [a]}]",
       "certificate name \"a\" already names tenant a"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseTenants(c.yaml, Quota{}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.yaml;
  }
}

TEST(Tenants, TokensAndCertificateNamesFindTheirTenant) {
  TenantsFile file;
  file.Write("tenants:\n  - {name: alice, " + TokenLine("alice-token") +
             "}\n  - {name: ci, certificate_names: [ci.example.org]}\n");
  ASSERT_OK_AND_ASSIGN(auto registry, TenantRegistry::Create(file.path(), Quota{}));
  ASSERT_NE(registry->ByToken("alice-token"), nullptr);
  EXPECT_EQ(registry->ByToken("alice-token")->name, "alice");
  EXPECT_EQ(registry->ByToken("alice-token "), nullptr);
  EXPECT_EQ(registry->ByToken(""), nullptr);
  // A tenant known by certificate has no token: no token finds it.
  EXPECT_EQ(registry->ByToken(std::string(64, '0')), nullptr);
  ASSERT_NE(registry->ByName("ci.example.org"), nullptr);
  EXPECT_EQ(registry->ByName("ci.example.org")->name, "ci");
  EXPECT_EQ(registry->ByName("nobody"), nullptr);
  // A tenant known by its token is not found by a certificate that merely bears its name.
  EXPECT_EQ(registry->ByName("alice"), nullptr);
  EXPECT_THAT(registry->Names(), UnorderedElementsAre("alice", "ci"));
}

TEST(Tenants, ATenantMayHaveSeveralTokensWhileOneIsRotated) {
  TenantsFile file;
  file.Write("tenants:\n  - name: alice\n    token_sha256: [" + HexDigest(Sha256("old-token")) +
             ", " + HexDigest(Sha256("new-token")) + "]\n");
  ASSERT_OK_AND_ASSIGN(auto registry, TenantRegistry::Create(file.path(), Quota{}));
  ASSERT_NE(registry->ByToken("old-token"), nullptr);
  ASSERT_NE(registry->ByToken("new-token"), nullptr);
  EXPECT_EQ(registry->ByToken("new-token")->name, "alice");
  file.Write("tenants:\n  - name: alice\n    token_sha256: [" + HexDigest(Sha256("new-token")) +
             "]\n");
  ASSERT_OK(registry->Reload());
  EXPECT_EQ(registry->ByToken("old-token"), nullptr);
  EXPECT_NE(registry->ByToken("new-token"), nullptr);
  EXPECT_THAT(ParseTenants("tenants: [{name: a, token_sha256: []}]", Quota{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 8 hashes")));
}

TEST(Tenants, AChangedFileGrantsAndRevokesWithoutARestart) {
  TenantsFile file;
  file.Write("tenants: [{name: alice, " + TokenLine("old") + "}]\n");
  ASSERT_OK_AND_ASSIGN(auto registry, TenantRegistry::Create(file.path(), Quota{}));
  EXPECT_FALSE(registry->Poll());  // unchanged
  file.Write("tenants: [{name: alice, " + TokenLine("new") + "}, {name: bob, " + TokenLine("bob") +
             "}]\n");
  EXPECT_TRUE(registry->Poll());
  EXPECT_EQ(registry->ByToken("old"), nullptr);
  ASSERT_NE(registry->ByToken("new"), nullptr);
  ASSERT_NE(registry->ByToken("bob"), nullptr);
  EXPECT_EQ(registry->generation(), 2u);
}

TEST(Tenants, AMalformedChangeKeepsTheTenantsInForce) {
  TenantsFile file;
  file.Write("tenants: [{name: alice, " + TokenLine("alice") + "}]\n");
  ASSERT_OK_AND_ASSIGN(auto registry, TenantRegistry::Create(file.path(), Quota{}));
  file.Write("tenants: [{name: alice, token_sha256: nothex}]\n");
  EXPECT_THAT(registry->Reload(), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("token_sha256 must be 64 hex digits")));
  EXPECT_NE(registry->ByToken("alice"), nullptr);
  EXPECT_EQ(registry->generation(), 1u);
  std::filesystem::remove(file.path());
  EXPECT_THAT(registry->Reload(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_NE(registry->ByToken("alice"), nullptr);
}

TEST(Tenants, AMissingFileFailsCreation) {
  EXPECT_THAT(TenantRegistry::Create("/nonexistent/tenants.yaml", Quota{}).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/tenants.yaml")));
}

}  // namespace
}  // namespace komputed::server

// ResolveTarget: the daemons that a gRPC target names, with DNS answered by a fake lookup.

#include "remote/target.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "support/status_matchers.h"

namespace kp::internal::remote {
namespace {

using komputed::StatusIs;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A lookup answering from a table; a name not in it fails as an unknown host does. Records the
// names asked for.
struct FakeDns {
  std::map<std::string, std::vector<std::string>> table;
  std::vector<std::string> asked;

  HostLookup Lookup() {
    return [this](const std::string& host) -> absl::StatusOr<std::vector<std::string>> {
      asked.push_back(host);
      auto it = table.find(host);
      if (it == table.end()) return absl::UnavailableError("no such host");
      return it->second;
    };
  }
};

std::vector<std::string> Targets(const std::vector<Endpoint>& endpoints) {
  std::vector<std::string> out;
  for (const Endpoint& e : endpoints) out.push_back(e.target);
  return out;
}

TEST(ResolveTarget, AnIpv4ListIsEachAddress) {
  FakeDns dns;
  absl::StatusOr<std::vector<Endpoint>> got =
      ResolveTarget("ipv4:127.0.0.1:5001,10.0.0.6:5002", dns.Lookup());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].target, "127.0.0.1:5001");
  EXPECT_EQ((*got)[0].name, "127.0.0.1:5001");
  EXPECT_EQ((*got)[0].host, "127.0.0.1");
  EXPECT_EQ((*got)[0].tls_name, "");
  EXPECT_EQ((*got)[1].name, "10.0.0.6:5002");
  EXPECT_EQ((*got)[1].host, "10.0.0.6");
  EXPECT_THAT(dns.asked, IsEmpty());
}

TEST(ResolveTarget, AnIpv6ListIsEachAddressInBrackets) {
  absl::StatusOr<std::vector<Endpoint>> got = ResolveTarget("ipv6:[::1]:5001,[fd00::6]:5002");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(Targets(*got), ElementsAre("[::1]:5001", "[fd00::6]:5002"));
  EXPECT_EQ((*got)[1].host, "fd00::6");
}

TEST(ResolveTarget, AListOfOneIsTheTargetItselfAndDuplicatesCountOnce) {
  absl::StatusOr<std::vector<Endpoint>> one = ResolveTarget("ipv4:127.0.0.1:5001");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].target, "ipv4:127.0.0.1:5001");
  EXPECT_EQ((*one)[0].name, "127.0.0.1:5001");
  absl::StatusOr<std::vector<Endpoint>> twice = ResolveTarget("ipv4:127.0.0.1:5001,127.0.0.1:5001");
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_THAT(Targets(*twice), ElementsAre("ipv4:127.0.0.1:5001,127.0.0.1:5001"));
}

TEST(ResolveTarget, ABadListEntryIsNamed) {
  EXPECT_THAT(ResolveTarget("ipv4:127.0.0.1:5001,gpu2:5002"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'gpu2:5002'")));
  EXPECT_THAT(ResolveTarget("ipv4:127.0.0.1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("with a port")));
  EXPECT_THAT(ResolveTarget("ipv4:127.0.0.1:99999"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("127.0.0.1:99999")));
  EXPECT_THAT(ResolveTarget("ipv4:127.0.0.1:5001,"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lists ''")));
  EXPECT_THAT(ResolveTarget("ipv6:::1:5001"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ipv6")));
  EXPECT_THAT(ResolveTarget("ipv6:[127.0.0.1]:5001"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ipv6")));
  EXPECT_THAT(ResolveTarget(""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ResolveTarget, ADnsNameIsEveryAddressItResolvesTo) {
  FakeDns dns;
  dns.table["komputed-headless.gpu.svc"] = {"10.0.0.5", "10.0.0.6", "10.0.0.5", "fd00::7"};
  for (const char* target :
       {"dns:///komputed-headless.gpu.svc:50051", "dns:komputed-headless.gpu.svc:50051",
        "komputed-headless.gpu.svc:50051"}) {
    SCOPED_TRACE(target);
    absl::StatusOr<std::vector<Endpoint>> got = ResolveTarget(target, dns.Lookup());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(Targets(*got), ElementsAre("10.0.0.5:50051", "10.0.0.6:50051", "[fd00::7]:50051"));
    EXPECT_THAT(*got, ::testing::Each(Field(&Endpoint::tls_name, "komputed-headless.gpu.svc")));
    EXPECT_EQ((*got)[2].host, "fd00::7");
  }
  EXPECT_EQ(dns.asked.size(), 3u);
}

TEST(ResolveTarget, ADnsNameWithoutAPortTakesGrpcsDefault) {
  FakeDns dns;
  dns.table["gpus.example.org"] = {"10.0.0.5", "10.0.0.6"};
  absl::StatusOr<std::vector<Endpoint>> got =
      ResolveTarget("dns:///gpus.example.org", dns.Lookup());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(Targets(*got), ElementsAre("10.0.0.5:443", "10.0.0.6:443"));
}

TEST(ResolveTarget, ANameOfOneAddressOrOfThisHostOrOfNoneIsTheTargetItself) {
  FakeDns dns;
  dns.table["gpu1.example.org"] = {"10.0.0.5"};
  dns.table["localhost"] = {"::1", "127.0.0.1"};
  for (const std::string target :
       {"gpu1.example.org:50051", "dns:///gpu1.example.org:50051", "localhost:50051",
        "dns:///localhost:50051", "nowhere.invalid:50051"}) {
    SCOPED_TRACE(target);
    absl::StatusOr<std::vector<Endpoint>> got = ResolveTarget(target, dns.Lookup());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].target, target);
    EXPECT_EQ((*got)[0].tls_name, "");
  }
  absl::StatusOr<std::vector<Endpoint>> local = ResolveTarget("localhost:50051", dns.Lookup());
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)[0].name, "localhost:50051");
  EXPECT_EQ((*local)[0].host, "localhost");
}

TEST(ResolveTarget, OneDaemonTargetsAreNotLookedUp) {
  FakeDns dns;
  for (const std::string target :
       {"127.0.0.1:50051", "[::1]:50051", "unix:/run/komputed/komputed.sock",
        "unix:///run/komputed/komputed.sock", "unix-abstract:komputed", "dns://10.0.0.53/gpus:1",
        "xds:///komputed", "dns:///10.0.0.5:50051"}) {
    SCOPED_TRACE(target);
    absl::StatusOr<std::vector<Endpoint>> got = ResolveTarget(target, dns.Lookup());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].target, target);
  }
  EXPECT_THAT(dns.asked, IsEmpty());
  absl::StatusOr<std::vector<Endpoint>> unix_socket =
      ResolveTarget("unix:///run/komputed/komputed.sock");
  ASSERT_TRUE(unix_socket.ok());
  EXPECT_EQ((*unix_socket)[0].host, "/run/komputed/komputed.sock");
  absl::StatusOr<std::vector<Endpoint>> v6 = ResolveTarget("[::1]:50051");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ((*v6)[0].name, "[::1]:50051");
  EXPECT_EQ((*v6)[0].host, "::1");
}

TEST(ResolveTarget, TheRealLookupFindsThisHost) {
  absl::StatusOr<std::vector<std::string>> got = LookUpHost("localhost");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->empty());
}

}  // namespace
}  // namespace kp::internal::remote

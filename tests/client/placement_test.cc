// Placement across daemons: the selector and device choice as written, the choice among the
// devices that daemons report, and kp::Manager() and komputectl against real daemons started on
// free ports (each serving the machine's devices; lavapipe without a GPU) behind an ipv4: target.

#include "remote/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <functional>
#include <kompute/Kompute.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "komputed/v1/komputed.grpc.pb.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/process.h"
#include "support/scoped_env.h"
#include "support/status_matchers.h"
#include "support/stubs.h"
#include "support/test_certs.h"

namespace kp::internal::remote {
namespace {

namespace v1 = komputed::v1;
using komputed::StatusIs;
using komputed::test_support::DaemonProcess;
using komputed::test_support::FreeLoopbackPort;
using komputed::test_support::KomputectlBinary;
using komputed::test_support::RunProgram;
using komputed::test_support::Samples;
using komputed::test_support::ScopedEnv;
using komputed::test_support::Stubs;
using komputed::test_support::TestCertificates;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// ---------------------------------------------------------------------------------------------
// What the user writes

TEST(ParseSelector, TermsOfEachField) {
  absl::StatusOr<Selector> s =
      ParseSelector(" name~H200 , node=10.0.0.5,address=10.0.0.5:50051,NAME=x", "KOMPUTED_SELECT");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->terms.size(), 4u);
  EXPECT_EQ(s->terms[0].field, SelectorTerm::Field::kName);
  EXPECT_TRUE(s->terms[0].contains);
  EXPECT_EQ(s->terms[0].value, "H200");
  EXPECT_EQ(s->terms[0].origin, "KOMPUTED_SELECT");
  EXPECT_EQ(s->terms[1].ToString(), "node=10.0.0.5");
  EXPECT_EQ(s->terms[2].ToString(), "address=10.0.0.5:50051");
  EXPECT_EQ(s->terms[3].ToString(), "name=x");
  absl::StatusOr<Selector> empty = ParseSelector("  ", "KOMPUTED_SELECT");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->terms.empty());
}

TEST(ParseSelector, MalformedSelectorsAreInvalidArguments) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"H200", "the term 'H200' without '=' or '~'"},
      {"name~H200,", "an empty term"},
      {"name~H200,,node=a", "an empty term"},
      {"colour=red", "'colour', which is not a field"},
      {"name~", "no value for 'name'"},
      {"=H200", "'', which is not a field"},
  };
  for (const auto& [text, why] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseSelector(text, "KOMPUTED_SELECT"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("KOMPUTED_SELECT"), HasSubstr(text), HasSubstr(why))));
  }
}

TEST(ParseDeviceChoice, AnIndexOrADaemonsDevice) {
  absl::StatusOr<DeviceChoice> index = ParseDeviceChoice("3", "KOMPUTED_DEVICE");
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->daemon, "");
  EXPECT_EQ(index->index, 3u);
  absl::StatusOr<DeviceChoice> daemon = ParseDeviceChoice("10.0.0.5:50051/1", "KOMPUTED_DEVICE");
  ASSERT_TRUE(daemon.ok());
  EXPECT_EQ(daemon->daemon, "10.0.0.5:50051");
  EXPECT_EQ(daemon->index, 1u);
  for (const char* bad : {"", "gpu1", "-1", "1.5", "/1", "10.0.0.5:50051/", "a/b", "4294967296"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(ParseDeviceChoice(bad, "KOMPUTED_DEVICE"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KOMPUTED_DEVICE")));
  }
}

// ---------------------------------------------------------------------------------------------
// The choice among reported devices

Endpoint Daemon(const std::string& host, int port) {
  Endpoint e;
  e.host = host;
  e.name = absl::StrCat(host, ":", port);
  e.target = e.name;
  return e;
}

v1::DeviceInfo Device(uint32_t index, const std::string& name, uint64_t memory, uint64_t in_use,
                      uint32_t sessions, bool lost = false) {
  v1::DeviceInfo d;
  d.set_index(index);
  d.set_name(name);
  d.set_memory_bytes(memory);
  d.set_memory_in_use_bytes(in_use);
  d.set_sessions(sessions);
  d.set_lost(lost);
  return d;
}

DaemonReport Answered(const Endpoint& daemon, std::vector<v1::DeviceInfo> devices) {
  return DaemonReport{daemon, absl::OkStatus(), std::move(devices)};
}

PlacementRequest Request(const std::string& selector = "") {
  PlacementRequest r;
  r.address = "ipv4:10.0.0.5:50051,10.0.0.6:50051";
  r.address_origin = "KOMPUTED_ADDRESS";
  r.selector = *ParseSelector(selector, "KOMPUTED_SELECT");
  return r;
}

std::vector<std::string> Names(const std::vector<Placement>& placements) {
  std::vector<std::string> out;
  for (const Placement& p : placements)
    out.push_back(absl::StrCat(p.daemon.name, "/", p.device_index));
  return out;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;
const Endpoint kA = Daemon("10.0.0.5", 50051);
const Endpoint kB = Daemon("10.0.0.6", 50051);

TEST(BestDevices, TheMostFreeMemoryWinsWhateverTheSize) {
  // B's device is smaller but emptier.
  absl::StatusOr<std::vector<Placement>> best =
      BestDevices(Request(), {Answered(kA, {Device(0, "NVIDIA H200", 141 * kGiB, 130 * kGiB, 1),
                                            Device(1, "NVIDIA H200", 141 * kGiB, 100 * kGiB, 1)}),
                              Answered(kB, {Device(0, "NVIDIA L4", 24 * kGiB, 0, 0)})});
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_THAT(Names(*best), ElementsAre("10.0.0.5:50051/1"));
}

TEST(BestDevices, TiesGoToTheFewestSessionsThenAllTie) {
  absl::StatusOr<std::vector<Placement>> fewer = BestDevices(
      Request(),
      {Answered(kA, {Device(0, "gpu", 8 * kGiB, kGiB, 3)}),
       Answered(kB, {Device(0, "gpu", 8 * kGiB, kGiB, 2), Device(1, "gpu", 8 * kGiB, kGiB, 5)})});
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  EXPECT_THAT(Names(*fewer), ElementsAre("10.0.0.6:50051/0"));
  absl::StatusOr<std::vector<Placement>> tie =
      BestDevices(Request(), {Answered(kA, {Device(0, "gpu", 8 * kGiB, 0, 0)}),
                              Answered(kB, {Device(0, "gpu", 8 * kGiB, 0, 0)})});
  ASSERT_TRUE(tie.ok()) << tie.status();
  EXPECT_THAT(Names(*tie), UnorderedElementsAre("10.0.0.5:50051/0", "10.0.0.6:50051/0"));
}

TEST(BestDevices, LostDevicesAndSilentDaemonsAreSkipped) {
  absl::StatusOr<std::vector<Placement>> best =
      BestDevices(Request(), {Answered(kA, {Device(0, "gpu", 8 * kGiB, 0, 0, /*lost=*/true),
                                            Device(1, "gpu", 8 * kGiB, 4 * kGiB, 2)}),
                              DaemonReport{kB, absl::UnavailableError("connection refused"), {}}});
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_THAT(Names(*best), ElementsAre("10.0.0.5:50051/1"));
}

TEST(BestDevices, AnOverfullDeviceCountsAsNoFreeMemory) {
  absl::StatusOr<std::vector<Placement>> best =
      BestDevices(Request(), {Answered(kA, {Device(0, "gpu", 8 * kGiB, 9 * kGiB, 0)}),
                              Answered(kB, {Device(0, "gpu", 8 * kGiB, 8 * kGiB - 1, 9)})});
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_THAT(Names(*best), ElementsAre("10.0.0.6:50051/0"));
}

TEST(BestDevices, TheSelectorAndTheIndexNarrowTheChoice) {
  const std::vector<DaemonReport> reports = {
      Answered(kA, {Device(0, "NVIDIA L4", 24 * kGiB, 0, 0),
                    Device(1, "NVIDIA H200", 141 * kGiB, 140 * kGiB, 4)}),
      Answered(kB, {Device(0, "NVIDIA H200", 141 * kGiB, 141 * kGiB, 9)})};
  absl::StatusOr<std::vector<Placement>> h200 = BestDevices(Request("name~h200"), reports);
  ASSERT_TRUE(h200.ok()) << h200.status();
  EXPECT_THAT(Names(*h200), ElementsAre("10.0.0.5:50051/1"));
  PlacementRequest device0 = Request();
  device0.device_index = 0;
  absl::StatusOr<std::vector<Placement>> first = BestDevices(device0, reports);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(Names(*first), ElementsAre("10.0.0.5:50051/0"));
  PlacementRequest h200_device0 = Request("name=NVIDIA H200");
  h200_device0.device_index = 0;
  absl::StatusOr<std::vector<Placement>> both = BestDevices(h200_device0, reports);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_THAT(Names(*both), ElementsAre("10.0.0.6:50051/0"));
}

TEST(BestDevices, NothingMatchingIsNotFoundNamingEveryDaemon) {
  PlacementRequest request = Request("name~A100");
  request.device_index = 0;
  absl::StatusOr<std::vector<Placement>> none =
      BestDevices(request, {Answered(kA, {Device(0, "NVIDIA L4", 24 * kGiB, 0, 0)}),
                            Answered(kB, {Device(1, "NVIDIA A100", 80 * kGiB, 0, 0)})});
  EXPECT_THAT(none,
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("KOMPUTED_ADDRESS=ipv4:10.0.0.5:50051,10.0.0.6:50051"),
                             HasSubstr("device 0, name~A100 (KOMPUTED_SELECT)"),
                             HasSubstr("10.0.0.5:50051: device 0 (NVIDIA L4) is not name~A100"),
                             HasSubstr("10.0.0.6:50051: has no device 0 (its devices: 1)"))));
}

TEST(BestDevices, NothingLeftWhereTryingAgainMayHelpIsUnavailable) {
  // A matching device is lost; the other daemon does not answer.
  absl::StatusOr<std::vector<Placement>> lost = BestDevices(
      Request(), {Answered(kA, {Device(0, "gpu", 8 * kGiB, 0, 0, /*lost=*/true)}),
                  DaemonReport{kB, absl::DeadlineExceededError("Deadline Exceeded"), {}}});
  EXPECT_THAT(lost,
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("10.0.0.5:50051: device 0 (gpu) is lost"),
                             HasSubstr("10.0.0.6:50051: did not answer (DEADLINE_EXCEEDED"))));
  // Nobody answered.
  absl::StatusOr<std::vector<Placement>> silent =
      BestDevices(Request(), {DaemonReport{kA, absl::UnavailableError("refused"), {}},
                              DaemonReport{kB, absl::DeadlineExceededError("slow"), {}}});
  EXPECT_THAT(silent,
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("none of the komputed daemons"),
                             HasSubstr("10.0.0.5:50051: did not answer (UNAVAILABLE: refused)"),
                             HasSubstr("10.0.0.6:50051: did not answer (DEADLINE_EXCEEDED"))));
  // Every daemon refused the caller the same way: that is the error to fix.
  absl::StatusOr<std::vector<Placement>> refused =
      BestDevices(Request(), {DaemonReport{kA, absl::UnauthenticatedError("no token"), {}},
                              DaemonReport{kB, absl::UnauthenticatedError("no token"), {}}});
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(CandidateDaemons, NodeAndAddressTermsPickDaemons) {
  const std::vector<Endpoint> both = {kA, kB};
  absl::StatusOr<std::vector<Endpoint>> node = CandidateDaemons(Request("node=10.0.0.6"), both);
  ASSERT_TRUE(node.ok());
  EXPECT_THAT(*node, ElementsAre(kB));
  absl::StatusOr<std::vector<Endpoint>> address = CandidateDaemons(Request("address~0.5:"), both);
  ASSERT_TRUE(address.ok());
  EXPECT_THAT(*address, ElementsAre(kA));
  EXPECT_THAT(CandidateDaemons(Request("node=10.0.0.7"), both),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("node=10.0.0.7 (KOMPUTED_SELECT)"),
                             HasSubstr("10.0.0.5:50051 is not node=10.0.0.7"),
                             HasSubstr("10.0.0.6:50051 is not node=10.0.0.7"))));
}

// ---------------------------------------------------------------------------------------------
// kp::Manager against real daemons

// The environment of each test: no variable from outside decides for it.
class PlacementTest : public ::testing::Test {
 protected:
  ScopedEnv address_{"KOMPUTED_ADDRESS", std::nullopt};
  ScopedEnv device_{"KOMPUTED_DEVICE", std::nullopt};
  ScopedEnv select_{"KOMPUTED_SELECT", std::nullopt};
  ScopedEnv eval_{"KOMPUTED_EVAL_TIMEOUT_S", "60"};
};

// The daemon's device 0 as it reports it now.
v1::DeviceInfo DeviceOf(const DaemonProcess& daemon) {
  Stubs stubs(daemon.address());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListDevicesResponse response;
  const grpc::Status status =
      stubs.devices->ListDevices(&context, v1::ListDevicesRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.devices_size() > 0 ? response.devices(0) : v1::DeviceInfo();
}

uint32_t SessionsOn(const DaemonProcess& daemon) { return DeviceOf(daemon).sessions(); }

std::string Both(const DaemonProcess& a, const DaemonProcess& b) {
  return absl::StrCat("ipv4:", a.address(), ",", b.address());
}

std::string Unused() { return absl::StrCat("127.0.0.1:", FreeLoopbackPort()); }

// A session on `daemon` holding `megabytes` of device memory.
std::unique_ptr<kp::Manager> Hold(const DaemonProcess& daemon, size_t megabytes) {
  kp::Remote remote;
  remote.address = daemon.address();
  auto mgr = std::make_unique<kp::Manager>(remote);
  if (megabytes > 0) mgr->tensor(std::vector<float>(megabytes << 18, 1.0f));
  return mgr;
}

// The manager works: a tensor goes up and comes back.
void ExpectWorks(kp::Manager& mgr) {
  auto t = mgr.tensor({1, 2, 3});
  mgr.sequence()->record<kp::OpTensorSyncDevice>({t})->record<kp::OpTensorSyncLocal>({t})->eval();
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 2, 3}));
}

struct Thrown {
  kp::ErrorCode code;
  std::string message;
};

std::optional<Thrown> ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const kp::Error& e) {
    return Thrown{e.code(), e.what()};
  }
  return std::nullopt;
}

TEST_F(PlacementTest, ManagerLandsOnTheDaemonWithMoreFreeMemory) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  ScopedEnv address("KOMPUTED_ADDRESS", Both(a, b));
  {
    auto full = Hold(a, 16);
    ASSERT_GT(DeviceOf(a).memory_in_use_bytes(), DeviceOf(b).memory_in_use_bytes());
    kp::Manager mgr;
    EXPECT_EQ(SessionsOn(a), 1u);
    EXPECT_EQ(SessionsOn(b), 1u);
    ExpectWorks(mgr);
  }
  // The other way round: not the order of the target.
  auto full = Hold(b, 16);
  kp::Manager mgr;
  EXPECT_EQ(SessionsOn(a), 1u);
  EXPECT_EQ(SessionsOn(b), 1u);
  ExpectWorks(mgr);
}

TEST_F(PlacementTest, OnEqualMemoryTheFewestSessionsWin) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  ScopedEnv address("KOMPUTED_ADDRESS", Both(a, b));
  auto idle_a = Hold(a, 0);
  ASSERT_EQ(DeviceOf(a).memory_in_use_bytes(), DeviceOf(b).memory_in_use_bytes());
  kp::Manager first;
  EXPECT_EQ(SessionsOn(b), 1u);
  auto idle_b = Hold(b, 0);
  kp::Manager second;  // b has two now
  EXPECT_EQ(SessionsOn(a), 2u);
  EXPECT_EQ(SessionsOn(b), 2u);
}

TEST_F(PlacementTest, ASingleDaemonIsNotAskedForItsDevices) {
  DaemonProcess a;
  ASSERT_TRUE(a.started());
  ScopedEnv address("KOMPUTED_ADDRESS", a.address());
  {
    kp::Manager mgr;
    ExpectWorks(mgr);
  }
  kp::Manager named(a.address());
  const std::map<std::string, std::string> list = {{"method", "komputed.v1.Devices/ListDevices"}};
  EXPECT_EQ(Samples::From(a).Sum("komputed_rpcs_total", list), 0);
  // A selector by name needs the list, even of one daemon.
  const std::string name = DeviceOf(a).name();
  ScopedEnv select("KOMPUTED_SELECT", absl::StrCat("name~", name.substr(0, 4)));
  kp::Manager selected;
  EXPECT_EQ(SessionsOn(a), 2u);
}

TEST_F(PlacementTest, SelectByDeviceName) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  ScopedEnv address("KOMPUTED_ADDRESS", Both(a, b));
  const std::string name = DeviceOf(a).name();
  ASSERT_GE(name.size(), 4u);
  {
    // Any case, any part of the name.
    ScopedEnv select("KOMPUTED_SELECT",
                     absl::StrCat("name~", absl::AsciiStrToUpper(name.substr(1, 3))));
    kp::Manager mgr;
    ExpectWorks(mgr);
  }
  ScopedEnv select("KOMPUTED_SELECT", "name~no-such-gpu");
  std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, kp::ErrorCode::kNotFound);
  EXPECT_THAT(
      e->message,
      AllOf(HasSubstr("name~no-such-gpu (KOMPUTED_SELECT)"),
            HasSubstr(absl::StrCat(a.address(), ": device 0 (", name, ") is not name~no-such-gpu")),
            HasSubstr(absl::StrCat(b.address(), ": device 0"))));
  EXPECT_EQ(SessionsOn(a) + SessionsOn(b), 0u);
}

TEST_F(PlacementTest, SelectByDaemon) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  ScopedEnv address("KOMPUTED_ADDRESS", Both(a, b));
  auto full = Hold(b, 16);  // b is the fuller, but chosen
  {
    ScopedEnv select("KOMPUTED_SELECT", absl::StrCat("address=", b.address()));
    kp::Manager mgr;
    EXPECT_EQ(SessionsOn(b), 2u);
  }
  {
    ScopedEnv device("KOMPUTED_DEVICE", absl::StrCat(b.address(), "/0"));
    kp::Manager mgr;
    EXPECT_EQ(SessionsOn(b), 2u);
    ExpectWorks(mgr);
  }
  {
    kp::Remote remote;
    remote.address = Both(a, b);
    remote.select = absl::StrCat("address=", b.address());
    kp::Manager mgr(remote);
    EXPECT_EQ(SessionsOn(b), 2u);
  }
  {
    ScopedEnv select("KOMPUTED_SELECT", "node=10.255.255.1");
    std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, kp::ErrorCode::kNotFound);
    EXPECT_THAT(e->message,
                AllOf(HasSubstr(absl::StrCat(a.address(), " is not node=10.255.255.1")),
                      HasSubstr(absl::StrCat(b.address(), " is not node=10.255.255.1"))));
  }
  {
    // An index that no daemon has.
    ScopedEnv device("KOMPUTED_DEVICE", "7");
    std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, kp::ErrorCode::kNotFound);
    EXPECT_THAT(e->message, HasSubstr(absl::StrCat(a.address(), ": has no device 7")));
  }
  EXPECT_EQ(SessionsOn(a), 0u);
}

TEST_F(PlacementTest, ADaemonThatRefusesConnectionsIsSkipped) {
  DaemonProcess a;
  ASSERT_TRUE(a.started());
  ScopedEnv address("KOMPUTED_ADDRESS", absl::StrCat("ipv4:", Unused(), ",", a.address()));
  kp::Manager mgr;
  EXPECT_EQ(SessionsOn(a), 1u);
  ExpectWorks(mgr);
}

TEST_F(PlacementTest, NoDaemonAnsweringIsUnavailableNamingEach) {
  const std::string first = Unused(), second = Unused();
  ScopedEnv address("KOMPUTED_ADDRESS", absl::StrCat("ipv4:", first, ",", second));
  std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, kp::ErrorCode::kUnavailable);
  EXPECT_THAT(e->message, AllOf(HasSubstr("none of the komputed daemons of KOMPUTED_ADDRESS="),
                                HasSubstr(absl::StrCat(first, ": did not answer (UNAVAILABLE")),
                                HasSubstr(absl::StrCat(second, ": did not answer (UNAVAILABLE"))));
}

// Three daemons with different loads: each new manager, itself holding memory, lands on the
// emptiest one at the time; a stopped daemon is passed over; with all stopped the error names
// each address and why.
TEST_F(PlacementTest, ThreeDaemonsManagersFillTheEmptiestAndSkipAStoppedOne) {
  DaemonProcess a, b, c;
  ASSERT_TRUE(a.started() && b.started() && c.started());
  const std::string all = absl::StrCat("ipv4:", a.address(), ",", b.address(), ",", c.address());
  ScopedEnv address("KOMPUTED_ADDRESS", all);
  auto load_a = Hold(a, 48);
  auto load_b = Hold(b, 24);
  // c holds nothing: the order of arrival is c (0), c (16 < 24), b (24 < 32), c (32 < 40).
  const DaemonProcess* const expected[] = {&c, &c, &b, &c};
  std::vector<std::unique_ptr<kp::Manager>> placed;
  for (const DaemonProcess* daemon : expected) {
    const uint32_t before = SessionsOn(*daemon);
    placed.push_back(std::make_unique<kp::Manager>());
    EXPECT_EQ(SessionsOn(*daemon), before + 1)
        << "manager " << placed.size() << " not on " << daemon->address();
    placed.back()->tensor(std::vector<float>(size_t{16} << 18, 1.0f));
  }
  EXPECT_EQ(SessionsOn(a), 1u);
  // c is the emptiest now by far, and stops.
  placed.clear();
  load_b.reset();
  ASSERT_EQ(c.Stop(SIGTERM, absl::Seconds(20)), 0);
  for (int i = 0; i < 3; ++i) {
    kp::Manager mgr;
    ExpectWorks(mgr);
    EXPECT_EQ(SessionsOn(b), 1u);  // b is emptier than a
  }
  // All stopped: every address named, with why.
  load_a.reset();
  ASSERT_EQ(a.Stop(SIGTERM, absl::Seconds(20)), 0);
  ASSERT_EQ(b.Stop(SIGTERM, absl::Seconds(20)), 0);
  std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, kp::ErrorCode::kUnavailable);
  EXPECT_THAT(e->message, AllOf(HasSubstr(absl::StrCat("KOMPUTED_ADDRESS=", all)),
                                HasSubstr(absl::StrCat(a.address(), ": did not answer")),
                                HasSubstr(absl::StrCat(b.address(), ": did not answer")),
                                HasSubstr(absl::StrCat(c.address(), ": did not answer"))));
}

TEST_F(PlacementTest, BadSettingsAreInvalidArguments) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  for (const bool several : {false, true}) {
    ScopedEnv address("KOMPUTED_ADDRESS", several ? Both(a, b) : a.address());
    for (const char* bad : {"H200", "colour=red", "name~", "name~x,,node=y"}) {
      SCOPED_TRACE(bad);
      ScopedEnv select("KOMPUTED_SELECT", bad);
      std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
      ASSERT_TRUE(e.has_value());
      EXPECT_EQ(e->code, kp::ErrorCode::kInvalidArgument);
      EXPECT_THAT(e->message, AllOf(HasSubstr("KOMPUTED_SELECT"), HasSubstr(bad)));
    }
  }
  {
    ScopedEnv address("KOMPUTED_ADDRESS", absl::StrCat("ipv4:", a.address(), ",gpu2:50051"));
    std::optional<Thrown> e = ErrorOf([] { kp::Manager mgr; });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, kp::ErrorCode::kInvalidArgument);
    EXPECT_THAT(e->message, AllOf(HasSubstr("KOMPUTED_ADDRESS"), HasSubstr("'gpu2:50051'")));
  }
  {
    kp::Remote remote;
    remote.address = Both(a, b);
    remote.select = "size>1";
    std::optional<Thrown> e = ErrorOf([&] { kp::Manager mgr(remote); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, kp::ErrorCode::kInvalidArgument);
    EXPECT_THAT(e->message, HasSubstr("kp::Remote::select"));
  }
  {
    // In-process there are no daemons to choose among.
    ScopedEnv select("KOMPUTED_SELECT", "name~x");
    std::optional<Thrown> in_process = ErrorOf([] { kp::Manager mgr; });
    ASSERT_TRUE(in_process.has_value());
    EXPECT_EQ(in_process->code, kp::ErrorCode::kInvalidArgument);
    EXPECT_THAT(in_process->message, HasSubstr("KOMPUTED_ADDRESS is not set"));
  }
  {
    ScopedEnv device("KOMPUTED_DEVICE", absl::StrCat(a.address(), "/0"));
    std::optional<Thrown> in_process = ErrorOf([] { kp::Manager mgr; });
    ASSERT_TRUE(in_process.has_value());
    EXPECT_EQ(in_process->code, kp::ErrorCode::kInvalidArgument);
    EXPECT_THAT(in_process->message, HasSubstr("names a daemon"));
  }
  EXPECT_EQ(SessionsOn(a) + SessionsOn(b), 0u);
}

TEST_F(PlacementTest, TlsAppliesToEveryDaemonAsked) {
  TestCertificates certs;
  ASSERT_TRUE(certs.ok()) << certs.status();
  const std::vector<std::string> tls = {"--tls_cert=" + certs.server_cert(),
                                        "--tls_key=" + certs.server_key()};
  DaemonProcess a(tls), b(tls);
  ASSERT_TRUE(a.started() && b.started());
  ScopedEnv ca("KOMPUTED_TLS_CA", certs.ca());
  std::unique_ptr<kp::Manager> full;
  {
    kp::Remote remote;
    remote.address = a.address();
    full = std::make_unique<kp::Manager>(remote);
    full->tensor(std::vector<float>(size_t{4} << 18, 1.0f));
  }
  ScopedEnv address("KOMPUTED_ADDRESS", Both(a, b));
  kp::Manager mgr;
  ExpectWorks(mgr);
  full.reset();
  // The certificate (for localhost and 127.0.0.1) is checked against an address's DNS name
  // where it has one.
  CredentialSettings settings;
  absl::StatusOr<std::shared_ptr<const ClientCredentials>> credentials =
      ClientCredentials::Load(settings);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  Endpoint named = Daemon("127.0.0.1", 0);
  named.target = named.name = b.address();
  named.tls_name = "localhost";
  Endpoint misnamed = named;
  misnamed.tls_name = "gpu1.example.org";
  const std::vector<DaemonReport> reports =
      QueryDaemons({named, misnamed}, **credentials, absl::Seconds(10));
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_TRUE(reports[0].status.ok()) << reports[0].status;
  ASSERT_EQ(reports[0].devices.size(), 1u);
  EXPECT_EQ(reports[0].devices[0].sessions(), 1u);  // mgr's: b had the more free memory
  EXPECT_THAT(reports[1].status, StatusIs(absl::StatusCode::kUnavailable));
}

// ---------------------------------------------------------------------------------------------
// komputectl devices

TEST_F(PlacementTest, KomputectlListsTheDevicesOfEveryDaemon) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  auto full = Hold(b, 16);
  std::string out, err;
  ASSERT_EQ(RunProgram({KomputectlBinary(), "--address=" + Both(a, b), "--timeout=10", "devices"},
                       &out, &err),
            0)
      << err;
  // b's memory in use as the table writes it.
  const std::string in_use =
      absl::StrFormat("%.1f MiB", DeviceOf(b).memory_in_use_bytes() / double(1 << 20));
  EXPECT_THAT(out, AllOf(HasSubstr("DAEMON"), ContainsRegex(absl::StrCat(a.address(), " +0 ")),
                         ContainsRegex(absl::StrCat(b.address(), " +0 .* ", in_use, " +1 "))));
  // A daemon that does not answer is named on stderr; the others are still listed.
  const std::string dead = Unused();
  EXPECT_EQ(RunProgram({KomputectlBinary(), absl::StrCat("--address=ipv4:", a.address(), ",", dead),
                        "--timeout=10", "devices"},
                       &out, &err),
            1);
  EXPECT_THAT(out, AllOf(HasSubstr(a.address()), Not(HasSubstr(dead))));
  EXPECT_THAT(err, HasSubstr(absl::StrCat("listing devices at ", dead)));
  // One daemon: the table as it always was.
  ASSERT_EQ(RunProgram({KomputectlBinary(), "--address=" + a.address(), "devices"}, &out, &err), 0)
      << err;
  EXPECT_THAT(out, AllOf(HasSubstr("INDEX"), Not(HasSubstr("DAEMON"))));
}

TEST_F(PlacementTest, KomputectlHealthAndSessionsOfEveryDaemon) {
  DaemonProcess a, b;
  ASSERT_TRUE(a.started() && b.started());
  auto on_a = Hold(a, 0);
  auto on_b = Hold(b, 1);
  std::string out, err;
  ASSERT_EQ(RunProgram({KomputectlBinary(), "--address=" + Both(a, b), "--timeout=10", "health"},
                       &out, &err),
            0)
      << err;
  EXPECT_THAT(out, AllOf(HasSubstr("DAEMON"), ContainsRegex(a.address() + " +SERVING"),
                         ContainsRegex(b.address() + " +SERVING")));
  ASSERT_EQ(RunProgram({KomputectlBinary(), "--address=" + Both(a, b), "--timeout=10", "sessions"},
                       &out, &err),
            0)
      << err;
  // Each daemon's session under its name, b's with its tensor.
  EXPECT_THAT(out, AllOf(HasSubstr("DAEMON"),
                         ContainsRegex(a.address() + " +[0-9a-f]+ +default .* 0 B +0 "),
                         ContainsRegex(b.address() + " +[0-9a-f]+ +default .* MiB +1 ")));
  // A daemon that does not answer: named on stderr, the others still shown, exit status 1.
  const std::string dead = Unused();
  const std::string with_dead = absl::StrCat("ipv4:", a.address(), ",", dead);
  EXPECT_EQ(RunProgram({KomputectlBinary(), "--address=" + with_dead, "--timeout=10", "health"},
                       &out, &err),
            1);
  EXPECT_THAT(
      out, AllOf(ContainsRegex(a.address() + " +SERVING"), ContainsRegex(dead + " +UNREACHABLE")));
  EXPECT_THAT(err, HasSubstr(absl::StrCat("health check at ", dead)));
  EXPECT_EQ(RunProgram({KomputectlBinary(), "--address=" + with_dead, "--timeout=10", "sessions"},
                       &out, &err),
            1);
  EXPECT_THAT(out, ContainsRegex(a.address() + " +[0-9a-f]+ +default "));
  EXPECT_THAT(err, HasSubstr(absl::StrCat("listing sessions at ", dead)));
  // One daemon: the answer as it always was.
  ASSERT_EQ(RunProgram({KomputectlBinary(), "--address=" + a.address(), "health"}, &out, &err), 0)
      << err;
  EXPECT_EQ(out, "SERVING\n");
}

}  // namespace
}  // namespace kp::internal::remote

// The komputectl tool against a real daemon.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "test_util.h"

namespace komputed::ops_testing {
namespace {

// Runs komputectl with `args` against `address` (none when empty).
int Komputectl(const std::string& address, std::vector<std::string> args, std::string* out,
               std::string* err) {
  std::vector<std::string> argv = {KomputectlBinary()};
  if (!address.empty()) argv.push_back("--address=" + address);
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, out, err);
}

// A fresh directory under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/komputectl-test-XXXXXX";
    path_ = mkdtemp(name);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& file, const std::string& text) const {
    const std::string path = path_ + "/" + file;
    std::ofstream(path) << text;
    return path;
  }
  std::string Read(const std::string& file) const {
    std::ifstream in(path_ + "/" + file);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Komputectl, DevicesPrintsATableWithTheDeviceName) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  grpc::ClientContext ctx;
  v1::ListDevicesResponse devices;
  ASSERT_THAT(client.devices->ListDevices(&ctx, v1::ListDevicesRequest(), &devices), IsOk());
  ASSERT_GT(devices.devices_size(), 0);

  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(), {"devices"}, &out, &err), 0) << err;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u + devices.devices_size()) << out;
  EXPECT_THAT(lines[0], testing::HasSubstr("NAME"));
  EXPECT_THAT(lines[0], testing::HasSubstr("MEMORY"));
  EXPECT_THAT(lines[1], testing::StartsWith("0 "));
  EXPECT_THAT(lines[1], testing::HasSubstr(devices.devices(0).name()));
}

TEST(Komputectl, HealthPrintsServing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(), {"health"}, &out, &err), 0) << err;
  EXPECT_EQ(out, "SERVING\n");
  EXPECT_EQ(Komputectl(daemon.address(), {"health", "--service=komputed.v1.Sequences"}, &out, &err),
            0)
      << err;
  EXPECT_EQ(out, "SERVING\n");
  EXPECT_NE(Komputectl(daemon.address(), {"health", "--service=no.such.Service"}, &out, &err), 0);
  EXPECT_THAT(err, testing::StartsWith("komputectl: error: "));
}

TEST(Komputectl, SessionsListsAnOpenSession) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session, "ops-sessions"), IsOk());
  ASSERT_THAT(client.CreateTensor(FloatTensor(session, 1, std::vector<float>(256, 1.0f))), IsOk());

  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(), {"sessions"}, &out, &err), 0) << err;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_THAT(lines[0], testing::HasSubstr("SESSION"));
  EXPECT_THAT(lines[1], testing::StartsWith(session));
  EXPECT_THAT(lines[1], testing::HasSubstr("ops-sessions"));
  EXPECT_THAT(lines[0], testing::HasSubstr("TENANT"));
  EXPECT_THAT(lines[1], testing::HasSubstr(" default "));  // the implicit tenant
  EXPECT_THAT(lines[1], testing::HasSubstr("2.0 KiB"));    // 1 KiB, buffer and staging

  ASSERT_THAT(client.Close(session), IsOk());
  EXPECT_EQ(Komputectl(daemon.address(), {"sessions"}, &out, &err), 0) << err;
  EXPECT_THAT(out, testing::HasSubstr("(no sessions)"));
}

TEST(Komputectl, RunCompilesBindsDispatchesAndWritesOutputs) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  TempDir dir;
  const std::string shader = dir.Write("mul.comp", R"(
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  c[i] = a[i] * b[i];
}
)");
  const std::string a = dir.Write("a.txt", "1 2 3\n");
  const std::string b = dir.Write("b.txt", "4\n5\n6\n");
  const std::string out_path = dir.path() + "/out.txt";
  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(),
                       {"run", "--shader=" + shader,
                        absl::StrCat("--tensors=float32:", a, ",float32:", b,
                                     ",float32:zeros:3=", out_path)},
                       &out, &err),
            0)
      << err;
  EXPECT_EQ(dir.Read("out.txt"), "4\n10\n18\n");
  EXPECT_THAT(err, testing::HasSubstr("ran on "));
}

TEST(Komputectl, RunTakesAndWritesTheSmallElementTypes) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  TempDir dir;
  const std::string shader = dir.Write("small.comp", R"(
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer A { int8_t a[]; };
layout(set = 0, binding = 1) readonly buffer B { uint16_t b[]; };
layout(set = 0, binding = 2) buffer E { uint8_t e[]; };
layout(set = 0, binding = 3) writeonly buffer C { float16_t c[]; };
layout(set = 0, binding = 4) writeonly buffer D { int16_t d[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  c[i] = float16_t(float(a[i]) * float(b[i]) * 0.5);
  d[i] = int16_t(a[i]) - int16_t(b[i]);
  e[i] = e[i] + uint8_t(1);
}
)");
  const std::string a = dir.Write("a.txt", "-3 7 100\n");
  const std::string b = dir.Write("b.txt", "2 300 4\n");
  const std::string e = dir.Write("e.txt", "255 0 128\n");
  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(),
                       {"run", "--shader=" + shader,
                        absl::StrCat("--tensors=int8:", a, ",uint16:", b, ",uint8:", e, "=",
                                     dir.path(), "/e_out.txt,float16:zeros:3=", dir.path(),
                                     "/c.txt,int16:zeros:3=", dir.path(), "/d.txt")},
                       &out, &err),
            0)
      << err;
  EXPECT_EQ(dir.Read("c.txt"), "-3\n1050\n200\n");
  EXPECT_EQ(dir.Read("d.txt"), "-5\n-293\n96\n");
  EXPECT_EQ(dir.Read("e_out.txt"), "0\n1\n129\n");

  // A value that the type cannot hold, a fraction for an integer type and an unknown type are
  // refused before anything runs, naming the value.
  const std::string big = dir.Write("big.txt", "1 300\n");
  const std::string half = dir.Write("half.txt", "1.5\n");
  const std::string huge = dir.Write("huge.txt", "70000\n");
  for (const auto& [tensors, expected] : std::vector<std::pair<std::string, std::string>>{
           {"int8:" + big, "300 is not a int8 value"},
           {"uint16:" + half, "1.5 is not a uint16 value"},
           {"float16:" + huge, "70000 is not a float16 value"},
           {"int4:" + big,
            "unknown type \"int4\" (float32, float64, float16, int32, uint32, "
            "int16, uint16, int8, uint8)"}}) {
    SCOPED_TRACE(tensors);
    EXPECT_EQ(Komputectl(daemon.address(), {"run", "--shader=" + shader, "--tensors=" + tensors},
                         &out, &err),
              2);
    EXPECT_THAT(err, testing::HasSubstr(expected));
  }
}

TEST(Komputectl, UnreachableDaemonIsOneErrorLine) {
  // Port 1: nothing listens there (binding it takes privileges).
  std::string out, err;
  const int code = Komputectl("127.0.0.1:1", {"--timeout=3", "devices"}, &out, &err);
  EXPECT_NE(code, 0);
  EXPECT_EQ(out, "");
  const std::vector<std::string> lines = absl::StrSplit(err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_THAT(lines[0], testing::StartsWith("komputectl: error: "));
  EXPECT_THAT(lines[0], testing::HasSubstr("127.0.0.1:1"));
}

TEST(Komputectl, BenchPrintsItsLines) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(), {"bench", "--seconds=0.3", "--megabytes=8"}, &out, &err),
            0)
      << err;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << out;
  EXPECT_THAT(lines[0], testing::StartsWith("ping round trip"));
  EXPECT_THAT(lines[1], testing::StartsWith("eval 4 KiB up+down"));
  EXPECT_THAT(lines[2], testing::MatchesRegex("upload +8 MiB +[0-9.]+ GB/s"));
  EXPECT_THAT(lines[3], testing::MatchesRegex("download +8 MiB +[0-9.]+ GB/s"));
}

TEST(Komputectl, HelpListsEveryFlagWithItsText) {
  std::string out, err;
  Komputectl("", {"--help"}, &out, &err);
  const std::string help = out + err;
  for (const char* flag : {"address", "token", "token_file", "tls_ca", "tls_cert", "tls_key",
                           "timeout", "device", "service", "shader", "tensors", "workgroup", "push",
                           "spec", "const_type", "seconds", "megabytes"}) {
    EXPECT_THAT(help, testing::HasSubstr(absl::StrCat("--", flag, " ("))) << flag;
  }
  for (const char* command : {"devices", "health", "sessions", "run", "bench"}) {
    EXPECT_THAT(help, testing::HasSubstr(absl::StrCat("  ", command, " "))) << command;
  }
}

TEST(Komputectl, BenchWithZeroSecondsStillMeasuresOnce) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  std::string out, err;
  EXPECT_EQ(Komputectl(daemon.address(), {"bench", "--seconds=0", "--megabytes=0"}, &out, &err), 0)
      << err;
  EXPECT_THAT(out, testing::ContainsRegex("ping round trip +p50 +[0-9.]+ us .*\\(1 calls\\)"));
  EXPECT_THAT(out, testing::ContainsRegex("eval 4 KiB up\\+down +p50 +[0-9.]+ us .*\\(1 evals\\)"));
}

}  // namespace
}  // namespace komputed::ops_testing

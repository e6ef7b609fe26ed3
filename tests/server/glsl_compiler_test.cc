// GLSL compiled in a child process: a source that makes the compiler run away (a macro that
// doubles itself 21 times) fails that one request within the bound, and the daemon keeps serving.
#include "glsl_compiler.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "komputed/core/shader.h"
#include "support/sanitizers.h"
#include "support/status_matchers.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// The komputed_glslc program: $KOMPUTED_GLSLC when set, else this build's.
std::string Glslc() {
  const char* path = std::getenv("KOMPUTED_GLSLC");
  return path != nullptr && path[0] != '\0' ? path : KOMPUTED_GLSLC;
}

// 524 bytes or so that expand to 2^21 terms.
std::string MacroBomb() {
  std::string source = "#version 450\nlayout(local_size_x = 1) in;\n#define A0 1.0+\n";
  for (int i = 1; i <= 21; ++i)
    absl::StrAppend(&source, "#define A", i, " A", i - 1, " A", i - 1, "\n");
  absl::StrAppend(&source, "layout(set = 0, binding = 0) buffer B { float b[]; };\n",
                  "void main() { b[0] = A21 1.0; }\n");
  return source;
}

// Under AddressSanitizer, whose shadow memory needs more address space than any bound, the
// compiler's memory is not bounded, only its time.
GlslCompileLimits Tight() {
  GlslCompileLimits limits;
  limits.wall_time = absl::Seconds(5);
  limits.memory_bytes = test_support::kAddressSanitizer ? 0 : uint64_t{512} << 20;
  return limits;
}

TEST(GlslCompiler, CompilesInAChildProcess) {
  auto spirv = CompileGlslInChild(Glslc(), kScaleShader, "scale", Tight());
  ASSERT_TRUE(spirv.ok()) << spirv.status();
  ASSERT_GT(spirv->size(), 5u);
  EXPECT_EQ((*spirv)[0], 0x07230203u);
}

TEST(GlslCompiler, ErrorsComeBackAsTheCompilerSaysThem) {
  auto spirv =
      CompileGlslInChild(Glslc(), "#version 450\nvoid main() { x = 1; }\n", "algorithm 7", Tight());
  ASSERT_FALSE(spirv.ok());
  EXPECT_EQ(spirv.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spirv.status().message(), HasSubstr("algorithm 7:2"));
}

TEST(GlslCompiler, ARunawayCompileFailsWithinItsBound) {
  const std::string bomb = MacroBomb();
  const absl::Time start = absl::Now();
  auto spirv = CompileGlslInChild(Glslc(), bomb, "bomb", Tight());
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(spirv.ok());
  EXPECT_THAT(spirv.status().code(),
              AnyOf(absl::StatusCode::kResourceExhausted, absl::StatusCode::kInvalidArgument,
                    absl::StatusCode::kInternal))
      << spirv.status();
  EXPECT_LT(took, Tight().wall_time + absl::Seconds(5));
}

// A compiler that closes its stdout and stderr and goes on running (asleep, so that no CPU bound
// stops it) is stopped at the wall time too, not waited for (found by fuzz_glsl_pipe).
TEST(GlslCompiler, ACompilerThatClosesItsOutputIsStoppedAtTheWallTime) {
  char dir[] = "/tmp/glsl_compiler_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string compiler = absl::StrCat(dir, "/closes_output");
  {
    std::ofstream script(compiler);
    script << "#!/bin/sh\nexec >&- 2>&-\nexec sleep 30\n";
  }
  ASSERT_EQ(chmod(compiler.c_str(), 0700), 0);
  GlslCompileLimits limits = Tight();
  limits.wall_time = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto spirv = CompileGlslInChild(compiler, kScaleShader, "scale", limits);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(spirv.status().code(), absl::StatusCode::kResourceExhausted) << spirv.status();
  EXPECT_LT(took, absl::Seconds(5));
  std::remove(compiler.c_str());
  rmdir(dir);
}

TEST(GlslCompiler, AMissingCompilerIsAnError) {
  auto spirv = CompileGlslInChild("/nonexistent/komputed_glslc", kScaleShader, "scale", Tight());
  ASSERT_FALSE(spirv.ok());
  EXPECT_EQ(spirv.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(spirv.status().message(), HasSubstr("could not be started"));
}

// A compiler that exits without reading its source fails the compile, and the caller's process
// lives on with SIGPIPE at its default action: 4 MiB of source do not fit in the socket's buffer,
// so sends go on after the child is gone (found in a run where no test had ignored SIGPIPE).
TEST(GlslCompiler, ACompilerThatExitsWithoutReadingRaisesNoSignal) {
  struct sigaction previous {};
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ASSERT_EQ(sigaction(SIGPIPE, &default_action, &previous), 0);
  const std::string source(4 << 20, ' ');
  for (int i = 0; i < 3; ++i) {
    auto spirv = CompileGlslInChild("/nonexistent/komputed_glslc", source, "large", Tight());
    EXPECT_EQ(spirv.status().code(), absl::StatusCode::kInternal) << spirv.status();
    spirv = CompileGlslInChild("/bin/true", source, "large", Tight());
    EXPECT_FALSE(spirv.ok());
  }
  sigaction(SIGPIPE, &previous, nullptr);
}

// Through the daemon: the bomb fails its CreateAlgorithm, and the daemon serves the next call.
class GlslDaemonTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.glsl_compiler = Glslc();
    options.glsl_limits = Tight();
    return options;
  }
};

TEST_F(GlslDaemonTest, TheDaemonSurvivesACompilerBomb) {
  const std::string session = Open();
  ASSERT_THAT(CreateTensor(FloatTensor(session, 1, {1})), IsOk());
  grpc::Status refused = CreateAlgorithm(GlslAlgorithm(session, 2, {1}, MacroBomb(), 1, ""));
  EXPECT_FALSE(refused.ok());
  // Still serving, and compiling ordinary shaders.
  MakePipeline(session, 10, 16, 3.0f);
  ExpectPipelineWorks(session, 10, 16, 3.0f);
}

// CompileGlsl: the stateless compile, with the same compiler and bounds as an algorithm's GLSL.
grpc::Status CompileGlsl(Client& client, const std::string& glsl, v1::CompileGlslResponse* out) {
  grpc::ClientContext ctx;
  v1::CompileGlslRequest request;
  request.set_glsl(glsl);
  return client.algorithms->CompileGlsl(&ctx, request, out);
}

TEST_F(GlslDaemonTest, CompileGlslReturnsTheSpirvOfAShader) {
  v1::CompileGlslResponse response;
  ASSERT_THAT(CompileGlsl(*client_,
                          "#version 450\nlayout(local_size_x = 1) in;\n"
                          "layout(set = 0, binding = 0) buffer B { float b[]; };\n"
                          "void main() { b[0] = 2.0; }\n",
                          &response),
              IsOk());
  ASSERT_GE(response.spirv().size(), 20u);
  EXPECT_EQ(response.spirv().size() % 4, 0u);
  uint32_t magic;
  std::memcpy(&magic, response.spirv().data(), sizeof(magic));
  EXPECT_EQ(magic, 0x07230203u);
}

TEST_F(GlslDaemonTest, CompileGlslErrorsAreInvalidArgumentWithTheCompilersMessage) {
  v1::CompileGlslResponse response;
  grpc::Status status =
      CompileGlsl(*client_, "#version 450\nvoid main() { undeclared = 1; }\n", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("undeclared"));
}

TEST_F(GlslDaemonTest, CompileGlslOfABombFailsWithinItsBound) {
  v1::CompileGlslResponse response;
  EXPECT_FALSE(CompileGlsl(*client_, MacroBomb(), &response).ok());
  // Still serving.
  const std::string session = Open();
  MakePipeline(session, 10, 16, 3.0f);
  ExpectPipelineWorks(session, 10, 16, 3.0f);
}

// A compiler that never answers, until the daemon's time bound stops it: while it runs, the
// daemon serves everything else, the same session's other calls included.
class SlowCompilerTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    compiler_ = ::testing::TempDir() + "/komputed_slow_glslc.sh";
    std::FILE* f = std::fopen(compiler_.c_str(), "w");
    EXPECT_NE(f, nullptr);
    if (f != nullptr) {
      std::fputs("#!/bin/sh\nexec sleep 30\n", f);
      std::fclose(f);
    }
    chmod(compiler_.c_str(), 0755);
    options.glsl_compiler = compiler_;
    options.glsl_limits.wall_time = absl::Seconds(4);
    return options;
  }
  std::string compiler_;
};

TEST_F(SlowCompilerTest, ACompileHoldsUpNothingElse) {
  const std::string session = Open();
  ASSERT_THAT(CreateTensor(FloatTensor(session, 1, {1})), IsOk());
  std::atomic<bool> compiled{false};
  grpc::Status slow;
  std::thread compile([&] {
    slow = CreateAlgorithm(GlslAlgorithm(session, 2, {1}, kScaleShader, 1, PushFloat(1)));
    compiled = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  // The same session and another one, with SPIR-V (compiled here, not by the slow compiler).
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, core::CompileGlsl(kScaleShader));
  for (const std::string& s : {session, Open("other")}) {
    ASSERT_THAT(CreateTensor(FloatTensor(s, 10, {1, 2})), IsOk());
    ASSERT_THAT(CreateTensor(FloatTensor(s, 11, {0, 0})), IsOk());
    v1::CreateAlgorithmRequest req = GlslAlgorithm(s, 12, {10, 11}, "", 2, PushFloat(2));
    req.set_spirv(spirv.data(), spirv.size() * 4);
    ASSERT_THAT(CreateAlgorithm(req), IsOk());
  }
  EXPECT_FALSE(compiled.load()) << "other calls waited for the compiler";
  compile.join();
  EXPECT_FALSE(slow.ok());
}

}  // namespace
}  // namespace komputed::server::testing

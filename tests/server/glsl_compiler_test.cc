// GLSL compiled in a child process: a source that makes the compiler run away (a macro that
// doubles itself 21 times) fails that one request within the bound, and the daemon keeps serving.
#include "glsl_compiler.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// Whether this build runs under AddressSanitizer, whose shadow memory needs more address space
// than any bound: there the compiler's memory is not bounded, only its time.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

GlslCompileLimits Tight() {
  GlslCompileLimits limits;
  limits.wall_time = absl::Seconds(5);
  limits.memory_bytes = kAddressSanitizer ? 0 : uint64_t{512} << 20;
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

}  // namespace
}  // namespace komputed::server::testing

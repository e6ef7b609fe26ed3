// komputed_glslc: compiles one GLSL compute shader, read from stdin, to SPIR-V written to stdout
// (native-endian 32-bit words). The daemon runs it as a child process with bounds on its time and
// memory (glsl_compiler.h), so that a source that makes the compiler run away costs only itself.
// Exit status 0: compiled; 1: the source does not compile (the compiler's messages on stderr).
//
//   komputed_glslc NAME < shader.comp > shader.spv      (NAME appears in the messages)
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "komputed/core/shader.h"

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "shader";
  const std::string source((std::istreambuf_iterator<char>(std::cin)),
                           std::istreambuf_iterator<char>());
  auto spirv = komputed::core::CompileGlsl(source, name);
  if (!spirv.ok()) {
    std::fputs(std::string(spirv.status().message()).c_str(), stderr);
    return 1;
  }
  const char* bytes = reinterpret_cast<const char*>(spirv->data());
  size_t left = spirv->size() * sizeof(uint32_t);
  while (left > 0) {
    const ssize_t n = write(STDOUT_FILENO, bytes, left);
    if (n <= 0) return 2;
    bytes += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

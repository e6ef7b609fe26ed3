#pragma once
// Builders of komputed.v1 requests and operations, and the scale shader that tests dispatch.
// Header-only: for test targets that link komputed::proto.

#include <cstdint>
#include <string>
#include <vector>

#include "komputed/v1/komputed.pb.h"
#include "support/bytes.h"

namespace komputed::test_support {

// out[i] = in[i] * scale (push constant); one invocation per element.
inline constexpr char kScaleShader[] = R"(
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer In { float a[]; };
layout(set = 0, binding = 1) writeonly buffer Out { float b[]; };
layout(push_constant) uniform Push { float scale; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * scale;
}
)";

// A float32 tensor `handle` in `session` holding `data`.
inline v1::CreateTensorRequest FloatTensor(const std::string& session, uint64_t handle,
                                           const std::vector<float>& data,
                                           v1::MemoryType memory = v1::MEMORY_TYPE_DEVICE) {
  v1::CreateTensorRequest r;
  r.set_session_id(session);
  r.set_handle(handle);
  r.set_element_type(v1::ELEMENT_TYPE_FLOAT32);
  r.set_count(data.size());
  r.set_memory_type(memory);
  r.set_data(FloatBytes(data));
  return r;
}

// An algorithm `handle` in `session` over `tensors`, from GLSL, with `workgroups` x 1 x 1
// workgroups and the given push constants' bytes.
inline v1::CreateAlgorithmRequest GlslAlgorithm(const std::string& session, uint64_t handle,
                                                std::vector<uint64_t> tensors,
                                                const std::string& glsl, uint32_t workgroups,
                                                const std::string& push) {
  v1::CreateAlgorithmRequest r;
  r.set_session_id(session);
  r.set_handle(handle);
  for (uint64_t t : tensors) r.add_tensors(t);
  r.set_glsl(glsl);
  r.mutable_workgroup()->set_x(workgroups);
  r.mutable_workgroup()->set_y(1);
  r.mutable_workgroup()->set_z(1);
  r.set_push_constants(push);
  return r;
}

// An eval of `sequence` that uploads `bytes` into tensor `upload` before it runs and downloads
// tensor `download` after.
inline v1::EvalRequest UploadEvalDownload(const std::string& session, uint64_t sequence,
                                          uint64_t upload, const std::string& bytes,
                                          uint64_t download) {
  v1::EvalRequest r;
  r.set_session_id(session);
  r.set_sequence(sequence);
  v1::TensorData* up = r.add_uploads();
  up->set_handle(upload);
  up->set_data(bytes);
  r.add_downloads(download);
  return r;
}

inline v1::Operation SyncDevice(std::vector<uint64_t> tensors) {
  v1::Operation op;
  for (uint64_t t : tensors) op.mutable_sync_device()->add_tensors(t);
  return op;
}

inline v1::Operation SyncLocal(std::vector<uint64_t> tensors) {
  v1::Operation op;
  for (uint64_t t : tensors) op.mutable_sync_local()->add_tensors(t);
  return op;
}

inline v1::Operation Dispatch(uint64_t algorithm) {
  v1::Operation op;
  op.mutable_dispatch()->set_algorithm(algorithm);
  return op;
}

}  // namespace komputed::test_support

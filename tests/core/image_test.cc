// Tests of 2-D images (Tensor::CreateImage): shapes and formats, first contents, sync and copy
// operations with buffers and images, storage images in shaders, and what is refused.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::Each;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<float> Ramp(size_t n, float start = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) * 0.5f;
  return v;
}

absl::StatusOr<std::shared_ptr<Tensor>> FloatImage(const ImageShape& shape,
                                                   const std::vector<float>* data,
                                                   MemoryType memory = MemoryType::kDevice) {
  return Tensor::CreateImage(TestDevice(), ElementType::kFloat32, shape, memory,
                             data == nullptr ? nullptr : data->data());
}

absl::StatusOr<std::shared_ptr<Tensor>> FloatTensor(const std::vector<float>& data,
                                                    MemoryType memory = MemoryType::kDevice) {
  return Tensor::Create(TestDevice(), ElementType::kFloat32, data.size(), 0, memory, data.data());
}

template <typename T>
std::vector<T> Host(const Tensor& t) {
  const T* p = static_cast<const T*>(t.host_data());
  return std::vector<T>(p, p + t.count());
}

std::vector<uint8_t> HostBytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.host_data());
  return std::vector<uint8_t>(p, p + t.byte_size());
}

absl::Status RunOps(const std::vector<Op>& ops) {
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(TestDevice(), 0, 0);
  if (!seq.ok()) return seq.status();
  for (const Op& op : ops) {
    if (absl::Status s = (*seq)->Record(op); !s.ok()) return s;
  }
  return (*seq)->Eval(kTimeout);
}

TEST(Image, ShapeAndFormat) {
  const std::vector<float> data = Ramp(5 * 3 * 4);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> image, FloatImage({5, 3, 4}, &data));
  EXPECT_TRUE(image->is_image());
  EXPECT_EQ(image->count(), 60u);
  EXPECT_EQ(image->byte_size(), 240u);
  EXPECT_EQ(image->format(), VK_FORMAT_R32G32B32A32_SFLOAT);
  EXPECT_NE(image->image(), VK_NULL_HANDLE);
  EXPECT_NE(image->image_view(), VK_NULL_HANDLE);
  EXPECT_EQ(image->buffer(), VK_NULL_HANDLE);
  EXPECT_EQ(ImageFormat(ElementType::kUInt8, 1), VK_FORMAT_R8_UINT);
  EXPECT_EQ(ImageFormat(ElementType::kInt16, 2), VK_FORMAT_R16G16_SINT);
  EXPECT_EQ(ImageFormat(ElementType::kFloat16, 4), VK_FORMAT_R16G16B16A16_SFLOAT);
  EXPECT_EQ(ImageFormat(ElementType::kFloat64, 1), VK_FORMAT_UNDEFINED);
}

TEST(Image, SyncLocalReadsTheInitialTexels) {
  const std::vector<float> data = Ramp(7 * 5 * 2);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> image, FloatImage({7, 5, 2}, &data));
  std::memset(image->host_data(), 0, image->byte_size());  // only the device has them now
  ASSERT_OK(RunOps({op::SyncToHost{{image}}}));
  EXPECT_THAT(Host<float>(*image), ElementsAreArray(data));
}

TEST(Image, WithoutDataItIsZeros) {
  for (MemoryType memory : {MemoryType::kDevice, MemoryType::kStorage}) {
    SCOPED_TRACE(MemoryTypeName(memory));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> image, FloatImage({4, 4, 1}, nullptr, memory));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> out,
                         FloatTensor(std::vector<float>(16, 9.0f), MemoryType::kHost));
    ASSERT_OK(RunOps({op::Copy{{image, out}}}));
    EXPECT_THAT(Host<float>(*out), Each(0.0f));
  }
}

TEST(Image, SyncDeviceThenCopiesBetweenImagesAndTensors) {
  const std::vector<float> data = Ramp(6 * 2 * 4, -3.0f);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, FloatImage({6, 2, 4}, nullptr));
  std::memcpy(a->host_data(), data.data(), a->byte_size());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, FloatImage({6, 2, 4}, nullptr));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> storage,
                       FloatImage({6, 2, 4}, nullptr, MemoryType::kStorage));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> tensor,
                       FloatTensor(std::vector<float>(48, 0.0f), MemoryType::kStorage));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> back, FloatImage({6, 2, 4}, nullptr));
  // host → a; a → b (image → image); b → tensor (image → buffer); tensor → storage image
  // (buffer → image); storage → back (image → image); back → host.
  ASSERT_OK(RunOps({op::SyncToDevice{{a}}, op::Copy{{a, b}}, op::Copy{{b, tensor}},
                    op::Copy{{tensor, storage}}, op::Copy{{storage, back}}}));
  std::memset(back->host_data(), 0, back->byte_size());
  ASSERT_OK(RunOps({op::SyncToHost{{back}}}));
  EXPECT_THAT(Host<float>(*back), ElementsAreArray(data));
}

TEST(Image, CopiesNeedTheSameShapeAndType) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, FloatImage({4, 2, 1}, nullptr));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, FloatImage({2, 4, 1}, nullptr));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> small, FloatTensor(std::vector<float>(7, 0.0f)));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> ints,
                       Tensor::CreateImage(TestDevice(), ElementType::kInt32, {4, 2, 1},
                                           MemoryType::kDevice, nullptr));
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(TestDevice(), 0, 0);
  ASSERT_OK(seq.status());
  EXPECT_THAT((*seq)->Record(op::Copy{{a, b}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is 2x4x1")));
  EXPECT_THAT((*seq)->Record(op::Copy{{a, small}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("7 elements")));
  EXPECT_THAT((*seq)->Record(op::Copy{{a, ints}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int32")));
}

TEST(Image, EveryImageElementTypeRoundTrips) {
  for (ElementType type :
       {ElementType::kInt8, ElementType::kUInt8, ElementType::kInt16, ElementType::kUInt16,
        ElementType::kFloat16, ElementType::kInt32, ElementType::kUInt32, ElementType::kFloat32}) {
    for (uint32_t channels : {1u, 2u, 4u}) {
      SCOPED_TRACE(std::string(ElementTypeName(type)) + " x" + std::to_string(channels));
      const ImageShape shape{3, 5, channels};
      std::vector<uint8_t> bytes(shape.count() * ElementTypeSize(type));
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13 + 1);
      if (type == ElementType::kFloat16) {
        // Finite halves only (a NaN's payload need not survive).
        for (size_t i = 1; i < bytes.size(); i += 2) bytes[i] &= 0x3b;
      }
      ASSERT_OK_AND_ASSIGN(
          std::shared_ptr<Tensor> image,
          Tensor::CreateImage(TestDevice(), type, shape, MemoryType::kDevice, bytes.data()));
      std::memset(image->host_data(), 0, image->byte_size());
      ASSERT_OK(RunOps({op::SyncToHost{{image}}}));
      EXPECT_THAT(HostBytes(*image), ElementsAreArray(bytes));
    }
  }
}

TEST(Image, BadShapesAndTypesAreRefused) {
  auto make = [](ElementType type, ImageShape shape, MemoryType memory = MemoryType::kDevice) {
    return Tensor::CreateImage(TestDevice(), type, shape, memory, nullptr).status();
  };
  EXPECT_THAT(make(ElementType::kFloat32, {4, 4, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 4 channels, not 0")));
  EXPECT_THAT(make(ElementType::kFloat32, {4, 4, 5}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not 5")));
  EXPECT_THAT(make(ElementType::kFloat32, {0, 4, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0x4")));
  EXPECT_THAT(make(ElementType::kFloat64, {4, 4, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float64")));
  EXPECT_THAT(make(ElementType::kBool, {4, 4, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bool")));
  EXPECT_THAT(make(ElementType::kFloat32, {4, 4, 1}, MemoryType::kHost),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory type host")));
  EXPECT_THAT(make(ElementType::kFloat32, {4, 4, 1}, MemoryType::kDeviceAndHost),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deviceAndHost")));
  const uint32_t max = TestDevice()->limits().maxImageDimension2D;
  EXPECT_THAT(make(ElementType::kFloat32, {max + 1, 1, 1}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("maxImageDimension2D")));
}

// out(x, y) = uint(sum of in's channels) + t[y * width + x], and t[i] doubled.
constexpr char kImageShader[] = R"(#version 450
layout(local_size_x = 1, local_size_y = 1) in;
layout(set = 0, binding = 0, rgba32f) uniform readonly image2D in_image;
layout(set = 0, binding = 1, r32ui) uniform writeonly uimage2D out_image;
layout(set = 0, binding = 2) buffer T { uint t[]; };
void main() {
  ivec2 p = ivec2(gl_GlobalInvocationID.xy);
  vec4 v = imageLoad(in_image, p);
  uint i = uint(p.y * imageSize(in_image).x + p.x);
  imageStore(out_image, p, uvec4(uint(v.x + v.y + v.z + v.w) + t[i]));
  t[i] *= 2u;
}
)";

TEST(Image, ShaderReadsAndWritesStorageImages) {
  ASSERT_TRUE(TestDevice()->robust_image_access());
  const ImageShape shape{4, 3, 4};
  std::vector<float> texels(shape.count());
  for (size_t i = 0; i < texels.size(); ++i) texels[i] = static_cast<float>(i % 7);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> in, FloatImage(shape, &texels));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> out,
                       Tensor::CreateImage(TestDevice(), ElementType::kUInt32, {4, 3, 1},
                                           MemoryType::kDevice, nullptr));
  std::vector<uint32_t> t(12);
  for (uint32_t i = 0; i < 12; ++i) t[i] = 100 * i;
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> tensor,
      Tensor::Create(TestDevice(), ElementType::kUInt32, 12, 0, MemoryType::kDevice, t.data()));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kImageShader));
  AlgorithmSpec spec;
  spec.tensors = {in, out, tensor};
  spec.spirv = spirv;
  spec.workgroup = {4, 3, 1};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RunOps({op::Dispatch{algorithm}, op::SyncToHost{{out, tensor}}}));
  std::vector<uint32_t> expected_out(12), expected_t(12);
  for (uint32_t i = 0; i < 12; ++i) {
    float sum = 0;
    for (uint32_t c = 0; c < 4; ++c) sum += texels[i * 4 + c];
    expected_out[i] = static_cast<uint32_t>(sum) + t[i];
    expected_t[i] = 2 * t[i];
  }
  EXPECT_THAT(Host<uint32_t>(*out), ElementsAreArray(expected_out));
  EXPECT_THAT(Host<uint32_t>(*tensor), ElementsAreArray(expected_t));
}

// Reads and writes far outside a 2x2 image: robust image access reads zeros and drops the stores.
constexpr char kOutOfBoundsShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, r32f) uniform image2D img;
layout(set = 0, binding = 1) buffer O { float o[]; };
void main() {
  o[0] = imageLoad(img, ivec2(1000, 1000)).x;
  o[1] = imageLoad(img, ivec2(-5, 1)).x;
  o[2] = imageLoad(img, ivec2(1, 1)).x;
  imageStore(img, ivec2(2, 0), vec4(77.0));
  imageStore(img, ivec2(100000, 3), vec4(77.0));
}
)";

TEST(Image, OutOfBoundsAccessesReadZerosAndWriteNothing) {
  const std::vector<float> texels = {1, 2, 3, 4};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> img, FloatImage({2, 2, 1}, &texels));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> o, FloatTensor({-1, -1, -1}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kOutOfBoundsShader));
  AlgorithmSpec spec;
  spec.tensors = {img, o};
  spec.spirv = spirv;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RunOps({op::Dispatch{algorithm}, op::SyncToHost{{img, o}}}));
  EXPECT_THAT(Host<float>(*o), ElementsAreArray({0.0f, 0.0f, 4.0f}));
  EXPECT_THAT(Host<float>(*img), ElementsAreArray(texels));
}

constexpr char kBufferShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
void main() { a[0] = 1.0; }
)";

constexpr char kRgbaShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, rgba32f) uniform image2D img;
void main() { imageStore(img, ivec2(0), vec4(1.0)); }
)";

constexpr char kIntImageShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, r32i) uniform iimage2D img;
void main() { imageStore(img, ivec2(0), ivec4(1)); }
)";

TEST(Image, ShadersThatDoNotFitTheImageAreRefused) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> img, FloatImage({2, 2, 1}, nullptr));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> buffer, FloatTensor({0, 0, 0, 0}));
  struct Case {
    const char* source;
    std::shared_ptr<Tensor> bound;
    const char* error;
  };
  const Case cases[] = {
      {kBufferShader, img, "is no image"},
      {kRgbaShader, img, "format qualifier"},
      {kIntImageShader, img, "declare it image2D"},
      {kRgbaShader, buffer, "storage buffers"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(c.source));
    AlgorithmSpec spec;
    spec.tensors = {c.bound};
    spec.spirv = spirv;
    EXPECT_THAT(Algorithm::Create(TestDevice(), spec).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
}

TEST(Image, BarrierOnAnImage) {
  const std::vector<float> texels = {5, 6, 7, 8};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> img, FloatImage({2, 2, 1}, &texels));
  BarrierMasks masks;
  masks.src_access = VK_ACCESS_SHADER_WRITE_BIT;
  masks.dst_access = VK_ACCESS_TRANSFER_READ_BIT;
  masks.src_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  masks.dst_stage = VK_PIPELINE_STAGE_TRANSFER_BIT;
  Op barrier{OpKind::kBarrier, {img}};
  barrier.barrier = masks;
  Op staging = barrier;
  staging.barrier.primary = false;
  ASSERT_OK(RunOps({barrier, staging, op::SyncToHost{{img}}}));
  EXPECT_THAT(Host<float>(*img), ElementsAreArray(texels));
}

}  // namespace
}  // namespace komputed::core

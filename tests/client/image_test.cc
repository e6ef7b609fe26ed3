// 2-D images (kp::Image, Manager::image/imageT): round trips, copies between images and tensors,
// shaders over storage images, Kompute's memory-object lists, and what is refused.
#include <cstring>
#include <numeric>
#include <string>

#include "kp_test.h"

namespace kptest {
namespace {

using ::testing::Each;
using ::testing::ElementsAreArray;
using MemoryList = std::vector<std::shared_ptr<kp::Memory>>;

std::vector<float> Ramp(size_t n, float start = 0.25f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i % 1000) * 0.5f;
  return v;
}

TEST_P(KpTest, ImageRoundTrip) {
  const std::vector<float> data = Ramp(4 * 3 * 4);
  std::shared_ptr<kp::ImageT<float>> image = mgr().image(data, 4, 3, 4);
  EXPECT_EQ(image->getX(), 4u);
  EXPECT_EQ(image->getY(), 3u);
  EXPECT_EQ(image->getNumChannels(), 4u);
  EXPECT_EQ(image->size(), 48u);
  EXPECT_EQ(image->type(), kp::Memory::Type::eImage);
  EXPECT_EQ(image->dataType(), kp::Memory::DataTypes::eFloat);
  EXPECT_TRUE(image->isInit());
  EXPECT_THAT(image->vector(), ElementsAreArray(data));

  // Only the device keeps the texels through the host copy's reset.
  std::memset(image->data(), 0, image->memorySize());
  MemoryList memory = {image};
  mgr().sequence()->eval<kp::OpSyncLocal>(memory);
  EXPECT_THAT(image->vector(), ElementsAreArray(data));

  // Host → device → host again, with new texels.
  std::vector<float> changed = Ramp(48, -7.0f);
  image->setData(changed);
  mgr().sequence()->eval<kp::OpSyncDevice>({image});
  std::memset(image->data(), 0, image->memorySize());
  mgr().sequence()->eval<kp::OpSyncLocal>({image});
  EXPECT_THAT(image->vector(), ElementsAreArray(changed));
}

TEST_P(KpTest, ImagesOfEveryElementTypeAndChannelCount) {
  auto check = [&](auto sample) {
    using T = decltype(sample);
    for (uint32_t channels : {1u, 2u, 4u}) {
      SCOPED_TRACE(channels);
      std::vector<T> values(5 * 2 * channels);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<T>(i * 3 + 1);
      std::shared_ptr<kp::ImageT<T>> image = mgr().imageT<T>(values, 5, 2, channels);
      std::memset(image->data(), 0, image->memorySize());
      mgr().sequence()->eval<kp::OpSyncLocal>({image});
      EXPECT_EQ(image->vector(), values);
    }
  };
  check(int8_t{});
  check(uint8_t{});
  check(int16_t{});
  check(uint16_t{});
  check(int32_t{});
  check(uint32_t{});
  check(float{});
  // float16, as raw halves of small integers.
  std::vector<kp::float16> halves(3 * 3 * 2);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<float>(i);
  auto half_image = mgr().imageT<kp::float16>(halves, 3, 3, 2);
  std::memset(half_image->rawData(), 0, half_image->memorySize());
  mgr().sequence()->eval<kp::OpSyncLocal>({half_image});
  for (size_t i = 0; i < halves.size(); ++i) {
    EXPECT_EQ(static_cast<float>(half_image->vector()[i]), static_cast<float>(i));
  }
}

TEST_P(KpTest, CopiesBetweenImagesAndTensors) {
  const std::vector<uint32_t> values = [] {
    std::vector<uint32_t> v(8 * 8);
    std::iota(v.begin(), v.end(), 100u);
    return v;
  }();
  auto tensor = mgr().tensorT<uint32_t>(values);
  auto storage_image = mgr().imageT<uint32_t>(8, 8, 1, kp::Memory::MemoryTypes::eStorage);
  auto image = mgr().imageT<uint32_t>(8, 8, 1);
  auto back = mgr().tensorT<uint32_t>(std::vector<uint32_t>(64, 0));
  // tensor → storage image → image → tensor, all on the device.
  mgr()
      .sequence()
      ->record<kp::OpCopy>(MemoryList{tensor, storage_image})
      ->record<kp::OpCopy>(MemoryList{storage_image, image})
      ->record<kp::OpCopy>(MemoryList{image, back})
      ->record<kp::OpSyncLocal>({image, back})
      ->eval();
  EXPECT_EQ(back->vector(), values);
  EXPECT_EQ(image->vector(), values);
}

TEST_P(KpTest, ImagesAboveTheChunkingLimit) {
  // 16 MiB: above the inline limit of a remote create, in a storage image too.
  const uint32_t side = 1024;
  const std::vector<float> data = Ramp(size_t{side} * side * 4);
  auto storage_image = mgr().image(data, side, side, 4, kp::Memory::MemoryTypes::eStorage);
  auto image = mgr().image(side, side, 4);
  mgr().sequence()->eval<kp::OpCopy>({storage_image, image});
  mgr().sequence()->eval<kp::OpSyncLocal>({image});
  EXPECT_EQ(image->vector(), data);
}

// out(x, y) = uint(sum of in's channels) + t[y * width + x], and t doubled.
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

TEST_P(KpTest, ShaderOverImages) {
  std::vector<float> texels(6 * 5 * 4);
  for (size_t i = 0; i < texels.size(); ++i) texels[i] = static_cast<float>(i % 9);
  auto in = mgr().image(texels, 6, 5, 4);
  auto out = mgr().imageT<uint32_t>(6, 5, 1);
  std::vector<uint32_t> t(30);
  for (uint32_t i = 0; i < 30; ++i) t[i] = 1000 * i;
  auto tensor = mgr().tensorT<uint32_t>(t);
  const MemoryList memory = {in, out, tensor};
  auto algorithm = mgr().algorithm(memory, kp::compileSource(kImageShader), {6, 5, 1});
  EXPECT_EQ(algorithm->getMemObjects().size(), 3u);
  EXPECT_EQ(algorithm->getMemObjects()[0]->type(), kp::Memory::Type::eImage);
  mgr()
      .sequence()
      ->record<kp::OpSyncDevice>(memory)
      ->record<kp::OpAlgoDispatch>(algorithm)
      ->record<kp::OpSyncLocal>(memory)
      ->eval();
  std::vector<uint32_t> expected_out(30), expected_t(30);
  for (uint32_t i = 0; i < 30; ++i) {
    float sum = 0;
    for (uint32_t c = 0; c < 4; ++c) sum += texels[i * 4 + c];
    expected_out[i] = static_cast<uint32_t>(sum) + t[i];
    expected_t[i] = 2 * t[i];
  }
  EXPECT_THAT(out->vector(), ElementsAreArray(expected_out));
  EXPECT_THAT(tensor->vector(), ElementsAreArray(expected_t));
}

constexpr char kWrongFormatShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0, r32f) uniform image2D img;
void main() { imageStore(img, ivec2(0), vec4(1.0)); }
)";

TEST_P(KpTest, BadImagesAreRefused) {
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(4, 4, 1, kp::Memory::MemoryTypes::eHost));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(4, 4, 1, kp::Memory::MemoryTypes::eDeviceAndHost));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(4, 4, 5));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(0, 4, 1));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(std::vector<float>(15, 1.0f), 4, 4, 1));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(4, 4, 1, kp::Memory::DataTypes::eDouble));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().image(4, 4, 1, kp::Memory::DataTypes::eBool));
  // A copy between images of different shapes, and a shader whose format is not the image's.
  auto a = mgr().image(4, 2, 1);
  auto b = mgr().image(2, 4, 1);
  EXPECT_KP_ERROR(kInvalidArgument, mgr().sequence()->record<kp::OpCopy>({a, b}));
  auto rgba = mgr().image(2, 2, 4);
  EXPECT_KP_ERROR(kInvalidArgument,
                  mgr().algorithm({rgba}, kp::compileSource(kWrongFormatShader), {1, 1, 1}));
  // The session is still usable.
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  auto ok = mgr().image(values, 4, 2, 1);
  mgr().sequence()->eval<kp::OpCopy>({ok, a});
  std::memset(a->data(), 0, a->memorySize());
  mgr().sequence()->eval<kp::OpSyncLocal>({a});
  EXPECT_THAT(a->vector(), ElementsAreArray(values));
}

TEST_P(KpTest, RawImageOfADataType) {
  std::vector<int16_t> values = {-3, 7, -32768, 32767, 0, 1};
  std::shared_ptr<kp::Image> image =
      mgr().image(values.data(), values.size(), 3, 1, 2, kp::Memory::DataTypes::eShort);
  EXPECT_EQ(image->dataTypeMemorySize(), 2u);
  std::memset(image->rawData(), 0, image->memorySize());
  mgr().sequence()->eval<kp::OpSyncLocal>({image});
  EXPECT_EQ(image->vector<int16_t>(), values);
  auto zeros =
      mgr().image(2, 2, 1, kp::Memory::DataTypes::eUnsignedChar, kp::Memory::MemoryTypes::eDevice);
  EXPECT_THAT(zeros->vector<uint8_t>(), Each(0));
}

}  // namespace
}  // namespace kptest

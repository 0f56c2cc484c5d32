// Image preprocessing for vision-language models on the libuv pool (vision/image_preprocess.h):
//   qwen2VlPatches(rgb: Uint8Array, width, height, outWidth, outHeight, patch, merge, temporal,
//                  tables: Float32Array [3 * 256]) -> Promise<Float32Array>
// resizes rgb with Pillow's bicubic and lays out the Qwen2-VL patch rows, off the event loop.
// The sizes and tables are src/vision/qwen2-vl-preprocess.ts's; its TypeScript twin is the
// reference the tests hold this to.
//   gemma3Pixels(rgb: Uint8Array, width, height, outWidth, outHeight, tables: Float32Array [3 * 256])
//                -> Promise<Float32Array [3 * outHeight * outWidth]>
// resizes with Pillow's bilinear and lays the image out channels first (Gemma 3's processor;
// src/vision/gemma3-preprocess.ts is its reference).
//   loadVisionEncoder(modelDir, numThreads, cudaDevice = -1) -> Promise<VisionEncoder>
//   encoder.encode(pixelValues: Float32Array, grid: [t, h, w]) -> Promise<Float32Array [tokens * outHidden]>
//   encoder.encodeImage(image, tables), encoder.encodeImages(images, tables)
//   encoder.outHidden, encoder.device ('cpu' | 'cuda'), encoder.dispose()
// the vision tower config.json's architecture names: Gemma3ForConditionalGeneration's SigLIP
// tower and projector (vision/siglip_encoder.h: pixelValues [3, S, S] of one image, grid
// [1, S / patch, S / patch]), else the Qwen2.5-VL tower (vision/qwen2_vl_encoder.h: the patch
// rows, grid in patches; it refuses every other architecture). Encodes run on a dedicated thread
// (DedicatedThreads::vision), one at a time across every encoder: each one already spreads over
// its encoder's own compute threads, and queued encodes wait without holding libuv's pool.
// With cudaDevice >= 0 (a CUDA build) encodeImage / encodeImages run the tower on that device
// (cuda/vision_tower.h), uploaded from the CPU tower at load; encode() (the float input given by
// JS, for the reference tests) always runs the CPU tower.
#include <napi.h>

#include <atomic>
#include <memory>
#include <vector>

#include "dedicated_threads.h"
#include "promise_worker.h"
#include "vision/image_preprocess.h"
#include "vision/qwen2_vl_encoder.h"
#include "vision/resized_image.h"
#include "vision/siglip_encoder.h"
#ifdef SLUICE_WITH_CUDA
#include "cuda/vision_tower.h"
#endif

namespace sluice_addon {

namespace {

int int_arg(const Napi::CallbackInfo& info, size_t i, const char* name, int lo, int hi) {
  if (!info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), std::string(name) + " must be a number");
  const double v = info[i].As<Napi::Number>().DoubleValue();
  if (v != double(int64_t(v)) || v < lo || v > hi)
    throw Napi::RangeError::New(info.Env(), std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " +
                                                std::to_string(hi) + "]");
  return int(v);
}

// A float buffer handed to JS as an external ArrayBuffer, not zero-filled (every element is
// written before JS sees it).
struct FloatBuffer {
  std::unique_ptr<float[]> data;
  size_t size = 0;
  explicit FloatBuffer(size_t n) : data(new float[n]), size(n) {}
};

Napi::Float32Array to_js(Napi::Env env, FloatBuffer*& out) {
  FloatBuffer* owned = out;
  out = nullptr;
  Napi::ArrayBuffer buf = Napi::ArrayBuffer::New(env, owned->data.get(), owned->size * sizeof(float),
                                                 [](Napi::Env, void*, FloatBuffer* b) { delete b; }, owned);
  return Napi::Float32Array::New(env, owned->size, buf, 0);
}

// The image and the normalisation table args shared by both layouts; checks sizes.
struct ResizeArgs {
  int width, height, out_width, out_height;
  const uint8_t* src;
  const float* tables;
  std::shared_ptr<std::vector<Napi::ObjectReference>> inputs;  // keep the caller's arrays alive
};

ResizeArgs resize_args(const Napi::CallbackInfo& info, size_t tables_arg) {
  Napi::Env env = info.Env();
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(env, "rgb must be a Uint8Array");
  constexpr int kMaxSide = 1 << 16;
  ResizeArgs a{};
  a.width = int_arg(info, 1, "width", 1, kMaxSide);
  a.height = int_arg(info, 2, "height", 1, kMaxSide);
  a.out_width = int_arg(info, 3, "outWidth", 1, kMaxSide);
  a.out_height = int_arg(info, 4, "outHeight", 1, kMaxSide);
  Napi::Uint8Array rgb = info[0].As<Napi::Uint8Array>();
  if (rgb.ByteLength() != size_t(a.width) * size_t(a.height) * 3) throw Napi::RangeError::New(env, "rgb must hold width * height * 3 bytes");
  if (size_t(a.out_width) * size_t(a.out_height) > (size_t(1) << 28)) throw Napi::RangeError::New(env, "output image too large");
  if (!info[tables_arg].IsTypedArray() || info[tables_arg].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
      info[tables_arg].As<Napi::Float32Array>().ElementLength() != 3 * 256)
    throw Napi::TypeError::New(env, "tables must be a Float32Array of 768 values");
  Napi::Float32Array t = info[tables_arg].As<Napi::Float32Array>();
  a.src = rgb.Data();
  a.tables = t.Data();
  a.inputs = std::make_shared<std::vector<Napi::ObjectReference>>();
  a.inputs->push_back(Napi::Persistent(rgb.As<Napi::Object>()));
  a.inputs->push_back(Napi::Persistent(t.As<Napi::Object>()));
  return a;
}

Napi::Value Gemma3Pixels(const Napi::CallbackInfo& info) {
  const ResizeArgs a = resize_args(info, 5);
  auto* worker = new PromiseWorker<FloatBuffer*>(
      info.Env(),
      [a]() {
        std::unique_ptr<uint8_t[]> resized(new uint8_t[size_t(a.out_width) * size_t(a.out_height) * 3]);
        sluice::vision::resize_rgb(sluice::vision::ResizeFilter::kBilinear, a.src, a.width, a.height, resized.get(),
                                   a.out_width, a.out_height);
        auto out = std::make_unique<FloatBuffer>(size_t(3) * size_t(a.out_width) * size_t(a.out_height));
        sluice::vision::channels_first(resized.get(), a.out_width, a.out_height, a.tables, out->data.get());
        return out.release();
      },
      [inputs = a.inputs](Napi::Env e, FloatBuffer*& out) -> Napi::Value {
        inputs->clear();
        return to_js(e, out);
      });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

Napi::Value Qwen2VlPatches(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(env, "rgb must be a Uint8Array");
  constexpr int kMaxSide = 1 << 16;
  const int width = int_arg(info, 1, "width", 1, kMaxSide), height = int_arg(info, 2, "height", 1, kMaxSide);
  const int out_width = int_arg(info, 3, "outWidth", 1, kMaxSide), out_height = int_arg(info, 4, "outHeight", 1, kMaxSide);
  const int patch = int_arg(info, 5, "patch", 1, 64), merge = int_arg(info, 6, "merge", 1, 8);
  const int temporal = int_arg(info, 7, "temporal", 1, 8);
  Napi::Uint8Array rgb = info[0].As<Napi::Uint8Array>();
  if (rgb.ByteLength() != size_t(width) * size_t(height) * 3) throw Napi::RangeError::New(env, "rgb must hold width * height * 3 bytes");
  if (out_width % (patch * merge) != 0 || out_height % (patch * merge) != 0)
    throw Napi::RangeError::New(env, "outWidth and outHeight must be multiples of patch * merge");
  if (size_t(out_width) * size_t(out_height) > (size_t(1) << 28)) throw Napi::RangeError::New(env, "output image too large");
  if (!info[8].IsTypedArray() || info[8].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
      info[8].As<Napi::Float32Array>().ElementLength() != 3 * 256)
    throw Napi::TypeError::New(env, "tables must be a Float32Array of 768 values");
  // No copies on the event loop: the worker reads the caller's arrays (their memory stays put
  // while the references below keep them alive) and the result is its own buffer, handed to JS
  // as an external ArrayBuffer (a Float32Array made here would be zero-filled on this thread).
  const uint8_t* src = rgb.Data();
  Napi::Float32Array t = info[8].As<Napi::Float32Array>();
  const float* tables = t.Data();
  auto inputs = std::make_shared<std::vector<Napi::ObjectReference>>();
  inputs->push_back(Napi::Persistent(rgb.As<Napi::Object>()));
  inputs->push_back(Napi::Persistent(t.As<Napi::Object>()));
  const size_t rows = size_t(out_width / patch) * size_t(out_height / patch);
  const size_t dim = size_t(3) * size_t(temporal) * size_t(patch) * size_t(patch);
  // Neither buffer is zero-filled: both are written whole (zero-filling 15-50 MB of fresh pages
  // per image was a quarter of bench:vision's CPU time).
  auto* worker = new PromiseWorker<FloatBuffer*>(
      env,
      [=]() {
        std::unique_ptr<uint8_t[]> resized(new uint8_t[size_t(out_width) * size_t(out_height) * 3]);
        sluice::vision::resize_bicubic_rgb(src, width, height, resized.get(), out_width, out_height);
        auto out = std::make_unique<FloatBuffer>(rows * dim);
        sluice::vision::qwen2vl_patches(resized.get(), out_width, out_height, patch, merge, temporal, tables, out->data.get());
        return out.release();
      },
      [inputs](Napi::Env e, FloatBuffer*& out) -> Napi::Value {
        inputs->clear();
        return to_js(e, out);
      });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

using sluice::vision::ResizedImage;

// A resized image held natively (vision/resized_image.h): JS sees its size and hash, never its
// pixels, so preparing images makes no large JS allocations (their collection held the event
// loop). Its bytes are reported to V8 as external memory, so a forgotten image still gets
// collected in time.
class NativeImageWrap : public Napi::ObjectWrap<NativeImageWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "NativeImage",
                       {InstanceAccessor<&NativeImageWrap::Width>("width"),
                        InstanceAccessor<&NativeImageWrap::Height>("height"),
                        InstanceAccessor<&NativeImageWrap::Hash>("hash"),
                        InstanceAccessor<&NativeImageWrap::ByteLength>("byteLength"),
                        InstanceMethod<&NativeImageWrap::Pixels>("pixels")});
  }

  // Constructed only by resizeImage(): new NativeImage(external)
  explicit NativeImageWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeImageWrap>(info) {
    if (info.Length() != 1 || !info[0].IsExternal())
      throw Napi::TypeError::New(info.Env(), "use resizeImage() to create a native image");
    auto* holder = info[0].As<Napi::External<std::shared_ptr<const ResizedImage>>>().Data();
    image_ = std::move(*holder);
    delete holder;
    Napi::MemoryManagement::AdjustExternalMemory(info.Env(), int64_t(image_->bytes()));
    NAPI_THROW_IF_FAILED_VOID(info.Env(), napi_type_tag_object(info.Env(), info.This(), &kTag));
  }

  ~NativeImageWrap() override {
    if (image_) Napi::MemoryManagement::AdjustExternalMemory(Env(), -int64_t(image_->bytes()));
  }

  // The image of a JS value, or a TypeError naming `what`.
  static std::shared_ptr<const ResizedImage> unwrap(Napi::Env env, Napi::Value v, const char* what) {
    bool tagged = false;
    if (v.IsObject() && napi_check_object_type_tag(env, v, &kTag, &tagged) == napi_ok && tagged)
      return Unwrap(v.As<Napi::Object>())->image_;
    throw Napi::TypeError::New(env, std::string(what) + " must be an image from resizeImage()");
  }

 private:
  Napi::Value Width(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), image_->width); }
  Napi::Value Height(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), image_->height); }
  Napi::Value ByteLength(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(image_->bytes())); }
  Napi::Value Hash(const Napi::CallbackInfo& info) {
    return Napi::Buffer<uint8_t>::Copy(info.Env(), image_->sha256.data(), image_->sha256.size());
  }
  // A copy of the pixels [height, width, 3] (tests and references; the serving path never asks).
  Napi::Value Pixels(const Napi::CallbackInfo& info) {
    return Napi::Buffer<uint8_t>::Copy(info.Env(), image_->rgb.get(), image_->bytes());
  }

  // Marks NativeImage objects, so that unwrap() never reads another class's native pointer.
  static constexpr napi_type_tag kTag = {0x5a1c3e0f9b7d4c21ULL, 0x8e6a2b4d0c9f1e37ULL};

  std::shared_ptr<const ResizedImage> image_;
};

//   resizeImage(rgb: Uint8Array, width, height, outWidth, outHeight, filter: 'bicubic' | 'bilinear')
//     -> Promise<NativeImage>
// Pillow's resize and the SHA-256 of the result, on the libuv pool.
Napi::Value ResizeImage(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(env, "rgb must be a Uint8Array");
  constexpr int kMaxSide = 1 << 16;
  const int width = int_arg(info, 1, "width", 1, kMaxSide), height = int_arg(info, 2, "height", 1, kMaxSide);
  const int out_width = int_arg(info, 3, "outWidth", 1, kMaxSide), out_height = int_arg(info, 4, "outHeight", 1, kMaxSide);
  Napi::Uint8Array rgb = info[0].As<Napi::Uint8Array>();
  if (rgb.ByteLength() != size_t(width) * size_t(height) * 3) throw Napi::RangeError::New(env, "rgb must hold width * height * 3 bytes");
  if (size_t(out_width) * size_t(out_height) > (size_t(1) << 28)) throw Napi::RangeError::New(env, "output image too large");
  const std::string name = info[5].IsString() ? info[5].As<Napi::String>().Utf8Value() : "";
  if (name != "bicubic" && name != "bilinear") throw Napi::TypeError::New(env, "filter must be 'bicubic' or 'bilinear'");
  const auto filter = name == "bicubic" ? sluice::vision::ResizeFilter::kBicubic : sluice::vision::ResizeFilter::kBilinear;
  const uint8_t* src = rgb.Data();
  auto input = std::make_shared<Napi::ObjectReference>(Napi::Persistent(rgb.As<Napi::Object>()));
  auto* worker = new PromiseWorker<std::shared_ptr<const ResizedImage>>(
      env,
      [=]() { return sluice::vision::resize_for_encoder(filter, src, width, height, out_width, out_height); },
      [input, ctor = static_cast<Napi::FunctionReference*>(info.Data())](Napi::Env e, std::shared_ptr<const ResizedImage>& out) -> Napi::Value {
        input->Reset();
        auto* holder = new std::shared_ptr<const ResizedImage>(std::move(out));
        try {
          return ctor->New({Napi::External<std::shared_ptr<const ResizedImage>>::New(e, holder)});
        } catch (...) {
          delete holder;
          throw;
        }
      });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

using sluice::vision::SiglipEncoder;
using sluice::vision::VisionEncoder;

// A loaded encoder: exactly one of the two CPU towers is set, and the CUDA tower built from it when
// the encoder runs on a device.
struct AnyEncoder {
  std::shared_ptr<const VisionEncoder> qwen;
  std::shared_ptr<const SiglipEncoder> siglip;
#ifdef SLUICE_WITH_CUDA
  std::shared_ptr<sluice::cuda::VisionTower> gpu;
#endif
  explicit operator bool() const { return qwen || siglip; }
  int64_t out_hidden() const { return qwen ? qwen->out_hidden() : siglip->out_hidden(); }
  bool on_device() const {
#ifdef SLUICE_WITH_CUDA
    return gpu != nullptr;
#else
    return false;
#endif
  }
  std::vector<std::vector<float>> encode_batch(const std::vector<sluice::vision::EncoderImage>& batch) const {
#ifdef SLUICE_WITH_CUDA
    if (gpu) return gpu->encode_batch(batch);
#endif
    return siglip ? siglip->encode_batch(batch) : qwen->encode_batch(batch);
  }
};

// One JS VisionEncoder per native encoder. The encoder is shared with each worker using it, so
// dispose() (or garbage collection) while an encode runs frees it only when that encode is done.
class VisionEncoderWrap : public Napi::ObjectWrap<VisionEncoderWrap> {
 public:
  static Napi::Function Init(Napi::Env env) {
    return DefineClass(env, "VisionEncoder",
                       {InstanceMethod<&VisionEncoderWrap::Encode>("encode"),
                        InstanceMethod<&VisionEncoderWrap::EncodeImage>("encodeImage"),
                        InstanceMethod<&VisionEncoderWrap::EncodeImages>("encodeImages"),
                        InstanceMethod<&VisionEncoderWrap::Dispose>("dispose"),
                        InstanceAccessor<&VisionEncoderWrap::OutHidden>("outHidden"),
                        InstanceAccessor<&VisionEncoderWrap::Device>("device")});
  }

  // Constructed only by loadVisionEncoder(): new VisionEncoder(external)
  explicit VisionEncoderWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<VisionEncoderWrap>(info) {
    if (info.Length() != 1 || !info[0].IsExternal())
      throw Napi::TypeError::New(info.Env(), "use loadVisionEncoder() to create a vision encoder");
    auto* holder = info[0].As<Napi::External<AnyEncoder>>().Data();
    encoder_ = std::move(*holder);
    delete holder;
    out_hidden_ = encoder_.out_hidden();
    on_device_ = encoder_.on_device();
  }

 private:
  const AnyEncoder& encoder(Napi::Env env) {
    if (!encoder_) throw make_error(env, "DISPOSED", "the vision encoder has been disposed");
    return encoder_;
  }

  Napi::Value OutHidden(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(out_hidden_)); }
  Napi::Value Device(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), on_device_ ? "cuda" : "cpu"); }

  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    encoder_ = AnyEncoder{};
    return info.Env().Undefined();
  }

  Napi::Value Encode(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const AnyEncoder any = encoder(env);
    if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
      throw Napi::TypeError::New(env, "pixelValues must be a Float32Array");
    if (!info[1].IsArray() || info[1].As<Napi::Array>().Length() != 3)
      throw Napi::TypeError::New(env, "grid must be [t, h, w]");
    Napi::Array g = info[1].As<Napi::Array>();
    int grid[3];
    for (uint32_t i = 0; i < 3; i++) {
      Napi::Value v = g.Get(i);
      const double n = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
      if (n != double(int64_t(n)) || n < 1 || n > (1 << 16)) throw Napi::RangeError::New(env, "grid values must be integers in [1, 65536]");
      grid[i] = int(n);
    }
    Napi::Float32Array px = info[0].As<Napi::Float32Array>();
    const int64_t values = int64_t(px.ElementLength());
    if (any.siglip) {
      // A copy: JS memory must not be read off the event loop after this returns.
      auto in = std::make_shared<std::vector<float>>(px.Data(), px.Data() + values);
      return DedicatedThreads::vision().run<std::vector<float>>(
          env,
          [enc = any.siglip, in, t = grid[0], h = grid[1], w = grid[2]]() {
            return enc->encode(in->data(), int64_t(in->size()), t, h, w);
          },
          [](Napi::Env e, std::vector<float>& out) -> Napi::Value {
            Napi::Float32Array r = Napi::Float32Array::New(e, out.size());
            std::copy(out.begin(), out.end(), r.Data());
            return r;
          });
    }
    const std::shared_ptr<const VisionEncoder>& enc = any.qwen;
    const int64_t rows = int64_t(grid[0]) * grid[1] * grid[2];
    // patch_dim follows from the grid; a length that the grid does not divide is reported by the
    // encoder as a row count that does not match (rows are never read past the array).
    const int64_t patch_dim = values % rows == 0 ? values / rows : enc->config().patch_dim();
    const int64_t in_rows = values % rows == 0 ? rows : values / patch_dim;
    // A copy: JS memory must not be read off the event loop after this returns.
    auto in = std::make_shared<std::vector<float>>(px.Data(), px.Data() + values);
    // On the vision thread, not libuv's pool: an encode takes seconds, and encodes queued on the
    // pool would hold the threads that engine steps, file reads and image decoding need.
    return DedicatedThreads::vision().run<std::vector<float>>(
        env,
        [enc, in, in_rows, patch_dim, t = grid[0], h = grid[1], w = grid[2]]() {
          if (in_rows * patch_dim != int64_t(in->size()))
            throw sluice::Error(sluice::ErrorCode::kInvalidArgument,
                                "vision encoder: " + std::to_string(in->size()) + " pixel values are not whole rows of " +
                                    std::to_string(patch_dim) + " for grid (" + std::to_string(t) + ", " + std::to_string(h) +
                                    ", " + std::to_string(w) + ")");
          return enc->encode(in->data(), in_rows, patch_dim, t, h, w);
        },
        [](Napi::Env e, std::vector<float>& out) -> Napi::Value {
          Napi::Float32Array r = Napi::Float32Array::New(e, out.size());
          std::copy(out.begin(), out.end(), r.Data());
          return r;
        });
  }

  // encodeImage(image: NativeImage, tables: Float32Array [3 * 256]) -> Promise<Float32Array>: the
  // image's float input laid out (Qwen2-VL's patch rows, or channels first for SigLIP, a value
  // being tables[channel * 256 + byte]) and encoded, both on the vision thread.
  Napi::Value EncodeImage(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    std::vector<std::shared_ptr<const ResizedImage>> images{NativeImageWrap::unwrap(env, info[0], "image")};
    return encode_images(env, std::move(images), info[1], [](Napi::Env e, std::vector<std::vector<float>>& out) -> Napi::Value {
      return float_array(e, out[0]);
    });
  }

  // encodeImages(images: NativeImage[], tables) -> Promise<Float32Array[]>: encodeImage of each,
  // in one pass of the tower (its matrix products over every image's rows; the same values as
  // one at a time).
  Napi::Value EncodeImages(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray()) throw Napi::TypeError::New(env, "images must be an array");
    Napi::Array list = info[0].As<Napi::Array>();
    constexpr uint32_t kMaxImages = 256;
    if (list.Length() < 1 || list.Length() > kMaxImages)
      throw Napi::RangeError::New(env, "images must hold 1 to " + std::to_string(kMaxImages) + " images");
    std::vector<std::shared_ptr<const ResizedImage>> images;
    for (uint32_t i = 0; i < list.Length(); i++) images.push_back(NativeImageWrap::unwrap(env, list.Get(i), "each image"));
    return encode_images(env, std::move(images), info[1], [](Napi::Env e, std::vector<std::vector<float>>& out) -> Napi::Value {
      Napi::Array r = Napi::Array::New(e, out.size());
      for (uint32_t i = 0; i < out.size(); i++) r.Set(i, float_array(e, out[i]));
      return r;
    });
  }

  static Napi::Float32Array float_array(Napi::Env env, const std::vector<float>& v) {
    Napi::Float32Array r = Napi::Float32Array::New(env, v.size());
    std::copy(v.begin(), v.end(), r.Data());
    return r;
  }

  template <typename Convert>
  Napi::Value encode_images(Napi::Env env, std::vector<std::shared_ptr<const ResizedImage>> images, Napi::Value tables_arg,
                            Convert convert) {
    const AnyEncoder any = encoder(env);
    if (!tables_arg.IsTypedArray() || tables_arg.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
        tables_arg.As<Napi::Float32Array>().ElementLength() != 3 * 256)
      throw Napi::TypeError::New(env, "tables must be a Float32Array of 768 values");
    Napi::Float32Array t = tables_arg.As<Napi::Float32Array>();
    auto tables = std::make_shared<std::vector<float>>(t.Data(), t.Data() + 3 * 256);
    if (any.qwen) {
      const int64_t unit = any.qwen->config().patch * any.qwen->config().merge;
      for (const auto& image : images)
        if (image->width % unit != 0 || image->height % unit != 0)
          throw Napi::RangeError::New(env, "the image's sides must be multiples of patch * merge (" + std::to_string(unit) + ")");
    }
    // On the vision thread, not libuv's pool: an encode takes seconds, and encodes queued on the
    // pool would hold the threads that engine steps, file reads and image decoding need.
    return DedicatedThreads::vision().run<std::vector<std::vector<float>>>(
        env,
        [any, images = std::move(images), tables]() {
          // Each image's float input, made here and freed with the batch.
          std::vector<std::vector<float>> values;
          std::vector<sluice::vision::EncoderImage> batch;
          values.reserve(images.size());
          for (const auto& image : images) {
            if (any.siglip) {
              const int patch = int(any.siglip->config().patch);
              values.push_back(sluice::vision::channels_first_values(*image, tables->data()));
              batch.push_back({nullptr, int64_t(values.back().size()), 1, image->height / patch, image->width / patch});
            } else {
              const sluice::vision::VisionConfig& c = any.qwen->config();
              values.push_back(sluice::vision::qwen2vl_patch_rows(*image, int(c.patch), int(c.merge), int(c.temporal), tables->data()));
              batch.push_back({nullptr, int64_t(values.back().size()), 1, int(image->height / c.patch), int(image->width / c.patch)});
            }
            batch.back().pixel_values = values.back().data();
          }
          return any.encode_batch(batch);
        },
        convert);
  }

  AnyEncoder encoder_;
  int64_t out_hidden_ = 0;
  bool on_device_ = false;
};

Napi::Value LoadVisionEncoder(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString()) throw Napi::TypeError::New(env, "modelDir must be a string");
  const std::string dir = info[0].As<Napi::String>().Utf8Value();
  const int threads = info[1].IsUndefined() ? 0 : int_arg(info, 1, "numThreads", 0, 1024);
  const int device = info.Length() < 3 || info[2].IsUndefined() ? -1 : int_arg(info, 2, "cudaDevice", -1, 1023);
  auto* ctor = static_cast<Napi::FunctionReference*>(info.Data());
  auto* worker = new PromiseWorker<AnyEncoder>(
      env,
      [dir, threads, device]() {
        AnyEncoder enc;
        if (sluice::vision::model_architecture(dir) == "Gemma3ForConditionalGeneration")
          enc.siglip = SiglipEncoder::load(dir, threads);
        else
          enc.qwen = VisionEncoder::load(dir, threads);
        if (device >= 0) {
#ifdef SLUICE_WITH_CUDA
          enc.gpu = enc.siglip ? sluice::cuda::VisionTower::siglip(enc.siglip, device)
                               : sluice::cuda::VisionTower::qwen2vl(enc.qwen, device);
#else
          throw sluice::Error(sluice::ErrorCode::kBackendUnavailable, "this build has no CUDA backend for the vision tower");
#endif
        }
        return enc;
      },
      [ctor](Napi::Env e, AnyEncoder& enc) -> Napi::Value {
        auto* holder = new AnyEncoder(std::move(enc));
        try {
          return ctor->New({Napi::External<AnyEncoder>::New(e, holder)});
        } catch (...) {
          delete holder;
          throw;
        }
      });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

}  // namespace

void init_vision(Napi::Env env, Napi::Object exports) {
  exports.Set("qwen2VlPatches", Napi::Function::New(env, Qwen2VlPatches));
  exports.Set("gemma3Pixels", Napi::Function::New(env, Gemma3Pixels));
  // The class constructor, kept for loadVisionEncoder's results; freed with the environment.
  auto* ctor = new Napi::FunctionReference(Napi::Persistent(VisionEncoderWrap::Init(env)));
  env.AddCleanupHook([ctor]() { delete ctor; });
  exports.Set("loadVisionEncoder", Napi::Function::New(env, LoadVisionEncoder, "loadVisionEncoder", ctor));
  auto* image_ctor = new Napi::FunctionReference(Napi::Persistent(NativeImageWrap::Init(env)));
  env.AddCleanupHook([image_ctor]() { delete image_ctor; });
  exports.Set("resizeImage", Napi::Function::New(env, ResizeImage, "resizeImage", image_ctor));
}

}  // namespace sluice_addon

// Image preprocessing for vision-language models on the libuv pool (vision/image_preprocess.h):
//   qwen2VlPatches(rgb: Uint8Array, width, height, outWidth, outHeight, patch, merge, temporal,
//                  tables: Float32Array [3 * 256]) -> Promise<Float32Array>
// resizes rgb with Pillow's bicubic and lays out the Qwen2-VL patch rows, off the event loop.
// The sizes and tables are src/vision/qwen2-vl-preprocess.ts's; its TypeScript twin is the
// reference the tests hold this to.
#include <napi.h>

#include <memory>
#include <vector>

#include "promise_worker.h"
#include "vision/image_preprocess.h"

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
  // Copies: the worker must not read JS memory that may move or be freed before it runs.
  auto in = std::make_shared<std::vector<uint8_t>>(rgb.Data(), rgb.Data() + rgb.ByteLength());
  Napi::Float32Array t = info[8].As<Napi::Float32Array>();
  auto tables = std::make_shared<std::vector<float>>(t.Data(), t.Data() + 768);
  const size_t rows = size_t(out_width / patch) * size_t(out_height / patch);
  const size_t dim = size_t(3) * size_t(temporal) * size_t(patch) * size_t(patch);
  // The result array is made here and filled by the worker (its memory does not move while the
  // reference below keeps it alive): no copy of the patch rows back into JS.
  Napi::Float32Array result = Napi::Float32Array::New(env, rows * dim);
  float* dst = result.Data();
  auto keep = std::make_shared<Napi::ObjectReference>(Napi::Persistent(result.As<Napi::Object>()));
  auto* worker = new PromiseWorker<bool>(
      env,
      [=]() {
        std::vector<uint8_t> resized(size_t(out_width) * size_t(out_height) * 3);
        sluice::vision::resize_bicubic_rgb(in->data(), width, height, resized.data(), out_width, out_height);
        sluice::vision::qwen2vl_patches(resized.data(), out_width, out_height, patch, merge, temporal, tables->data(), dst);
        return true;
      },
      [keep](Napi::Env, bool&) -> Napi::Value { return keep->Value(); });
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

}  // namespace

void init_vision(Napi::Env env, Napi::Object exports) {
  exports.Set("qwen2VlPatches", Napi::Function::New(env, Qwen2VlPatches));
}

}  // namespace sluice_addon

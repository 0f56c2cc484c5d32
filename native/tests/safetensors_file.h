// Writes a safetensors file from raw tensors (any dtype the format names), for the native tests'
// checkpoint writers.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace sluice_test {

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I64", "BOOL", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// <dir>/model.safetensors (dir is created).
inline void write_safetensors(const std::string& dir, const std::vector<RawTensor>& tensors) {
  std::string header = "{";
  size_t offset = 0;
  for (const RawTensor& t : tensors) {
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); i++) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + t.bytes.size()) + "]},";
    offset += t.bytes.size();
  }
  header += "\"__metadata__\":{\"format\":\"pt\"}}";
  while (header.size() % 8) header += ' ';
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::ofstream st(dir + "/model.safetensors", std::ios::binary);
  const uint64_t len = header.size();
  st.write(reinterpret_cast<const char*>(&len), 8);
  st.write(header.data(), std::streamsize(header.size()));
  for (const RawTensor& t : tensors) st.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

}  // namespace sluice_test

// Memory-mapped safetensors files: single model.safetensors or sharded with
// model.safetensors.index.json. Tensors point straight into the mapping (no copies).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sluice/dtype.h"

namespace sluice {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the file it came from, for error messages

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string shape_string() const;
  // Element i of a float tensor (f32, f16 or bf16) as f32 (unaligned data allowed).
  float float_at(int64_t i) const;
};

class MappedFile {
 public:
  // Throws sluice::Error kModelFileMissing when the file cannot be opened.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class SafetensorsModel {
 public:
  // Opens <dir>/model.safetensors.index.json if present, else <dir>/model.safetensors.
  static std::unique_ptr<SafetensorsModel> open_dir(const std::string& dir);
  // Parses one file and adds its tensors (also used by tests).
  void add_file(const std::string& path);

  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  size_t total_bytes() const;

 private:
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

std::string read_text_file(const std::string& path);  // kModelFileMissing if absent
bool file_exists(const std::string& path);

}  // namespace sluice

#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "sluice/error.h"
#include "util/json.h"

namespace sluice {

float TensorView::float_at(int64_t i) const {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (dtype == DType::F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kModelFileMissing, path + ": cannot open file (" + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kModelFileMissing, path + ": cannot open file (" + std::strerror(errno) + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorCode::kModelFileInvalid, path + ": not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(ErrorCode::kModelFileInvalid, path + ": mmap failed (" + std::strerror(err) + ")");
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else if (s == "U8") *out = DType::U8;
  else if (s == "F8_E4M3") *out = DType::F8E4M3;
  else if (s == "I32") *out = DType::I32;
  else if (s == "I64") *out = DType::I64;
  else if (s == "BOOL") *out = DType::U8;  // one byte each
  else return false;
  return true;
}

std::string dir_join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

}  // namespace

void SafetensorsModel::add_file(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  auto invalid = [&](const std::string& what) -> Error {
    return Error(ErrorCode::kModelFileInvalid, path + ": " + what);
  };
  if (file->size() < 8) throw invalid("file too small to be safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);  // little-endian on every supported host
  if (header_len > file->size() - 8 || header_len > (uint64_t(100) << 20))
    throw invalid("header length " + std::to_string(header_len) + " exceeds the file");
  json::Value header;
  try {
    header = json::parse(std::string_view(reinterpret_cast<const char*>(file->data() + 8), header_len));
  } catch (const std::exception& e) {
    throw invalid(std::string("corrupt header: ") + e.what());
  }
  if (!header.is_object()) throw invalid("header is not a JSON object");
  const uint8_t* base = file->data() + 8 + header_len;
  const size_t data_size = file->size() - 8 - header_len;

  for (const auto& [name, meta] : header.as_object()) {
    if (name == "__metadata__") continue;
    const json::Value* dt = meta.find("dtype");
    const json::Value* shape = meta.find("shape");
    const json::Value* offs = meta.find("data_offsets");
    if (!dt || !dt->is_string() || !shape || !shape->is_array() || !offs || !offs->is_array() ||
        offs->as_array().size() != 2)
      throw invalid("tensor \"" + name + "\" has a malformed entry");
    TensorView t;
    t.name = name;
    t.file = path;
    if (!parse_dtype(dt->as_string(), &t.dtype))
      throw Error(ErrorCode::kUnsupportedModel, path + ": tensor \"" + name + "\" has dtype " + dt->as_string() +
                                                    " (supported: F32, F16, BF16, U8, F8_E4M3, I32)");
    for (const auto& d : shape->as_array()) {
      if (!d.is_number() || d.as_number() < 0) throw invalid("tensor \"" + name + "\" has a bad shape");
      t.shape.push_back(int64_t(d.as_number()));
    }
    double b = offs->as_array()[0].as_number(), e = offs->as_array()[1].as_number();
    if (b < 0 || e < b || e > double(data_size))
      throw invalid("tensor \"" + name + "\" data_offsets lie outside the file (truncated?)");
    t.nbytes = size_t(e - b);
    if (t.nbytes != size_t(t.numel()) * dtype_size(t.dtype))
      throw invalid("tensor \"" + name + "\" byte size does not match its shape " + t.shape_string());
    t.data = base + size_t(b);
    if (tensors_.count(name)) throw invalid("tensor \"" + name + "\" appears in more than one file");
    tensors_.emplace(name, std::move(t));
  }
  files_.push_back(std::move(file));
}

std::unique_ptr<SafetensorsModel> SafetensorsModel::open_dir(const std::string& dir) {
  auto model = std::make_unique<SafetensorsModel>();
  const std::string index_path = dir_join(dir, "model.safetensors.index.json");
  if (file_exists(index_path)) {
    json::Value index;
    try {
      index = json::parse(read_text_file(index_path));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kModelFileInvalid, index_path + ": " + e.what());
    }
    const json::Value* map = index.find("weight_map");
    if (!map || !map->is_object()) throw Error(ErrorCode::kModelFileInvalid, index_path + ": missing \"weight_map\"");
    std::set<std::string> shards;
    for (const auto& [name, file] : map->as_object()) {
      if (!file.is_string() || file.as_string().find('/') != std::string::npos)
        throw Error(ErrorCode::kModelFileInvalid, index_path + ": bad shard name for \"" + name + "\"");
      shards.insert(file.as_string());
    }
    for (const std::string& shard : shards) model->add_file(dir_join(dir, shard));
    for (const auto& [name, file] : map->as_object())
      if (!model->find(name))
        throw Error(ErrorCode::kModelFileInvalid, dir_join(dir, file.as_string()) + ": tensor \"" + name +
                                                      "\" listed in the index is missing");
  } else {
    const std::string single = dir_join(dir, "model.safetensors");
    if (!file_exists(single))
      throw Error(ErrorCode::kModelFileMissing,
                  single + ": no model.safetensors or model.safetensors.index.json in " + dir);
    model->add_file(single);
  }
  return model;
}

const TensorView* SafetensorsModel::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

size_t SafetensorsModel::total_bytes() const {
  size_t n = 0;
  for (const auto& kv : tensors_) n += kv.second.nbytes;
  return n;
}

}  // namespace sluice

// A read-only memory map of a whole file (RAII). Pages are read lazily by the kernel, so
// mapping a multi-GB model costs nothing until tensors are touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace hablar {

class MappedFile {
 public:
  // Throws Error(kIo) naming the path and the OS reason.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hablar

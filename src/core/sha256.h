// SHA-256 (FIPS 180-4), for the model file digests Ollama's clients show (/api/tags). Written
// here because no other dependency needs a crypto library; it is not used for security.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hablar {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  std::array<uint8_t, 32> digest();  // ends the hash; update() must not follow
  std::string hex_digest();          // 64 lowercase hex digits

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

// The hex SHA-256 of a file's bytes, read in pieces; throws Error(kNotFound) when it
// cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace hablar

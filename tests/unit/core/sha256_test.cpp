#include "core/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace hablar {
namespace {

std::string hex(std::string_view s) {
  Sha256 h;
  h.update(s.data(), s.size());
  return h.hex_digest();
}

// FIPS 180-4 examples, and lengths around the 55/56/64-byte padding boundaries.
TEST(Sha256, KnownDigests) {
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, PiecesEqualWhole) {
  const std::string text(1000, 'x');
  Sha256 h;
  for (size_t i = 0; i < text.size(); i += 7)
    h.update(text.data() + i, std::min<size_t>(7, text.size() - i));
  EXPECT_EQ(h.hex_digest(), hex(text));
}

}  // namespace
}  // namespace hablar

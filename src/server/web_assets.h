// Static files of the web page, embedded into the binary by a CMake step
// (cmake/EmbedFile.cmake turns src/server/web/index.html into a byte array).
#pragma once

#include <cstddef>

namespace hablar::server {

struct WebAsset {
  const unsigned char* data;
  size_t size;
};

const WebAsset& web_asset_index_html();

}  // namespace hablar::server

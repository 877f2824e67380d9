// The built-in chat page at "/": static files embedded at build time (web_assets.h).
#include <httplib.h>

#include "server/http_server.h"
#include "server/web_assets.h"

namespace hablar::server {

void install_web_routes(Router& http, HttpServer& server) {
  if (!server.options().enable_webui) return;
  auto page = [](const httplib::Request&, httplib::Response& res) {
    const WebAsset& a = web_asset_index_html();
    res.set_content(reinterpret_cast<const char*>(a.data), a.size, "text/html; charset=utf-8");
  };
  http.Get("/", page);
  http.Get("/index.html", page);
}

}  // namespace hablar::server

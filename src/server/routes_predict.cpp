// Vertex AI (Google Cloud) custom-container prediction. The platform sends
//   POST <predict route> {"instances": [{"@requestFormat": "chatCompletions", ...}, ...]}
// and reads {"predictions": [...]}, one entry per instance in order. Each instance is the
// body of one of the server's own POST routes, named by "@requestFormat": a route's path
// ("/v1/chat/completions") or its camelCase name (a leading /v1 dropped, a capital after
// each / - or _: "chatCompletions", "apiChat", "applyTemplate"). Instances run at once, each
// through the server's routing (auth, limits, errors) as a non-streamed request; an instance
// that fails gets its error body as its prediction, so one bad instance spoils no other.
// The request's optional "parameters" object gives fields to every instance (an instance's
// own fields win), as Vertex AI's prediction schema pairs instances with parameters.
#include <httplib.h>
#include <future>
#include <map>

#include "core/error.h"
#include "server/api_error.h"
#include "server/http_server.h"

namespace hablar::server {
namespace {

using nlohmann::json;

// The most instances one prediction request may carry (each becomes a generation).
constexpr size_t kMaxInstances = 128;

std::string camel_case_name(std::string_view path) {
  if (path.starts_with("/v1/")) path.remove_prefix(3);
  if (path.starts_with("/")) path.remove_prefix(1);
  std::string out;
  bool upper = false;
  for (char c : path) {
    if (c == '/' || c == '-' || c == '_') {
      upper = !out.empty();
      continue;
    }
    out.push_back(upper ? (char)std::toupper((unsigned char)c) : c);
    upper = false;
  }
  return out;
}

// "@requestFormat" -> the route's path; the first route of a name keeps it.
using FormatTable = std::map<std::string, std::string, std::less<>>;

FormatTable format_table(const Router& router, const std::string& predict_route) {
  FormatTable table;
  for (const std::string& path : router.plain_paths("POST")) {
    if (path == predict_route) continue;
    table.emplace(path, path);
    table.emplace(camel_case_name(path), path);
  }
  return table;
}

json instance_error(int status, const std::string& message) {
  return error_body(ErrorStyle::kOpenAI, status, message);
}

// One instance through its route, on a helper thread that sees the outer client's departure.
json run_instance(HttpServer& server, const httplib::Request& outer, const FormatTable& formats,
                  const json& instance, const json& parameters) {
  if (!instance.is_object()) return instance_error(400, "each instance must be a JSON object");
  const auto format = instance.find("@requestFormat");
  if (format == instance.end() || !format->is_string())
    return instance_error(400, "each instance needs \"@requestFormat\", a string naming a route");
  const auto target = formats.find(format->get<std::string>());
  if (target == formats.end())
    return instance_error(400, "no route for @requestFormat " +
                                   text_excerpt(format->get<std::string>(), 100) +
                                   " (a POST path such as /v1/chat/completions, or its "
                                   "camelCase name such as chatCompletions)");
  json body = parameters;  // the request's shared "parameters", each instance's own over them
  body.update(instance);
  body.erase("@requestFormat");
  body["stream"] = false;  // a prediction is one JSON value; Ollama's routes stream by default
  httplib::Request req;
  req.method = "POST";
  req.path = target->second;
  req.target = target->second;
  req.version = outer.version;
  req.remote_addr = outer.remote_addr;
  req.remote_port = outer.remote_port;
  req.headers = outer.headers;
  req.headers.erase("Content-Length");
  req.headers.erase("Content-Encoding");
  req.headers.erase("Content-Type");
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  httplib::Response res;
  server.dispatch(req, res);
  // A route that streams anyway is refused; dropping its response cancels the generation.
  if (res.is_chunked_content_provider_)
    return instance_error(400, "route " + target->second + " streams; predictions cannot");
  json out = json::parse(res.body, nullptr, false);
  return out.is_discarded() ? json(res.body) : out;
}

void predict(HttpServer& server, const FormatTable& formats, const httplib::Request& req,
             httplib::Response& res) {
  handle_json(req, res, [&] {
    const json body = request_json(req);
    const auto instances = body.find("instances");
    if (instances == body.end() || !instances->is_array())
      throw ApiError(400, "the body needs \"instances\", an array of request bodies", "instances");
    if (instances->size() > kMaxInstances)
      throw ApiError(400, "at most " + std::to_string(kMaxInstances) + " instances per prediction",
                     "instances");
    json parameters = json::object();
    if (const auto p = body.find("parameters"); p != body.end() && !p->is_null()) {
      if (!p->is_object())
        throw ApiError(400, "\"parameters\" must be an object of fields every instance gets",
                       "parameters");
      parameters = *p;
    }
    const std::atomic<bool>* watch = client_watch();
    std::vector<std::future<json>> running;
    for (const json& instance : *instances)
      running.push_back(std::async(std::launch::async, [&, watch, instance] {
        ClientWatchScope scope(watch);
        try {
          return run_instance(server, req, formats, instance, parameters);
        } catch (const std::exception& e) {  // e.g. no thread or memory for the instance
          return instance_error(500, text_excerpt(e.what(), 200));
        }
      }));
    json predictions = json::array();
    for (auto& r : running) predictions.push_back(r.get());
    send_json(res, {{"predictions", std::move(predictions)}});
  });
}

}  // namespace

void install_predict_routes(Router& http, HttpServer& server) {
  const ServerOptions& o = server.options();
  if (o.predict_route.empty()) return;
  std::string allow;
  for (const char* method : {"POST", "GET"}) {
    httplib::Request probe;
    probe.method = method;
    probe.path = o.predict_route;
    if (http.find(probe, allow))
      throw_error(ErrorKind::kInvalidArgument,
                  "the predict route " + o.predict_route + " is already one of the server's");
  }
  auto formats = std::make_shared<const FormatTable>(format_table(http, o.predict_route));
  http.Post(o.predict_route,
            [&server, formats](const httplib::Request& req, httplib::Response& res) {
              predict(server, *formats, req, res);
            });
  if (!o.predict_health_route.empty() && o.predict_health_route != "/health") {
    http.Get(o.predict_health_route,
             [&server](const httplib::Request& req, httplib::Response& res) {
               httplib::Request health = req;
               health.path = "/health";
               server.dispatch(health, res);
             });
  }
}

}  // namespace hablar::server

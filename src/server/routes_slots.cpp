// llama-server's slot routes over hablar's unified cache (server/slot_table.h):
//   GET  /slots                       every slot, what runs on it
//   POST /slots/{id}?action=save      {"filename"}: the K/V of the slot's history to a file
//   POST /slots/{id}?action=restore   {"filename"}: a file's K/V into the prefix cache; the
//                                     slot's history becomes the file's tokens
//   POST /slots/{id}?action=erase     the history's K/V taken out of the prefix cache
// Files live in --slot-save-path only (a plain file name, no directories) and are written
// atomically (a temporary file, then a rename); their format is docs/slot-files.md. The K/V
// is copied between the engine's steps (engine/kv_snapshot.h).
#include <fcntl.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "engine/kv_snapshot.h"
#include "model/fingerprint.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/request_fields.h"

namespace hablar::server {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The value of `key` in the request target's query string, percent-decoded ('+' a space);
// nullopt when the query does not name it.
std::optional<std::string> query_param(const httplib::Request& req, std::string_view key) {
  const size_t q = req.target.find('?');
  if (q == std::string::npos) return std::nullopt;
  const std::string_view query = std::string_view(req.target).substr(q + 1);
  for (size_t a = 0, b; a <= query.size(); a = b + 1) {
    b = std::min(query.find('&', a), query.size());
    const std::string_view pair = query.substr(a, b - a);
    const size_t eq = std::min(pair.find('='), pair.size());
    if (pair.substr(0, eq) != key) continue;
    std::string value;
    for (size_t i = eq + 1; i < pair.size(); ++i) {
      const char c = pair[i];
      if (c == '%' && i + 2 < pair.size() && std::isxdigit((unsigned char)pair[i + 1]) &&
          std::isxdigit((unsigned char)pair[i + 2])) {
        value += (char)std::stoi(std::string(pair.substr(i + 1, 2)), nullptr, 16);
        i += 2;
      } else {
        value += c == '+' ? ' ' : c;
      }
    }
    return value;
  }
  return std::nullopt;
}

// The slot id in the path: 400 unless a decimal number below the server's slot count.
int32_t parse_slot_id(const std::string& text, int32_t n_slots) {
  const bool digits =
      !text.empty() && text.size() <= 9 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t id = digits ? std::stoll(text) : -1;
  if (id < 0 || id >= n_slots)
    bad_request("invalid slot id " + text_excerpt(text) + ": slots are numbered 0 to " +
                    std::to_string(n_slots - 1) + " (-np)",
                "id_slot");
  return (int32_t)id;
}

// A file name inside the slot directory: 1 to 255 bytes, no path separator or other
// character file systems treat specially, no control character, not starting with a dot
// (".", "..", hidden files and this server's temporary files) nor ending with a space.
std::string checked_filename(const json& body) {
  const std::optional<std::string> name = opt_string(body, "filename");
  if (!name) bad_request("'filename' is required: the slot file's name", "filename");
  const std::string& n = *name;
  const bool ok = !n.empty() && n.size() <= 255 && n[0] != '.' && n.back() != ' ' &&
                  std::none_of(n.begin(), n.end(), [](char c) {
                    const auto u = (unsigned char)c;
                    return u < 0x20 || u == 0x7f ||
                           std::string_view("/\\:*?\"<>|").find(c) != std::string_view::npos;
                  });
  if (!ok)
    bad_request("invalid filename " + text_excerpt(n) +
                    ": a plain file name (1 to 255 bytes, no path separators, control "
                    "characters or any of :*?\"<>|, not starting with a dot)",
                "filename");
  return n;
}

// What the model's K/V is, for a file's header; 501 when this executor cannot copy its cache.
engine::KvIdentity kv_identity(const ServingModel& m) {
  engine::KvIdentity id;
  std::string why;
  if (!m.executor->kv_snapshot_layout(&id.layout, &why))
    throw ApiError(501, "slot save and restore are not supported for this model: " + why);
  id.arch = m.model->config().arch;
  id.model_fingerprint =
      model::kv_fingerprint(*m.model, (int64_t)id.layout.n_blocks * id.layout.block_size);
  return id;
}

// Runs an engine or file operation, its errors as the slot routes answer them: a bad or
// foreign file 400, an executor that cannot 501, a cache too full for now 503.
template <typename Fn>
auto slot_operation(Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    const ErrorKind k = e.kind();
    const int status = k == ErrorKind::kFormat || k == ErrorKind::kInvalidArgument ? 400
                       : k == ErrorKind::kUnsupported                              ? 501
                       : k == ErrorKind::kResource                                 ? 503
                                                                                   : 500;
    throw ApiError(status, e.what());
  }
}

// Writes the file under a temporary name in the same directory, flushes it to disk and
// renames it over `path`: a reader never sees half a file. Returns the bytes written.
uint64_t write_atomically(const fs::path& path, const engine::KvSnapshot& snapshot,
                          const engine::KvIdentity& identity) {
  std::string tmp_name(1, '.');  // (appended piecewise: GCC 12 misreads "." + string)
  tmp_name.append(path.filename().string()).append(".tmp-").append(random_id("").substr(0, 12));
  const fs::path tmp = path.parent_path() / tmp_name;
  uint64_t written = 0;
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw_error(ErrorKind::kIo, "cannot create " + tmp.string());
      written = engine::write_slot_file(out, snapshot, identity);
      out.flush();
      if (!out) throw_error(ErrorKind::kIo, "writing " + tmp.string() + " failed (disk full?)");
    }
    if (const int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) {
      (void)::fsync(fd);
      ::close(fd);
    }
    fs::rename(tmp, path);
  } catch (const std::exception& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    if (dynamic_cast<const Error*>(&e)) throw;
    throw_error(ErrorKind::kIo, std::string("saving the slot file failed: ") + e.what());
  }
  return written;
}

void save_slot(HttpServer& server, ServingModel& m, int32_t slot, const httplib::Request& req,
               httplib::Response& res) {
  const engine::KvIdentity identity = kv_identity(m);
  const std::string filename = checked_filename(request_json(req));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> history = m.slot_table()->history(slot);
  const engine::KvSnapshot snapshot =
      slot_operation([&] { return engine::save_prefix(*m.engine, history); });
  const fs::path path = fs::path(server.options().slot_save_path) / filename;
  const uint64_t written =
      slot_operation([&] { return write_atomically(path, snapshot, identity); });
  send_json(res, {{"id_slot", slot},
                  {"filename", filename},
                  {"n_saved", snapshot.tokens.size()},
                  {"n_written", written},
                  {"timings", {{"save_ms", ms_since(t0)}}}});
}

void restore_slot(HttpServer& server, ServingModel& m, int32_t slot, const httplib::Request& req,
                  httplib::Response& res) {
  const engine::KvIdentity identity = kv_identity(m);
  const std::string filename = checked_filename(request_json(req));
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path path = fs::path(server.options().slot_save_path) / filename;
  std::error_code ec;
  const uint64_t size = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
  std::ifstream in(path, std::ios::binary);
  if (ec || !fs::is_regular_file(path, ec) || !in)
    bad_request("there is no slot file " + text_excerpt(filename) + " in the slot directory",
                "filename");
  const engine::KvSnapshot snapshot = slot_operation(
      [&] { return engine::read_slot_file(in, size, identity, m.model->config().n_vocab); });
  slot_operation([&] { engine::restore_prefix(*m.engine, snapshot); });
  m.slot_table()->set_history(slot, snapshot.tokens);
  send_json(res, {{"id_slot", slot},
                  {"filename", filename},
                  {"n_restored", snapshot.tokens.size()},
                  {"n_read", size},
                  {"timings", {{"restore_ms", ms_since(t0)}}}});
}

void erase_slot(ServingModel& m, int32_t slot, httplib::Response& res) {
  const std::vector<int32_t> history = m.slot_table()->history(slot);
  if (!history.empty()) slot_operation([&] { return engine::forget_prefix(*m.engine, history); });
  m.slot_table()->set_history(slot, {});
  send_json(res, {{"id_slot", slot}, {"n_erased", history.size()}});
}

void slot_action(HttpServer& server, const httplib::Request& req, httplib::Response& res) {
  auto m = server.model_or_throw();
  const int32_t slot = parse_slot_id(req.matches[1], m->slot_table()->size());
  const std::string action = query_param(req, "action").value_or("");
  if (action == "erase") return erase_slot(*m, slot, res);
  if (action != "save" && action != "restore")
    bad_request("invalid action " + text_excerpt(action) + ": save, restore or erase", "action");
  if (server.options().slot_save_path.empty())
    throw ApiError(
        501, "this server does not save or restore slots: start it with --slot-save-path DIR");
  if (action == "save") return save_slot(server, *m, slot, req, res);
  restore_slot(server, *m, slot, req, res);
}

// Every slot, 0 to n - 1: whether a request runs on it and, for one that does, what the
// engine and the request registry tell of it.
void list_slots(HttpServer& server, const httplib::Request&, httplib::Response& res) {
  if (!server.options().enable_slots)
    throw ApiError(501, "the /slots endpoint is disabled (start with --slots)");
  auto m = server.model_or_throw();
  std::shared_ptr<SlotTable> table = m->slot_table();
  json out = json::array();
  for (int32_t id = 0; id < table->size(); ++id) {
    const SlotTable::State st = table->state(id);
    json e = {{"id", id},
              {"id_task", st.processing ? json(st.request_id) : json(-1)},
              {"n_ctx", m->n_ctx},
              {"is_processing", st.processing},
              {"n_history_tokens", st.n_history}};
    const std::optional<engine::SlotInfo> info =
        st.processing ? slot_of(*m, st.request_id) : std::nullopt;
    if (info) {
      e["state"] = info->running ? "running" : "waiting";
      e["n_prompt_tokens"] = info->n_prompt;
      e["n_decoded"] = info->n_generated;
      e["n_computed"] = info->n_computed;
      e["n_cached_prompt"] = info->n_cached_prompt;
      e["n_predict"] = info->max_tokens;
    }
    if (const auto r = st.processing ? m->requests.find(st.request_id) : std::nullopt) {
      e["prompt"] = r->prompt;
      e["params"] = r->params;
      e["t_elapsed_ms"] = ms_since(r->start);
    }
    out.push_back(std::move(e));
  }
  send_json(res, out);
}

}  // namespace

void install_slot_routes(Router& http, HttpServer& server) {
  auto wrap = [&server](auto fn) {
    return [&server, fn](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] { fn(server, req, res); });
    };
  };
  http.Get("/slots", wrap(list_slots));
  http.Post("/slots/([^/]*)", wrap(slot_action));
}

}  // namespace hablar::server

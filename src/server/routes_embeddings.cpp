// Embedding and reranking routes, each in its API's shape:
//   OpenAI     POST /v1/embeddings, /embeddings  {input, encoding_format, dimensions}
//   llama.cpp  POST /embedding, /embeddings      {content | input, embd_normalize}
//              (/embeddings answers OpenAI's shape when the body has "input" and is not
//              llama-server's own {content} form)
//   Ollama     POST /api/embed {input, truncate, dimensions}, /api/embeddings {prompt}
//   rerank     POST /v1/rerank, /rerank, /v1/reranking {query, documents, top_n,
//              return_documents} -> {results: [{index, relevance_score, document?}]};
//              TEI's {query, texts, raw_scores, return_text} -> [{index, score, text?}]
// Every input goes through the engine (Engine::submit_embedding): the inputs of a request
// and of concurrent requests share embedding steps.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/prompt_inputs.h"
#include "server/request_fields.h"

namespace hablar::server {
namespace {

using nlohmann::json;

// Why a model does not serve embeddings, as llama-server words it, or "" when it does.
void require_embeddings(const ServingModel& m) {
  if (!m.embeddings)
    throw ApiError(501,
                   "this server does not serve embeddings from a generative model unless started "
                   "with --embedding (or --pooling)");
}

// The inputs of an embedding request in every form llama-server reads (prompt_inputs.h):
// texts (with BOS and the model's other added tokens), token ids, mixed lists, objects.
// An empty text is embedded as llama-server embeds it (its added tokens: BERT's [CLS] [SEP]);
// one that gives no tokens at all is refused.
std::vector<std::vector<int32_t>> read_inputs(const ServingModel& m, const json& in,
                                              const std::string& param) {
  PromptReading how{
      param, [&m](const std::string& text) { return m.tok().encode(text, true, true); }, 2048};
  return read_prompts(m, in, how);
}

// Runs the inputs through the engine and waits for their vectors (not normalized).
engine::EmbedResult run_embeddings(ServingModel& m, std::vector<std::vector<int32_t>> inputs,
                                   Pooling pooling) {
  engine::EmbedRequest r;
  r.inputs = std::move(inputs);
  r.pooling = pooling;
  auto handle = m.engine->submit_embedding(std::move(r));
  while (!handle->wait(std::chrono::milliseconds(100))) {
  }
  const engine::EmbedResult& res = handle->result();
  if (res.cancelled) throw ApiError(503, "the request was cancelled");
  if (!res.error.empty())
    throw ApiError(res.error.find("shutting down") != std::string::npos ? 503 : 500, res.error);
  return res;
}

std::string base64_floats(const std::vector<float>& v) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian float32, as OpenAI's
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t b0 = (uint8_t)bytes[i];
    const uint32_t b1 = i + 1 < bytes.size() ? (uint8_t)bytes[i + 1] : 0;
    const uint32_t b2 = i + 2 < bytes.size() ? (uint8_t)bytes[i + 2] : 0;
    const uint32_t n = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

// `dimensions`: a positive count no larger than the model's width (Matryoshka truncation).
int64_t read_dimensions(const ServingModel& m, const json& body) {
  auto it = body.find("dimensions");
  if (it == body.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    bad_request("'dimensions' must be a positive integer", "dimensions");
  const int64_t d = it->get<int64_t>();
  if (d > m.model->config().n_embd)
    bad_request("'dimensions' " + std::to_string(d) + " is more than the model's " +
                    std::to_string(m.model->config().n_embd),
                "dimensions");
  return d;
}

void refuse_rank(const ServingModel& m) {
  if (m.pooling == Pooling::kRank)
    bad_request("this server ranks (pooling rank): use /v1/rerank, not embeddings");
}

void openai_embeddings(ServingModel& m, const json& body, httplib::Response& res) {
  require_embeddings(m);
  refuse_rank(m);
  if (m.pooling == Pooling::kNone)
    bad_request(
        "pooling 'none' gives per-token vectors, which the OpenAI shape cannot carry; "
        "use /embedding or start the server with another --pooling");
  auto in = body.find("input");
  if (in == body.end() || in->is_null()) bad_request("'input' is required", "input");
  const std::string format = opt_string(body, "encoding_format").value_or("float");
  if (format != "float" && format != "base64")
    bad_request("'encoding_format' must be float or base64", "encoding_format");
  const int64_t dims = read_dimensions(m, body);
  const engine::EmbedResult r = run_embeddings(m, read_inputs(m, *in, "input"), m.pooling);
  json data = json::array();
  for (size_t i = 0; i < r.vectors.size(); ++i) {
    std::vector<float> v = r.vectors[i];
    engine::truncate_embedding(v, dims);
    engine::normalize_embedding(v, 2);
    json item = {{"object", "embedding"}, {"index", i}};
    item["embedding"] = format == "base64" ? json(base64_floats(v)) : json(v);
    data.push_back(std::move(item));
  }
  send_json(res, {{"object", "list"},
                  {"data", std::move(data)},
                  {"model", opt_string(body, "model").value_or(m.id)},
                  {"usage", {{"prompt_tokens", r.n_tokens}, {"total_tokens", r.n_tokens}}}});
}

// llama-server's own shape: [{index, embedding: [[...]]}], one vector per token under
// pooling none (not normalized then), else one normalized by embd_normalize (default 2).
void llama_embeddings(ServingModel& m, const json& body, httplib::Response& res) {
  require_embeddings(m);
  refuse_rank(m);
  const json* in = nullptr;
  for (const char* key : {"input", "content"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) in = &*it;
  if (in == nullptr) bad_request("'content' (or 'input') is required", "content");
  int norm = 2;
  if (auto it = body.find("embd_normalize"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer())
      bad_request("'embd_normalize' must be an integer", "embd_normalize");
    norm = (int)std::clamp<int64_t>(it->get<int64_t>(), -1, 1000);
  }
  const engine::EmbedResult r = run_embeddings(m, read_inputs(m, *in, "content"), m.pooling);
  const int64_t E = m.model->config().n_embd;
  json out = json::array();
  for (size_t i = 0; i < r.vectors.size(); ++i) {
    json rows = json::array();
    const std::vector<float>& v = r.vectors[i];
    if (m.pooling == Pooling::kNone) {
      for (size_t at = 0; at < v.size(); at += (size_t)E)
        rows.push_back(std::vector<float>(v.begin() + (int64_t)at, v.begin() + (int64_t)at + E));
    } else {
      std::vector<float> n = v;
      engine::normalize_embedding(n, norm);
      rows.push_back(std::move(n));
    }
    out.push_back({{"index", i}, {"embedding", std::move(rows)}});
  }
  send_json(res, out);
}

// Ollama's /api/embed: inputs cut to the context when truncate (default true), else 400;
// vectors L2-normalized, `dimensions` truncating first.
void ollama_embed(ServingModel& m, const json& body, httplib::Response& res) {
  require_embeddings(m);
  refuse_rank(m);
  const auto t0 = std::chrono::steady_clock::now();
  auto in = body.find("input");
  if (in == body.end() || in->is_null()) bad_request("'input' is required", "input");
  const bool truncate = opt_bool(body, "truncate").value_or(true);
  const int64_t dims = read_dimensions(m, body);
  std::vector<std::vector<int32_t>> inputs = read_inputs(m, *in, "input");
  if (truncate)
    for (auto& ids : inputs)
      if ((int64_t)ids.size() > m.n_ctx) ids.resize((size_t)m.n_ctx);
  const engine::EmbedResult r = run_embeddings(m, std::move(inputs), m.pooling);
  json vectors = json::array();
  for (std::vector<float> v : r.vectors) {
    engine::truncate_embedding(v, dims);
    engine::normalize_embedding(v, 2);
    vectors.push_back(std::move(v));
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  send_json(res, {{"model", opt_string(body, "model").value_or(m.id)},
                  {"embeddings", std::move(vectors)},
                  {"total_duration", ns},
                  {"load_duration", 0},
                  {"prompt_eval_count", r.n_tokens}});
}

// Ollama's legacy /api/embeddings: one prompt, its vector as the model gives it (Ollama does
// not normalize here).
void ollama_embeddings(ServingModel& m, const json& body, httplib::Response& res) {
  require_embeddings(m);
  refuse_rank(m);
  auto p = body.find("prompt");
  if (p == body.end() || !p->is_string()) bad_request("'prompt' must be a text", "prompt");
  const engine::EmbedResult r = run_embeddings(m, read_inputs(m, *p, "prompt"), m.pooling);
  send_json(res, {{"embedding", r.vectors.at(0)}});
}

// The query/document pair as llama-server builds it without a rerank template:
// [BOS] query [EOS] [SEP] document [EOS], each special token where the vocabulary adds it
// (BERT: [CLS] query [SEP] document).
std::vector<int32_t> rerank_pair(const ServingModel& m, const std::string& query,
                                 const std::string& doc) {
  const tokenizer::Tokenizer& t = m.tok();
  const std::vector<int32_t> q = t.encode(query, false, false), d = t.encode(doc, false, false);
  int32_t eos = t.eos_id();
  const std::optional<int32_t> sep = t.find_token("[SEP]");
  const bool add_sep = t.model_name() == "bert" && sep.has_value();
  if (eos < 0 && sep) eos = *sep;
  std::vector<int32_t> ids;
  if (t.add_bos() && t.bos_id() >= 0) ids.push_back(t.bos_id());
  ids.insert(ids.end(), q.begin(), q.end());
  if (t.add_eos() && eos >= 0) ids.push_back(eos);
  if (add_sep) ids.push_back(*sep);
  ids.insert(ids.end(), d.begin(), d.end());
  if (t.add_eos() && eos >= 0) ids.push_back(eos);
  return ids;
}

void rerank(ServingModel& m, const json& body, httplib::Response& res) {
  if (m.pooling != Pooling::kRank)
    throw ApiError(501,
                   "this server does not rerank: start it with --reranking and a reranker "
                   "model (one with a classifier head)");
  auto q = body.find("query");
  if (q == body.end() || !q->is_string()) bad_request("'query' must be a text", "query");
  auto docs = body.find("documents");
  const bool tei = docs == body.end() && body.contains("texts");  // TEI's request and answer
  if (tei) docs = body.find("texts");
  if (docs == body.end() || !docs->is_array() || docs->empty())
    bad_request("'documents' must be a non-empty list", "documents");
  if (docs->size() > 2048) bad_request("'documents' holds more than 2048 documents", "documents");
  std::vector<std::string> texts;
  for (const auto& d : *docs) {
    if (d.is_string()) {
      texts.push_back(d.get<std::string>());
    } else if (d.is_object() && d.contains("text") && d["text"].is_string()) {
      texts.push_back(d["text"].get<std::string>());  // Cohere / Jina {text}
    } else {
      bad_request("'documents' items must be texts (or {\"text\": ...})", "documents");
    }
  }
  int64_t top_n = (int64_t)texts.size();
  if (auto it = body.find("top_n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1)
      bad_request("'top_n' must be a positive integer", "top_n");
    top_n = std::min(top_n, it->get<int64_t>());
  }
  const bool return_documents = opt_bool(body, "return_documents").value_or(false);
  std::vector<std::vector<int32_t>> inputs;
  for (const std::string& d : texts) inputs.push_back(rerank_pair(m, q->get<std::string>(), d));
  const engine::EmbedResult r = run_embeddings(m, std::move(inputs), Pooling::kRank);
  std::vector<size_t> order(texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return r.vectors[a].at(0) > r.vectors[b].at(0); });
  if (tei) {
    // Text Embeddings Inference's shape: a bare list, best first; scores through a sigmoid
    // unless raw_scores asks for the classifier's logits.
    const bool raw = opt_bool(body, "raw_scores").value_or(false);
    const bool return_text = opt_bool(body, "return_text").value_or(false);
    json list = json::array();
    for (int64_t k = 0; k < top_n; ++k) {
      const size_t i = order[(size_t)k];
      const double logit = r.vectors[i].at(0);
      json item = {{"index", i}, {"score", raw ? logit : 1.0 / (1.0 + std::exp(-logit))}};
      if (return_text) item["text"] = texts[i];
      list.push_back(std::move(item));
    }
    return send_json(res, list);
  }
  json results = json::array();
  for (int64_t k = 0; k < top_n; ++k) {
    const size_t i = order[(size_t)k];
    json item = {{"index", i}, {"relevance_score", r.vectors[i].at(0)}};
    if (return_documents) item["document"] = {{"text", texts[i]}};
    results.push_back(std::move(item));
  }
  send_json(res, {{"object", "list"},
                  {"model", opt_string(body, "model").value_or(m.id)},
                  {"results", std::move(results)},
                  {"usage", {{"prompt_tokens", r.n_tokens}, {"total_tokens", r.n_tokens}}}});
}

}  // namespace

void install_embedding_routes(Router& http, HttpServer& server) {
  using Fn = void (*)(ServingModel&, const json&, httplib::Response&);
  auto route = [&](const std::string& path, Fn fn) {
    http.Post(path, [&server, fn](const httplib::Request& req, httplib::Response& res) {
      handle_json(req, res, [&] {
        auto m = server.model_or_throw();
        const json body = request_json(req);
        if (const auto keep = opt_keep_alive_ns(body)) server.keep_alive(*keep);  // Ollama's
        fn(*m, body, res);
      });
    });
  };
  route("/v1/embeddings", openai_embeddings);
  route("/embedding", llama_embeddings);
  // /embeddings: llama-server's non-OpenAI route takes {content}; OpenAI clients pointed at
  // the bare host send {input} and get OpenAI's shape — unless pooling is none, whose
  // per-token vectors only llama-server's shape carries.
  route("/embeddings", [](ServingModel& m, const json& body, httplib::Response& res) {
    if (body.contains("content") || !body.contains("input") || m.pooling == Pooling::kNone)
      return llama_embeddings(m, body, res);
    openai_embeddings(m, body, res);
  });
  route("/api/embed", ollama_embed);
  route("/api/embeddings", ollama_embeddings);
  for (const char* path : {"/v1/rerank", "/rerank", "/v1/reranking", "/reranking"})
    route(path, rerank);
}

}  // namespace hablar::server

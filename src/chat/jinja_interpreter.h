// The evaluator of a parsed template: walks statements and expressions with Python's
// semantics and jinja2's scoping (a loop body is a new scope per iteration, a macro call a new
// scope over its definition's scope, `if` no scope; namespace() objects carry values out).
#pragma once

#include "chat/chat.h"
#include "chat/jinja_ast.h"

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

namespace hablar::chat::jinja {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;

  Value* find(std::string_view name);
  void set(const std::string& name, Value value);
};

using FilterFn = std::function<Value(Interpreter&, const Value&, const CallArgs&)>;
using TestFn = std::function<bool(Interpreter&, const Value&, const CallArgs&)>;

// Builtins of jinja_builtins.cpp.
const std::unordered_map<std::string, FilterFn>& builtin_filters();
const std::unordered_map<std::string, TestFn>& builtin_tests();
// The global functions: range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
const Dict& builtin_globals();
// `obj.name` for the methods of str, dict and list (bound to obj); Undefined when none.
Value bound_method(const Value& obj, const std::string& name, bool* unsafe);

class Interpreter {
 public:
  Interpreter(const Program& program, Value context, const RenderOptions& options);

  std::string render();

  // --- used by builtins ----------------------------------------------------------------------
  Value call(const Value& callee, const CallArgs& args);
  Value get_attribute(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  // Python iteration: list items, dict keys, string characters, nothing for Undefined.
  ValueList iterate(const Value& v);
  Value apply_filter(const std::string& name, const Value& value, const CallArgs& args);
  bool apply_test(const std::string& name, const Value& value, const CallArgs& args);
  void count_iterations(std::size_t n);
  void check_sequence_length(std::size_t n);
  std::time_t now() const { return now_; }
  const RenderLimits& limits() const { return options_.limits; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_if(const Stmt& s);
  Flow exec_for(const Stmt& s);
  // Runs a for statement over `iterable` in `scope_frame`; recursive loops call it again.
  Flow run_loop(const Stmt& s, const Value& iterable, int depth,
                const std::shared_ptr<Frame>& scope_frame);
  Flow run_else(const Stmt& s);
  void exec_set(const Stmt& s);
  Flow exec_set_block(const Stmt& s);
  void exec_macro(const Stmt& s);
  void exec_call_block(const Stmt& s);
  Flow exec_filter_block(const Stmt& s);
  Flow exec_with(const Stmt& s);
  void assign(const std::vector<std::string>& targets, const Value& value);
  std::string capture(const Body& body, Flow* flow = nullptr);
  void write(std::string_view text);

  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_slice(const Expr& e);
  CallArgs eval_args(const Expr& e, std::size_t first_child);
  Value lookup(const std::string& name);
  Value make_macro(const Stmt& s, std::shared_ptr<Frame> closure);
  Value invoke_macro(const Stmt& s, const std::shared_ptr<Frame>& closure, const CallArgs& args,
                     const Value& caller);

  const Program& program_;
  Value context_;  // a dict: the render's variables
  RenderOptions options_;
  std::time_t now_;
  std::shared_ptr<Frame> frame_;
  std::string* out_ = nullptr;
  std::size_t call_depth_ = 0;
  std::size_t iterations_ = 0;
};

// Python binary operators (+ - * / // % **), shared with filters such as sum.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// Python's <, for sort and min/max; throws TypeError's message for unorderable values.
bool less_than(const Value& a, const Value& b);
// Python's `item in container` (strings: substring; dicts: key; sequences: element).
bool contains(Interpreter& in, const Value& container, const Value& item);
// Escapes & < > ' " the way markupsafe does.
std::string html_escape(std::string_view s);

}  // namespace hablar::chat::jinja

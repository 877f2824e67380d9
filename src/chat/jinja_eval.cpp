// Statement execution and expression evaluation of the Jinja interpreter.
#include "chat/jinja_interpreter.h"

#include <cmath>
#include <cstdlib>

namespace hablar::chat::jinja {

Value* Frame::find(std::string_view name) {
  for (auto& [k, v] : vars)
    if (k == name) return &v;
  return nullptr;
}

void Frame::set(const std::string& name, Value value) {
  if (Value* existing = find(name)) {
    *existing = std::move(value);
    return;
  }
  vars.emplace_back(name, std::move(value));
}

namespace {

std::time_t resolve_now(const RenderOptions& options) {
  if (options.now) return *options.now;
  if (const char* fixed = std::getenv("HABLAR_STRFTIME_NOW"))
    return std::strtoll(fixed, nullptr, 10);
  return std::time(nullptr);
}

// Restores the current frame when a scope ends, also on errors.
class ScopeGuard {
 public:
  ScopeGuard(std::shared_ptr<Frame>& slot, std::shared_ptr<Frame> next)
      : slot_(slot), saved_(std::move(slot)) {
    slot_ = std::move(next);
  }
  ~ScopeGuard() { slot_ = std::move(saved_); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  std::shared_ptr<Frame>& slot_;
  std::shared_ptr<Frame> saved_;
};

}  // namespace

Interpreter::Interpreter(const Program& program, Value context, const RenderOptions& options)
    : program_(program),
      context_(std::move(context)),
      options_(options),
      now_(resolve_now(options)),
      frame_(std::make_shared<Frame>()) {}

std::string Interpreter::render() {
  std::string out;
  out_ = &out;
  exec_body(program_.body);
  out_ = nullptr;
  return out;
}

void Interpreter::write(std::string_view text) {
  if (out_->size() + text.size() > options_.limits.max_output_bytes)
    throw JinjaError("rendered output exceeds " + std::to_string(options_.limits.max_output_bytes) +
                     " bytes");
  out_->append(text);
}

void Interpreter::count_iterations(std::size_t n) {
  iterations_ += n;
  if (iterations_ > options_.limits.max_loop_iterations)
    throw JinjaError("template runs more than " +
                     std::to_string(options_.limits.max_loop_iterations) +
                     " loop iterations and macro calls");
}

void Interpreter::check_sequence_length(std::size_t n) {
  if (n > options_.limits.max_sequence_length)
    throw JinjaError("sequence of " + std::to_string(n) + " items exceeds the limit of " +
                     std::to_string(options_.limits.max_sequence_length));
}

std::string Interpreter::capture(const Body& body, Flow* flow) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    Flow f = exec_body(body);
    if (flow) *flow = f;
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow flow = exec(*s);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  try {
    switch (s.kind) {
      case StmtKind::kText:
        write(s.text);
        break;
      case StmtKind::kOutput: {
        Value v = eval(*s.expr);
        if (v.is_string())
          write(v.as_string());
        else
          write(to_str(v));
        break;
      }
      case StmtKind::kIf:
        return exec_if(s);
      case StmtKind::kFor:
        return exec_for(s);
      case StmtKind::kSet:
        exec_set(s);
        break;
      case StmtKind::kSetBlock:
        exec_set_block(s);
        break;
      case StmtKind::kMacro:
        exec_macro(s);
        break;
      case StmtKind::kCallBlock:
        exec_call_block(s);
        break;
      case StmtKind::kFilterBlock:
        exec_filter_block(s);
        break;
      case StmtKind::kWith:
        exec_with(s);
        break;
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  } catch (JinjaError& e) {
    e.set_pos_if_unknown(s.pos);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_if(const Stmt& s) {
  for (const auto& [cond, body] : s.branches)
    if (truthy(eval(*cond))) return exec_body(body);
  return exec_body(s.else_body);
}

namespace {

// The `loop` variable of one iteration. `extras` holds cycle, changed and, for recursive
// loops, the hidden __call__ that `loop(children)` uses.
Value make_loop(const ValueList& items, std::size_t i, int depth,
                std::vector<std::pair<std::string, Value>> extras) {
  std::int64_t n = static_cast<std::int64_t>(items.size());
  std::int64_t k = static_cast<std::int64_t>(i);
  Dict d;
  d.entries.reserve(12 + extras.size());
  d.entries.emplace_back("index", Value(k + 1));
  d.entries.emplace_back("index0", Value(k));
  d.entries.emplace_back("revindex", Value(n - k));
  d.entries.emplace_back("revindex0", Value(n - k - 1));
  d.entries.emplace_back("first", Value(k == 0));
  d.entries.emplace_back("last", Value(k == n - 1));
  d.entries.emplace_back("length", Value(n));
  d.entries.emplace_back("depth", Value(depth));
  d.entries.emplace_back("depth0", Value(depth - 1));
  d.entries.emplace_back("previtem",
                         i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  d.entries.emplace_back(
      "nextitem", i + 1 < items.size() ? items[i + 1] : Value::undefined("there is no next item"));
  for (auto& e : extras) d.entries.push_back(std::move(e));
  return Value::dict(std::move(d), Kind::kNamespace);
}

}  // namespace

Interpreter::Flow Interpreter::exec_for(const Stmt& s) {
  return run_loop(s, eval(*s.expr), 1, frame_);
}

Interpreter::Flow Interpreter::run_loop(const Stmt& s, const Value& iterable, int depth,
                                        const std::shared_ptr<Frame>& scope_frame) {
  ScopeGuard outer(frame_, scope_frame);
  ValueList source = iterate(iterable);
  ValueList items;
  if (s.condition) {
    // The inline filter sees each item bound to the loop targets.
    for (const Value& item : source) {
      ScopeGuard scope(frame_, std::make_shared<Frame>(Frame{{}, frame_}));
      assign(s.targets, item);
      if (truthy(eval(*s.condition))) items.push_back(item);
    }
  } else {
    items = std::move(source);
  }
  if (items.empty()) return run_else(s);
  count_iterations(items.size());
  auto last_changed = std::make_shared<std::optional<ValueList>>();
  Value changed = Value::function("changed", [last_changed](Interpreter&, const CallArgs& args) {
    bool differs =
        !*last_changed || !values_equal(Value::list(**last_changed), Value::list(args.positional));
    *last_changed = args.positional;
    return Value(differs);
  });
  Value recurse;
  if (s.recursive) {
    const Stmt* stmt = &s;
    std::shared_ptr<Frame> base = scope_frame;
    recurse = Value::function("loop", [stmt, base, depth](Interpreter& in, const CallArgs& args) {
      if (args.positional.size() != 1) throw JinjaError("loop() takes exactly one argument");
      if (++in.call_depth_ > in.options_.limits.max_call_depth) {
        --in.call_depth_;
        throw JinjaError("maximum recursion depth exceeded in a recursive loop");
      }
      std::string buffer;
      std::string* saved = in.out_;
      in.out_ = &buffer;
      try {
        in.run_loop(*stmt, args.positional[0], depth + 1, base);
      } catch (...) {
        in.out_ = saved;
        --in.call_depth_;
        throw;
      }
      in.out_ = saved;
      --in.call_depth_;
      return Value(std::move(buffer));
    });
  }
  bool completed_an_iteration = false;
  for (std::size_t i = 0; i < items.size(); ++i) {
    Value cycle = Value::function("cycle", [i](Interpreter&, const CallArgs& args) -> Value {
      if (args.positional.empty()) throw JinjaError("no items for cycling given");
      return args.positional[i % args.positional.size()];
    });
    std::vector<std::pair<std::string, Value>> extras;
    extras.emplace_back("cycle", std::move(cycle));
    extras.emplace_back("changed", changed);
    if (s.recursive) extras.emplace_back("__call__", recurse);
    auto frame = std::make_shared<Frame>();
    frame->parent = frame_;
    frame->vars.emplace_back("loop", make_loop(items, i, depth, std::move(extras)));
    ScopeGuard scope(frame_, std::move(frame));
    assign(s.targets, items[i]);
    Flow flow = exec_body(s.body);
    if (flow == Flow::kBreak) break;
    if (flow == Flow::kNormal) completed_an_iteration = true;
  }
  // jinja2 marks an iteration done only when its body ran to the end: a loop whose every
  // iteration broke off or continued still runs its else block.
  if (!completed_an_iteration) return run_else(s);
  return Flow::kNormal;
}

// A for loop's else block has a scope of its own, like its body; it lies outside the loop, so
// a break or continue in it belongs to the enclosing loop.
Interpreter::Flow Interpreter::run_else(const Stmt& s) {
  if (s.else_body.empty()) return Flow::kNormal;
  ScopeGuard scope(frame_, std::make_shared<Frame>(Frame{{}, frame_}));
  return exec_body(s.else_body);
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& value) {
  if (targets.size() == 1) {
    frame_->set(targets[0], value);
    return;
  }
  ValueList parts = iterate(value);
  if (parts.size() != targets.size())
    throw JinjaError(
        parts.size() < targets.size()
            ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                  std::to_string(parts.size()) + ")"
            : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  for (std::size_t i = 0; i < targets.size(); ++i) frame_->set(targets[i], parts[i]);
}

void Interpreter::exec_set(const Stmt& s) {
  Value value = eval(*s.expr);
  if (s.attribute.empty()) {
    assign(s.targets, value);
    return;
  }
  Value ns = lookup(s.targets[0]);
  if (!ns.is_namespace()) throw JinjaError("cannot assign attribute on non-namespace object");
  ns.mutable_dict().set(s.attribute, std::move(value));
}

// Block sets and filter blocks render their body in a scope of its own (a `set` inside does
// not leak out); a break or continue inside ends the enclosing loop's iteration and drops the
// body's text, as in jinja2.
Interpreter::Flow Interpreter::exec_set_block(const Stmt& s) {
  Flow flow = Flow::kNormal;
  Value value;
  {
    ScopeGuard scope(frame_, std::make_shared<Frame>(Frame{{}, frame_}));
    value = Value(capture(s.body, &flow));
  }
  if (flow != Flow::kNormal) return flow;
  for (const auto& f : s.filters) {
    CallArgs args = eval_args(*f, 1);
    value = apply_filter(f->name, value, args);
  }
  if (s.attribute.empty()) {
    frame_->set(s.targets[0], value);
    return flow;
  }
  Value ns = lookup(s.targets[0]);
  if (!ns.is_namespace()) throw JinjaError("cannot assign attribute on non-namespace object");
  ns.mutable_dict().set(s.attribute, std::move(value));
  return flow;
}

Interpreter::Flow Interpreter::exec_filter_block(const Stmt& s) {
  Flow flow = Flow::kNormal;
  Value value;
  {
    ScopeGuard scope(frame_, std::make_shared<Frame>(Frame{{}, frame_}));
    value = Value(capture(s.body, &flow));
  }
  if (flow != Flow::kNormal) return flow;
  for (const auto& f : s.filters) {
    CallArgs args = eval_args(*f, 1);
    value = apply_filter(f->name, value, args);
  }
  write(to_str(value));
  return flow;
}

Interpreter::Flow Interpreter::exec_with(const Stmt& s) {
  auto frame = std::make_shared<Frame>();
  frame->parent = frame_;
  for (const auto& [name, expr] : s.assignments) frame->set(name, eval(*expr));
  ScopeGuard scope(frame_, std::move(frame));
  return exec_body(s.body);
}

Value Interpreter::make_macro(const Stmt& s, std::shared_ptr<Frame> closure) {
  const Stmt* def = &s;
  return Value::function(
      s.targets.empty() ? "caller" : s.targets[0],
      [def, closure](Interpreter& in, const CallArgs& args) {
        return in.invoke_macro(*def, closure, args, Value());
      },
      "Macro");
}

void Interpreter::exec_macro(const Stmt& s) {
  frame_->set(s.targets[0], make_macro(s, frame_));
}

Value Interpreter::invoke_macro(const Stmt& s, const std::shared_ptr<Frame>& closure,
                                const CallArgs& args, const Value& caller) {
  count_iterations(1);  // macro calls share the loop budget: fan-out recursion stays bounded
  if (++call_depth_ > options_.limits.max_call_depth) {
    --call_depth_;
    throw JinjaError("maximum recursion depth exceeded (" +
                     std::to_string(options_.limits.max_call_depth) + " nested macro calls)");
  }
  struct DepthGuard {
    std::size_t& depth;
    ~DepthGuard() { --depth; }
  } depth_guard{call_depth_};
  auto frame = std::make_shared<Frame>();
  frame->parent = closure;
  const std::string& name = s.kind == StmtKind::kMacro ? s.targets[0] : std::string("caller");
  ValueList varargs;
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    if (i < s.params.size())
      frame->set(s.params[i].name, args.positional[i]);
    else
      varargs.push_back(args.positional[i]);
  }
  Dict kwargs;
  for (const auto& [key, value] : args.keyword) {
    bool is_param = key == "caller";  // {% call %} passes its body as `caller`
    if (is_param) frame->set(key, value);
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      if (s.params[i].name != key) continue;
      if (i < args.positional.size())
        throw JinjaError("macro '" + name + "' got multiple values for argument '" + key + "'");
      frame->set(key, value);
      is_param = true;
    }
    if (!is_param) kwargs.set(key, value);
  }
  {
    ScopeGuard scope(frame_, frame);
    for (std::size_t i = args.positional.size(); i < s.params.size(); ++i) {
      const MacroParam& p = s.params[i];
      if (frame->find(p.name)) continue;
      frame->set(p.name, p.default_value
                             ? eval(*p.default_value)
                             : Value::undefined("parameter '" + p.name + "' was not provided"));
    }
  }
  frame->set("varargs", Value::tuple(std::move(varargs)));
  frame->set("kwargs", Value::dict(std::move(kwargs)));
  if (!caller.is_undefined()) frame->set("caller", caller);
  ScopeGuard scope(frame_, frame);
  return Value(capture(s.body));
}

void Interpreter::exec_call_block(const Stmt& s) {
  const Expr& call = *s.expr;
  Value callee = eval(*call.children[0]);
  CallArgs args = eval_args(call, 1);
  const Stmt* def = &s;
  std::shared_ptr<Frame> closure = frame_;
  Value caller = Value::function(
      "caller",
      [def, closure](Interpreter& in, const CallArgs& a) {
        return in.invoke_macro(*def, closure, a, Value());
      },
      "Macro");
  args.keyword.emplace_back("caller", caller);
  write(to_str(this->call(callee, args)));
}

Value Interpreter::lookup(const std::string& name) {
  for (Frame* f = frame_.get(); f; f = f->parent.get())
    if (Value* v = f->find(name)) return *v;
  if (context_.is_dict())
    if (const Value* v = context_.as_dict().find(name)) return *v;
  if (const Value* v = builtin_globals().find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::eval(const Expr& e) {
  try {
    return eval_inner(e);
  } catch (JinjaError& error) {
    error.set_pos_if_unknown(e.pos);
    throw;
  }
}

CallArgs Interpreter::eval_args(const Expr& e, std::size_t first_child) {
  CallArgs args;
  for (std::size_t i = first_child; i < e.children.size(); ++i)
    args.positional.push_back(eval(*e.children[i]));
  for (const auto& [name, expr] : e.keywords) args.keyword.emplace_back(name, eval(*expr));
  return args;
}

Value Interpreter::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName:
      return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) items.push_back(eval(*c));
      return Value::list(std::move(items), e.kind == ExprKind::kList ? Kind::kList : Kind::kTuple);
    }
    case ExprKind::kDict: {
      Dict d;
      for (std::size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value key = eval(*e.children[i]);
        d.set_key(key, eval(*e.children[i + 1]));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kAttribute:
      return get_attribute(eval(*e.children[0]), e.name);
    case ExprKind::kItem:
      return get_item(eval(*e.children[0]), eval(*e.children[1]));
    case ExprKind::kSlice:
      return eval_slice(e);
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter: {
      Value operand = eval(*e.children[0]);
      return apply_filter(e.name, operand, eval_args(e, 1));
    }
    case ExprKind::kTest: {
      Value operand = eval(*e.children[0]);
      bool result = apply_test(e.name, operand, eval_args(e, 1));
      return Value(e.negated ? !result : result);
    }
    case ExprKind::kNot:
      return Value(!truthy(eval(*e.children[0])));
    case ExprKind::kNegate:
    case ExprKind::kPlus: {
      Value v = eval(*e.children[0]);
      if (v.is_undefined()) throw JinjaError(v.undefined_message());
      if (!v.is_number())
        throw JinjaError(std::string("bad operand type for unary ") +
                         (e.kind == ExprKind::kNegate ? "-" : "+") + ": '" + python_type_name(v) +
                         "'");
      if (e.kind == ExprKind::kPlus) return v.is_bool() ? Value(v.as_int()) : v;
      return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
    }
    case ExprKind::kBinary:
      return eval_binary(e);
    case ExprKind::kAnd: {
      Value left = eval(*e.children[0]);
      return truthy(left) ? eval(*e.children[1]) : left;
    }
    case ExprKind::kOr: {
      Value left = eval(*e.children[0]);
      return truthy(left) ? left : eval(*e.children[1]);
    }
    case ExprKind::kConditional: {
      if (truthy(eval(*e.children[1]))) return eval(*e.children[0]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

Value Interpreter::eval_call(const Expr& e) {
  Value callee = eval(*e.children[0]);
  CallArgs args = eval_args(e, 1);
  return call(callee, args);
}

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) throw JinjaError(callee.undefined_message());
  if (callee.is_namespace())  // a recursive loop's `loop(...)`
    if (const Value* fn = callee.as_dict().find("__call__")) return call(*fn, args);
  if (!callee.is_callable())
    throw JinjaError("'" + python_type_name(callee) + "' object is not callable");
  return callee.as_callable().call(*this, args);
}

bool contains(Interpreter& in, const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string())
        throw JinjaError("'in <string>' requires string as left operand, not " +
                         python_type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kDict:
    case Kind::kNamespace:
      if (item.is_string()) return container.as_dict().find(item.as_string()) != nullptr;
      return container.is_dict() && !item.is_undefined() && !item.is_list_like() &&
             !item.is_dict() && container.as_dict().find_key(item) != nullptr;
    case Kind::kUndefined:
      return false;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kGenerator:
      for (const Value& v : container.items())
        if (values_equal(v, item)) return true;
      return false;
    default:
      throw JinjaError("argument of type '" + python_type_name(container) + "' is not iterable");
  }
  (void)in;
}

Value Interpreter::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  Value a = eval(*e.children[0]);
  Value b = eval(*e.children[1]);
  if (op == "==") return Value(values_equal(a, b));
  if (op == "!=") return Value(!values_equal(a, b));
  if (op == "in") return Value(contains(*this, b, a));
  if (op == "notin") return Value(!contains(*this, b, a));
  if (op == "~") {
    std::string s = to_str(a);
    s += to_str(b);
    check_sequence_length(s.size());
    return Value(std::move(s));
  }
  if (op == "<") return Value(less_than(a, b));
  if (op == ">") return Value(less_than(b, a));
  if (op == "<=") return Value(!less_than(b, a) && (less_than(a, b) || values_equal(a, b)));
  if (op == ">=") return Value(!less_than(a, b) && (less_than(b, a) || values_equal(a, b)));
  if ((op == "*") && ((a.is_string() || a.is_list_like()) || (b.is_string() || b.is_list_like()))) {
    const Value& seq = (a.is_string() || a.is_list_like()) ? a : b;
    const Value& count = (&seq == &a) ? b : a;
    if (count.is_int() || count.is_bool()) {
      std::size_t n = count.as_int() > 0 ? static_cast<std::size_t>(count.as_int()) : 0;
      std::size_t unit = seq.is_string() ? seq.as_string().size() : seq.items().size();
      check_sequence_length(unit * n);
    }
  }
  return binary_op(op, a, b);
}

namespace {

bool is_constant(const Expr& e) {
  if (e.kind == ExprKind::kLiteral) return true;
  if (e.kind != ExprKind::kList && e.kind != ExprKind::kTuple && e.kind != ExprKind::kDict)
    return false;
  for (const auto& c : e.children)
    if (!is_constant(*c)) return false;
  return true;
}

}  // namespace

Value Interpreter::eval_slice(const Expr& e) {
  Value obj = eval(*e.children[0]);
  std::optional<std::int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.children[i + 1]) continue;
    Value v = eval(*e.children[i + 1]);
    if (v.is_none()) continue;
    if (!v.is_int() && !v.is_bool())
      throw JinjaError("slice indices must be integers or None or have an __index__ method");
    bounds[i] = v.as_int();
  }
  if (obj.is_undefined()) throw JinjaError(obj.undefined_message());
  std::int64_t step = bounds[2].value_or(1);
  if (step == 0) throw JinjaError("slice step cannot be zero");
  std::vector<std::uint32_t> chars;
  std::int64_t n;
  if (obj.is_string()) {
    chars = utf8_decode(obj.as_string());
    n = static_cast<std::int64_t>(chars.size());
  } else if (obj.is_list_like()) {
    n = static_cast<std::int64_t>(obj.items().size());
  } else if (!is_constant(*e.children[0])) {
    // jinja2 compiles a slice to a plain Python subscript: the TypeError escapes...
    throw JinjaError("'" + python_type_name(obj) + "' object is not subscriptable");
  } else {  // ...except on constants, which its optimizer folds through getitem into Undefined
    auto part = [](const std::optional<std::int64_t>& b) {
      return b ? std::to_string(*b) : std::string("None");
    };
    return Value::undefined(object_type_repr(obj) + " has no element slice(" + part(bounds[0]) +
                            ", " + part(bounds[1]) + ", " + part(bounds[2]) + ")");
  }
  auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<std::int64_t>(x, 0, n);
    return std::clamp<std::int64_t>(x, -1, n - 1);
  };
  std::int64_t start = clamp(bounds[0], step > 0 ? 0 : n - 1);
  std::int64_t stop = clamp(bounds[1], step > 0 ? n : -1);
  std::vector<std::int64_t> picks;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (auto i : picks) utf8_append(out, chars[static_cast<std::size_t>(i)]);
    return Value(std::move(out));
  }
  ValueList out;
  for (auto i : picks) out.push_back(obj.items()[static_cast<std::size_t>(i)]);
  return Value::list(std::move(out), obj.kind() == Kind::kTuple ? Kind::kTuple : Kind::kList);
}

Value Interpreter::get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw JinjaError(obj.undefined_message());
  if (!name.empty() && name[0] == '_')
    return Value::undefined("access to attribute '" + name + "' of '" + python_type_name(obj) +
                            "' object is unsafe.");
  if (obj.is_namespace()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  }
  // groupby's (grouper, list) pairs name their two items.
  if (obj.kind() == Kind::kTuple && obj.items().size() == 2 &&
      (name == "grouper" || name == "list"))
    return obj.items()[name == "grouper" ? 0 : 1];
  bool unsafe = false;
  Value method = bound_method(obj, name, &unsafe);
  if (!method.is_undefined() || unsafe) return method;
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(name)) return *v;
  }
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) throw JinjaError(obj.undefined_message());
  if ((obj.is_dict() || obj.is_namespace()) && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
  } else if (obj.is_dict() && !key.is_undefined() && !key.is_list_like() && !key.is_dict()) {
    // A literal's non-string keys ({1: 'a'}, {none: 2}; 1, 1.0 and True are one key).
    if (const Value* v = obj.as_dict().find_key(key)) return *v;
  } else if ((obj.is_list_like() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    std::int64_t i = key.as_int();
    if (obj.is_string()) {
      auto chars = utf8_decode(obj.as_string());
      std::int64_t n = static_cast<std::int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string out;
        utf8_append(out, chars[static_cast<std::size_t>(i)]);
        return Value(std::move(out));
      }
    } else if (obj.kind() != Kind::kGenerator) {
      std::int64_t n = static_cast<std::int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<std::size_t>(i)];
    }
  }
  if (key.is_string()) {  // obj[name] falls back to getattr, as jinja2's getitem does
    if (obj.is_dict()) {
      bool unsafe = false;
      Value method = bound_method(obj, key.as_string(), &unsafe);
      if (!method.is_undefined() || unsafe) return method;
      return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" +
                              key.as_string() + "'");
    }
    return get_attribute(obj, key.as_string());
  }
  return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
}

ValueList Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kGenerator:
      return v.items();
    case Kind::kDict: {
      ValueList keys;
      keys.reserve(v.as_dict().entries.size());
      for (const auto& [k, _] : v.as_dict().entries) keys.push_back(dict_key_value(k));
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (std::uint32_t cp : utf8_decode(v.as_string())) {
        std::string s;
        utf8_append(s, cp);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      throw JinjaError("'" + python_type_name(v) + "' object is not iterable");
  }
}

Value Interpreter::apply_filter(const std::string& name, const Value& value, const CallArgs& args) {
  const auto& filters = builtin_filters();
  auto it = filters.find(name);
  if (it == filters.end()) throw JinjaError("No filter named '" + name + "' found.");
  return it->second(*this, value, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& value, const CallArgs& args) {
  const auto& tests = builtin_tests();
  auto it = tests.find(name);
  if (it == tests.end()) throw JinjaError("No test named '" + name + "' found.");
  return it->second(*this, value, args);
}

}  // namespace hablar::chat::jinja

"""A suite of JSON Schemas of our own making for structured-output tests and benchmarks:
nested objects, arrays with bounds, enums and consts, $ref/$defs (recursive too), anyOf,
allOf, patterns, formats, string lengths, numeric bounds, and real tool parameter schemas.

SCHEMAS is a list of (name, schema). example(schema) builds one valid instance (used by the
benchmark to have documents both engines replay); schemas with a pattern carry an
"examples" entry the generator uses.
"""

PRIMITIVES = [
    ("string", {"type": "string"}),
    ("short_string", {"type": "string", "maxLength": 12}),
    ("bounded_string", {"type": "string", "minLength": 3, "maxLength": 8}),
    ("integer", {"type": "integer"}),
    ("age", {"type": "integer", "minimum": 0, "maximum": 120}),
    ("negative", {"type": "integer", "minimum": -500, "maximum": -3}),
    ("year", {"type": "integer", "minimum": 1900, "exclusiveMaximum": 2100}),
    ("positive", {"type": "integer", "exclusiveMinimum": 0}),
    ("number", {"type": "number"}),
    ("probability", {"type": "number", "minimum": 0, "maximum": 1}),
    ("temperature", {"type": "number", "minimum": -50, "maximum": 60}),
    ("price", {"type": "number", "minimum": 0}),
    ("boolean", {"type": "boolean"}),
    ("null", {"type": "null"}),
    ("color", {"enum": ["red", "green", "blue"]}),
    ("mixed_enum", {"enum": ["on", "off", 0, 1, True, None]}),
    ("const", {"const": "fixed"}),
    ("date", {"type": "string", "format": "date"}),
    ("time", {"type": "string", "format": "time"}),
    ("datetime", {"type": "string", "format": "date-time"}),
    ("uuid", {"type": "string", "format": "uuid"}),
    ("email", {"type": "string", "format": "email"}),
    ("ipv4", {"type": "string", "format": "ipv4"}),
    ("zip", {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$", "examples": ["12345"]}),
    ("sku", {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$", "examples": ["ABC-1234"]}),
    ("hex_color", {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$", "examples": ["#a0b1c2"]}),
    ("slug", {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$", "examples": ["my-post-1"]}),
    ("phone", {"type": "string", "pattern": "^\\+?[0-9]{7,12}$", "examples": ["+33123456789"]}),
    ("contains_at", {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}$", "examples": ["a@b"]}),
    ("nullable_string", {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]}),
    ("type_list", {"type": ["integer", "string"]}),
    # Fractional and exclusive bounds on numbers, decided exactly (0 itself is out, 0.5 in).
    ("open_ratio", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    ("offset", {"type": "number", "minimum": -0.5, "maximum": 0.25}),
    ("narrow", {"type": "number", "minimum": 0.001, "exclusiveMaximum": 0.002}),
    ("below_minus", {"type": "number", "exclusiveMaximum": -1.5}),
    ("discount", {"type": "number", "exclusiveMinimum": 0, "maximum": 0.75}),
]


def _obj(props, required=None, extra=False):
    s = {"type": "object", "properties": props,
         "required": list(props) if required is None else required}
    if extra is False:
        s["additionalProperties"] = False
    return s


def _tool(name, props, required):
    return (f"tool_{name}", _obj(props, required))


TOOLS = [
    _tool("get_weather", {"city": {"type": "string", "maxLength": 30},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _tool("search_web", {"query": {"type": "string", "maxLength": 60},
                         "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
          ["query"]),
    _tool("send_email", {"to": {"type": "string", "format": "email"},
                         "subject": {"type": "string", "maxLength": 40},
                         "body": {"type": "string", "maxLength": 80},
                         "cc": {"type": "array", "items": {"type": "string", "format": "email"},
                                "maxItems": 2}}, ["to", "subject", "body"]),
    _tool("create_event", {"title": {"type": "string", "maxLength": 30},
                           "date": {"type": "string", "format": "date"},
                           "start": {"type": "string", "format": "time"},
                           "duration_minutes": {"type": "integer", "minimum": 5,
                                                "maximum": 480}},
          ["title", "date"]),
    _tool("query_db", {"table": {"enum": ["users", "orders", "products"]},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                       "filters": {"type": "array", "maxItems": 3, "items": _obj({
                           "column": {"type": "string", "maxLength": 16},
                           "op": {"enum": ["=", "<", ">", "!="]},
                           "value": {"type": ["string", "number"]}})}},
          ["table"]),
    _tool("set_thermostat", {"temperature": {"type": "number", "minimum": 10, "maximum": 30},
                             "mode": {"enum": ["heat", "cool", "auto"]}}, ["temperature"]),
    _tool("book_flight", {"from": {"type": "string", "pattern": "^[A-Z]{3}$", "examples": ["CDG"]},
                          "to": {"type": "string", "pattern": "^[A-Z]{3}$", "examples": ["JFK"]},
                          "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                          "class": {"enum": ["economy", "business", "first"]}},
          ["from", "to", "passengers"]),
    _tool("translate", {"text": {"type": "string", "maxLength": 60},
                        "target": {"enum": ["en", "fr", "de", "es", "ja"]}}, ["text", "target"]),
    _tool("get_stock_price", {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$",
                                         "examples": ["AAPL"]}}, ["ticker"]),
    _tool("run_code", {"language": {"enum": ["python", "javascript"]},
                       "code": {"type": "string", "maxLength": 100}}, ["language", "code"]),
]


def _nested():
    out = []
    address = _obj({"street": {"type": "string", "maxLength": 30},
                    "city": {"type": "string", "maxLength": 20},
                    "zip": PRIMITIVES[23][1]}, ["city"])
    person = _obj({"name": {"type": "string", "maxLength": 24},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "email": {"type": "string", "format": "email"}}, ["name", "age"])
    out.append(("person", person))
    out.append(("person_with_address", _obj({"person": person, "address": address})))
    out.append(("people", {"type": "array", "items": person, "minItems": 1, "maxItems": 3}))
    out.append(("matrix", {"type": "array", "maxItems": 3, "items": {
        "type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}))
    out.append(("tags", _obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                       "minItems": 2, "maxItems": 4}})))
    out.append(("point", {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                          "items": False, "minItems": 2}))
    out.append(("tuple_mixed", {"type": "array", "prefixItems": [
        {"type": "string", "maxLength": 10}, {"type": "integer"}, {"type": "boolean"}],
        "items": False, "minItems": 1}))
    out.append(("inventory", _obj({"items": {"type": "array", "maxItems": 4, "items": _obj({
        "sku": PRIMITIVES[24][1], "qty": {"type": "integer", "minimum": 0, "maximum": 999},
        "price": {"type": "number", "minimum": 0, "maximum": 10000}})}})))
    out.append(("order", _obj({"id": {"type": "string", "format": "uuid"},
                               "status": {"enum": ["pending", "shipped", "delivered"]},
                               "total": {"type": "number", "minimum": 0},
                               "placed": {"type": "string", "format": "date-time"},
                               "customer": person})))
    out.append(("optional_fields", _obj({"a": {"type": "string", "maxLength": 8},
                                         "b": {"type": "integer"}, "c": {"type": "boolean"},
                                         "d": {"type": "null"}}, [])))
    out.append(("some_required", _obj({"a": {"type": "integer"}, "b": {"type": "integer"},
                                       "c": {"type": "integer"}, "d": {"type": "integer"}},
                                      ["b", "d"])))
    out.append(("map_of_ints", {"type": "object",
                                "additionalProperties": {"type": "integer", "minimum": 0,
                                                         "maximum": 100},
                                "maxProperties": 100}))
    out.append(("empty_object", {"type": "object", "properties": {}, "additionalProperties": False}))
    out.append(("ref_defs", {"$defs": {"Color": {"enum": ["red", "green"]},
                                       "Pair": _obj({"left": {"$ref": "#/$defs/Color"},
                                                     "right": {"$ref": "#/$defs/Color"}})},
                             "$ref": "#/$defs/Pair"}))
    out.append(("ref_definitions", {"definitions": {"Id": {"type": "integer", "minimum": 1,
                                                           "maximum": 9999}},
                                    "type": "object",
                                    "properties": {"ids": {"type": "array", "maxItems": 4,
                                                           "items": {"$ref": "#/definitions/Id"}}},
                                    "required": ["ids"], "additionalProperties": False}))
    out.append(("recursive_tree", {"$defs": {"Node": {"type": "object", "properties": {
        "label": {"type": "string", "maxLength": 10},
        "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/Node"}}},
        "required": ["label"], "additionalProperties": False}}, "$ref": "#/$defs/Node"}))
    out.append(("any_of_objects", {"anyOf": [
        _obj({"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}}),
        _obj({"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}})]}))
    out.append(("one_of_types", {"oneOf": [{"type": "boolean"}, {"type": "null"},
                                           {"type": "string", "maxLength": 10}]}))
    out.append(("all_of_merge", {"allOf": [
        _obj({"id": {"type": "integer"}}, ["id"], extra=True),
        {"properties": {"name": {"type": "string", "maxLength": 16}}, "required": ["name"]}]}))
    out.append(("pydantic_like", {"title": "User", "type": "object", "properties": {
        "name": {"title": "Name", "type": "string", "maxLength": 20},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}],
                     "default": None, "title": "Nickname"},
        "role": {"$ref": "#/$defs/Role"}},
        "required": ["name", "nickname", "role"], "additionalProperties": False,
        "$defs": {"Role": {"enum": ["admin", "user"], "title": "Role", "type": "string"}}}))
    out.append(("deep_nesting", _obj({"a": _obj({"b": _obj({"c": _obj({
        "d": {"type": "integer", "minimum": 0, "maximum": 5}})})})})))
    out.append(("bool_flags", _obj({f"flag{i}": {"type": "boolean"} for i in range(6)})))
    out.append(("enum_array", {"type": "array", "items": {"enum": ["a", "b", "c"]},
                               "minItems": 1, "maxItems": 5}))
    out.append(("scores", _obj({"scores": {"type": "array", "minItems": 1, "maxItems": 5,
                                           "items": {"type": "number", "minimum": 0,
                                                     "maximum": 100}}})))
    out.append(("nullable_fields", _obj({"x": {"type": ["integer", "null"]},
                                         "y": {"type": ["string", "null"], "maxLength": 10}})))
    out.append(("event_log", {"type": "array", "maxItems": 3, "items": _obj({
        "at": {"type": "string", "format": "date-time"},
        "level": {"enum": ["info", "warn", "error"]},
        "msg": {"type": "string", "maxLength": 30}})}))
    out.append(("network", _obj({"ip": {"type": "string", "format": "ipv4"},
                                 "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                 "secure": {"type": "boolean"}})))
    out.append(("description_only", {"description": "anything at all"}))
    out.append(("recipe", _obj({"title": {"type": "string", "maxLength": 30},
                                "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                                "ingredients": {"type": "array", "minItems": 1, "maxItems": 4,
                                                "items": _obj({"name": {"type": "string",
                                                                        "maxLength": 16},
                                                               "grams": {"type": "number",
                                                                         "minimum": 0,
                                                                         "maximum": 1000}})},
                                "vegetarian": {"type": "boolean"}})))
    return out


def _wrapped():
    # Each primitive as a property, alone and in an array: exercises every leaf in context.
    out = []
    for name, s in PRIMITIVES:
        out.append((f"{name}_prop", _obj({"value": s})))
        out.append((f"{name}_list", {"type": "array", "items": s, "minItems": 1, "maxItems": 3}))
    return out


SCHEMAS = PRIMITIVES + TOOLS + _nested() + _wrapped()


def example(schema, defs_root=None):
    """One valid instance of a schema of this suite (enough of JSON Schema for it)."""
    root = defs_root if defs_root is not None else schema
    if schema is True or schema == {} or list(schema) == ["description"]:
        return {"any": 1}
    if "$ref" in schema:
        node = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return example(node, root)
    if "examples" in schema:
        return schema["examples"][0]
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema or "oneOf" in schema:
        return example((schema.get("anyOf") or schema.get("oneOf"))[0], root)
    if "allOf" in schema:
        out = {}
        for part in schema["allOf"]:
            out.update(example(part, root))
        return out
    t = schema.get("type")
    if isinstance(t, list):
        return example(dict(schema, type=t[0]), root)
    if t == "object" or "properties" in schema:
        props = schema.get("properties", {})
        if not props and isinstance(schema.get("additionalProperties"), dict):
            return {"k1": example(schema["additionalProperties"], root)}
        return {k: example(v, root) for k, v in props.items()}
    if t == "array":
        if "prefixItems" in schema:
            return [example(s, root) for s in schema["prefixItems"]]
        n = schema.get("minItems", 0)
        return [example(schema["items"], root) for _ in range(n)]
    if t == "string":
        fmt = schema.get("format")
        if fmt:
            return {"date": "2024-05-06", "time": "12:30:00Z", "date-time": "2024-05-06T12:30:00Z",
                    "uuid": "123e4567-e89b-12d3-a456-426614174000", "email": "ann@example.com",
                    "ipv4": "10.0.0.1"}[fmt]
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 40)
        text = "a short text value"
        return (text * 3)[:max(lo, min(hi, len(text)))]
    if t == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return max(lo, 7) if schema.get("maximum", 10**9) >= 7 else lo
    if t == "number":
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        lo = lo if lo is not None else (hi - 10 if hi is not None else 0)
        hi = hi if hi is not None else lo + 10
        return (lo + hi) / 2
    if t == "boolean":
        return True
    if t == "null":
        return None
    raise ValueError(f"no example for {schema}")

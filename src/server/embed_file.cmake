# cmake -DINPUT=file -DOUTPUT=file.cpp -DSYMBOL=name -P embed_file.cmake
# Writes a C++ source defining hablar::server::web_asset_<SYMBOL>() over the file's bytes.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x[0-9a-f][0-9a-f],){32}" "\\0\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
"// Generated from ${INPUT} by embed_file.cmake; do not edit.\n"
"#include \"server/web_assets.h\"\n"
"namespace hablar::server {\n"
"namespace {\nconst unsigned char kData[] = {\n${bytes}0x00};\n}\n"
"const WebAsset& web_asset_${SYMBOL}() {\n"
"  static const WebAsset asset{kData, ${size}};\n  return asset;\n}\n"
"}  // namespace hablar::server\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")

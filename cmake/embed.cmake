# embed.cmake — writes a file's bytes as a C array, at build time:
#   cmake -DIN=docs/openapi.json -DOUT=openapi_json.c -DNAME=lg__openapi_json -P embed.cmake
# gives `const unsigned char NAME[]` (the bytes and a NUL, so it is also a
# C string) and `const size_t NAME_len` (without the NUL).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n  " bytes "${bytes}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by cmake/embed.cmake: do not edit. */\n"
  "#include <stddef.h>\n"
  "#define LG__EMBED_EXPORT __attribute__((visibility(\"hidden\")))\n"
  "LG__EMBED_EXPORT extern const unsigned char ${NAME}[];\n"
  "LG__EMBED_EXPORT extern const size_t ${NAME}_len;\n"
  "const unsigned char ${NAME}[] = {\n  ${bytes}0x00};\n"
  "const size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")

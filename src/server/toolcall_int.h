/* Shared pieces of the tool-call formats (private to src/server/toolcall*.c). */
#ifndef SM_SERVER_TOOLCALL_INT_H
#define SM_SERVER_TOOLCALL_INT_H
#include "server/toolcall.h"

/* DeepSeek's markers (fullwidth bars, U+2581 for spaces) */
#define DS_CALLS_BEGIN_ \
  "<\xEF\xBD\x9Ctool\xE2\x96\x81" \
  "calls\xE2\x96\x81" \
  "begin\xEF\xBD\x9C>"
#define DS_CALLS_END_ \
  "<\xEF\xBD\x9Ctool\xE2\x96\x81" \
  "calls\xE2\x96\x81" \
  "end\xEF\xBD\x9C>"
#define DS_CALL_BEGIN_ \
  "<\xEF\xBD\x9Ctool\xE2\x96\x81" \
  "call\xE2\x96\x81" \
  "begin\xEF\xBD\x9C>"
#define DS_CALL_END_ \
  "<\xEF\xBD\x9Ctool\xE2\x96\x81" \
  "call\xE2\x96\x81" \
  "end\xEF\xBD\x9C>"
#define DS_SEP_ \
  "<\xEF\xBD\x9Ctool\xE2\x96\x81" \
  "sep\xEF\xBD\x9C>"

#define TC_INCOMPLETE (-1L)
#define TC_BAD (-2L)

/* A call section parser: s[0..n) starts with the format's marker. Appends the calls it finds
 * (the last possibly unfinished) to out; returns the bytes of the section when complete,
 * TC_INCOMPLETE when the text ends inside it, TC_BAD when it is malformed. */
typedef long (*sm_tc_section)(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out);

sm_tc_call *sm_tc_add(sm_tc_scan *out);
/* End of the JSON value at s[i] (index after it), TC_INCOMPLETE or TC_BAD. */
long sm_json_value_end(const char *s, size_t n, size_t i);
size_t sm_skip_ws(const char *s, size_t n, size_t i);
bool sm_starts(const char *s, size_t n, const char *lit); /* s[0..n) starts with lit (n may be short) */
bool sm_has(const char *s, size_t n, const char *lit);    /* s[0..n) starts with all of lit */
/* One JSON call object at s[0] = '{': {"name": ..., "arguments"|"parameters": ...} (also
 * {"function": {...}}). Returns the end, TC_INCOMPLETE (partial call added) or TC_BAD. */
long sm_tc_json_call(const char *s, size_t n, sm_tc_scan *out);
/* The arguments value as JSON: parameter `key` of tool `name`, raw text value -> JSON text. */
void sm_tc_xml_value(const cJSON *tools, const char *name, const char *key, const char *v, size_t n, sm_buf *out);

/* Section parsers of the XML-style and Python-style formats (toolcall_xml.c) */
long sm_tc_sec_qwen3_coder(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out);
long sm_tc_sec_glm45(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out);
long sm_tc_sec_gemma(const char *s, size_t n, const cJSON *tools, sm_tc_scan *out);

#endif

/* The vocabulary of a grammar's tokenizer as a byte trie (grammar.h): every token's bytes, laid
 * out in depth-first order so that a mask walks it front to back and skips the subtree of a
 * rejected byte. Built once per tokenizer; immutable after. */
#include <stdlib.h>
#include <string.h>
#include "engine/grammar_int.h"

typedef struct sm_gtnode { /* the trie while it is built (linked form) */
  int32_t child, sibling;  /* -1: none */
  int32_t tok;             /* first token ending here, -1: none (more via next_tok) */
  uint8_t byte;
} tnode;

static int32_t trie_child(sm_grammar_vocab *v, int32_t node, uint8_t b) {
  int32_t *link = &v->n[node].child;
  while (*link >= 0 && v->n[*link].byte < b) link = &v->n[*link].sibling;
  if (*link >= 0 && v->n[*link].byte == b) return *link;
  if (v->n_nodes == v->cap) {
    v->cap *= 2;
    v->n = sm_xrealloc(v->n, sizeof(tnode) * (size_t)v->cap);
    link = &v->n[node].child; /* re-find after realloc */
    while (*link >= 0 && v->n[*link].byte < b) link = &v->n[*link].sibling;
  }
  int32_t id = v->n_nodes++;
  v->n[id] = (tnode){.child = -1, .sibling = *link, .tok = -1, .byte = b};
  *link = id;
  return id;
}

sm_grammar_vocab *sm_grammar_vocab_new(const smelt_tokenizer *t, int vocab, const int32_t *eos, int n_eos) {
  sm_grammar_vocab *v = sm_xcalloc(1, sizeof *v);
  v->id = sm_grammar_new_id();
  v->vocab = vocab;
  v->cap = 1024;
  v->n = sm_xmalloc(sizeof(tnode) * (size_t)v->cap);
  v->n[0] = (tnode){.child = -1, .sibling = -1, .tok = -1};
  v->n_nodes = 1;
  v->next_tok = sm_xmalloc(sizeof(int32_t) * (size_t)vocab);
  v->special = sm_xcalloc((size_t)vocab, 1);
  v->is_eos = sm_xcalloc((size_t)vocab, 1);
  v->off = sm_xmalloc(sizeof(int64_t) * (size_t)(vocab + 1));
  v->eos = sm_xmalloc(sizeof(int32_t) * (size_t)(n_eos ? n_eos : 1));
  for (int i = 0; i < n_eos; i++)
    if (eos[i] >= 0 && eos[i] < vocab) {
      v->is_eos[eos[i]] = 1;
      v->eos[v->n_eos++] = eos[i];
    }
  sm_buf all = SM_BUF_INIT, piece = SM_BUF_INIT;
  for (int32_t id = 0; id < vocab; id++) {
    v->next_tok[id] = -1;
    v->off[id] = (int64_t)all.n;
    bool known = sm_tok_piece_bytes(t, id, &piece);
    v->special[id] = !known || sm_tok_is_special(t, id) || piece.n == 0;
    if (v->special[id]) continue;
    sm_buf_put(&all, piece.p, piece.n);
    if ((int)piece.n > v->max_len) v->max_len = (int)piece.n;
    int32_t node = 0;
    for (size_t k = 0; k < piece.n; k++) node = trie_child(v, node, (uint8_t)piece.p[k]);
    v->next_tok[id] = v->n[node].tok;
    v->n[node].tok = id;
  }
  v->off[vocab] = (int64_t)all.n;
  v->bytes = sm_buf_take(&all);
  sm_buf_free(&piece);
  /* depth-first order: cur[d] is the node at depth d + 1 on the path, at[d] its index */
  v->pn = sm_xmalloc(sizeof(pnode) * (size_t)SM_MAX(v->n_nodes - 1, 1));
  int32_t *cur = sm_xmalloc(sizeof(int32_t) * (size_t)(v->max_len + 2)),
          *at = sm_xmalloc(sizeof(int32_t) * (size_t)(v->max_len + 2));
  int32_t idx = 0;
  int d = 0;
  cur[0] = v->n[0].child;
  while (d >= 0) {
    int32_t c = cur[d];
    if (c < 0) {
      if (--d >= 0) {
        v->pn[at[d]].end = idx;
        cur[d] = v->n[cur[d]].sibling;
      }
      continue;
    }
    at[d] = idx;
    int32_t t0 = v->n[c].tok;
    v->pn[idx++] =
      (pnode){.tok = t0, .end = -1, .depth = d + 1, .byte = v->n[c].byte, .more = t0 >= 0 && v->next_tok[t0] >= 0};
    if (v->n[c].child >= 0) {
      cur[++d] = v->n[c].child;
    } else {
      v->pn[at[d]].end = idx;
      cur[d] = v->n[c].sibling;
    }
  }
  free(cur);
  free(at);
  free(v->n);
  v->n = NULL;
  return v;
}

void sm_grammar_vocab_free(sm_grammar_vocab *v) {
  if (!v) return;
  free(v->n);
  free(v->pn);
  free(v->next_tok);
  free(v->special);
  free(v->is_eos);
  free(v->eos);
  free(v->bytes);
  free(v->off);
  free(v);
}

int sm_grammar_vocab_size(const sm_grammar_vocab *v) { return v ? v->vocab : 0; }

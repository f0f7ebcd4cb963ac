/* The recurrent mixers of hybrid models (config.h sm_rec_kind), one layer each: the forward calls
 * sm_rec_mixer where an attention layer would attend. Each keeps a fixed-size state per sequence in
 * the cache (backend.h sm_kv_cache conv / ssm, the batch's state_slot):
 *  - Gated DeltaNet (Qwen3-Next, Qwen3.5): q|k|v projected, short causal convolution + SiLU, the gated
 *    delta rule with decay g and rate beta per value head, RMSNorm gated by silu(z), out_proj;
 *  - Mamba-2 (Nemotron-H, Granite-4.0-H): z, xBC and dt projected, convolution + SiLU over xBC, the
 *    selective scan (D skip included), silu(z)-gated (grouped) RMSNorm, out_proj;
 *  - LFM2's gated short convolution: B, C, x projected, conv(B * x) (no activation), times C, out_proj.
 * The tensors are the loader's slots (family.h SM_T_REC_*), fused projections already split into views. */
#include "model/model.h"
#include "model/tp.h"

void sm_rec_scratch(const sm_config *c, size_t per[SM_REC_SCRATCH]) {
  const sm_rec_config *r = &c->rec;
  const size_t conv = (size_t)sm_config_rec_conv_dim(c);
  for (int i = 0; i < SM_REC_SCRATCH; i++) per[i] = 1;
  per[SM_REC_S_IN] = per[SM_REC_S_CONV] = conv;
  switch (r->kind) {
    case SM_REC_GDN:
      per[SM_REC_S_Z] = per[SM_REC_S_Y] = (size_t)r->gdn_v_heads * r->gdn_v_dim;
      per[SM_REC_S_B] = per[SM_REC_S_A] = (size_t)r->gdn_v_heads;
      break;
    case SM_REC_MAMBA2:
      per[SM_REC_S_Z] = per[SM_REC_S_Y] = (size_t)r->m_heads * r->m_head_dim;
      per[SM_REC_S_A] = (size_t)r->m_heads;
      break;
    case SM_REC_SHORTCONV: per[SM_REC_S_Z] = per[SM_REC_S_B] = per[SM_REC_S_Y] = conv; break;
    case SM_REC_NONE: break;
  }
}

/* y[n][rows] = W x (+ bias) */
static void proj(smelt_model *m, sm_mm_role role, const sm_layer *L, sm_layer_tensor s, const float *x, int n,
                 float *y) {
  sm_backend *be = m->be;
  be->matmul(be, role, &L->w[s], x, n, y);
  if (L->bias[s]) be->add_rows(be, y, L->bias[s], n, (int)L->w[s].rows);
}

/* the output projection; with the model split (tp.h) the ranks' shares summed before the bias */
static void out_proj(smelt_model *m, const sm_layer *L, const float *y, int n, float *out) {
  sm_backend *be = m->be;
  be->matmul(be, SM_MM_REC_OUT, &L->w[SM_T_REC_OUT], y, n, out);
  if (sm_tp_sums(m)) be->all_reduce(be, out, (size_t)n * (size_t)m->cfg.hidden_size);
  if (L->bias[SM_T_REC_OUT]) be->add_rows(be, out, L->bias[SM_T_REC_OUT], n, (int)L->w[SM_T_REC_OUT].rows);
}

void sm_rec_mixer(smelt_model *m, const sm_kv_cache *kv, int l, const float *ain, int n, float *out) {
  const sm_config *c = &m->cfg;
  const sm_rec_config *r = &c->rec;
  sm_backend *be = m->be;
  const sm_layer *L = &m->layers[l];
  float *const *s = m->rec;
  const int conv = sm_config_rec_conv_dim(c), K = r->conv_kernel;
  const float eps = c->rms_norm_eps;
  switch (r->kind) {
    case SM_REC_GDN: {
      const int nk = r->gdn_k_heads, nv = r->gdn_v_heads, dk = r->gdn_k_dim, dv = r->gdn_v_dim, kd = nk * dk;
      proj(m, SM_MM_REC_IN, L, SM_T_REC_IN, ain, n, s[SM_REC_S_IN]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_Z, ain, n, s[SM_REC_S_Z]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_B, ain, n, s[SM_REC_S_B]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_A, ain, n, s[SM_REC_S_A]);
      be->conv1d(be, s[SM_REC_S_CONV], s[SM_REC_S_IN], L->vec[SM_T_REC_CONV], L->bias[SM_T_REC_CONV], conv, K, true, kv,
                 l);
      const float *qkv = s[SM_REC_S_CONV];
      be->gated_delta(be, s[SM_REC_S_Y], qkv, qkv + kd, qkv + 2 * kd, conv, s[SM_REC_S_A], s[SM_REC_S_B],
                      L->vec[SM_T_REC_A_LOG], L->vec[SM_T_REC_DT_BIAS], nk, nv, dk, dv, kv, l);
      be->gated_rmsnorm(be, s[SM_REC_S_Y], s[SM_REC_S_Y], s[SM_REC_S_Z], L->vec[SM_T_REC_NORM], n, nv * dv, dv, dv, eps,
                        true);
      out_proj(m, L, s[SM_REC_S_Y], n, out);
      break;
    }
    case SM_REC_MAMBA2: {
      const int nh = r->m_heads, P = r->m_head_dim, G = r->m_groups, N = r->m_state, I = nh * P;
      proj(m, SM_MM_REC_IN, L, SM_T_REC_Z, ain, n, s[SM_REC_S_Z]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_IN, ain, n, s[SM_REC_S_IN]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_A, ain, n, s[SM_REC_S_A]);
      be->conv1d(be, s[SM_REC_S_CONV], s[SM_REC_S_IN], L->vec[SM_T_REC_CONV], L->bias[SM_T_REC_CONV], conv, K, true, kv,
                 l);
      const float *xbc = s[SM_REC_S_CONV];
      be->ssm_scan(be, s[SM_REC_S_Y], xbc, xbc + I, xbc + I + G * N, conv, s[SM_REC_S_A], L->vec[SM_T_REC_DT_BIAS],
                   L->vec[SM_T_REC_A_LOG], L->vec[SM_T_REC_D], nh, P, G, N, r->dt_min, r->dt_max, kv, l);
      be->gated_rmsnorm(be, s[SM_REC_S_Y], s[SM_REC_S_Y], s[SM_REC_S_Z], L->vec[SM_T_REC_NORM], n, I,
                        r->m_norm_grouped ? I / G : I, I, eps, false);
      out_proj(m, L, s[SM_REC_S_Y], n, out);
      break;
    }
    case SM_REC_SHORTCONV: {
      const int H = conv; /* channels: hidden_size, or a rank's share of them */
      proj(m, SM_MM_REC_IN, L, SM_T_REC_B, ain, n, s[SM_REC_S_B]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_Z, ain, n, s[SM_REC_S_Z]);
      proj(m, SM_MM_REC_IN, L, SM_T_REC_IN, ain, n, s[SM_REC_S_IN]);
      be->mul(be, s[SM_REC_S_IN], s[SM_REC_S_B], s[SM_REC_S_IN], (size_t)n * H);
      be->conv1d(be, s[SM_REC_S_CONV], s[SM_REC_S_IN], L->vec[SM_T_REC_CONV], L->bias[SM_T_REC_CONV], H, K, false, kv,
                 l);
      be->mul(be, s[SM_REC_S_Y], s[SM_REC_S_Z], s[SM_REC_S_CONV], (size_t)n * H);
      out_proj(m, L, s[SM_REC_S_Y], n, out);
      break;
    }
    case SM_REC_NONE: break;
  }
}

// The fused encoded step's choice of form: AVX-512 (fused_encoded_step_avx512.cpp) or AVX2
// (fused_encoded_step_avx2.cpp), by the active format-kernel ISA; none off x86.
#include "scalify/optim/fused_encoded_step.hpp"

#include "scalify/formats/kernels.hpp"

namespace scalify::optim {

#if SCALIFY_HAVE_X86_SIMD
void fused_update_pass_avx512(const PlainUpdate& u, float lr, float wd, const float* g, const WeightsIn& w, float* next,
                              const FusedMoment& m, const FusedMoment& v, int64_t begin, int64_t end, PassAmax& amax);
void fused_update_pass_avx2(const PlainUpdate& u, float lr, float wd, const float* g, const WeightsIn& w, float* next, const FusedMoment& m,
                            const FusedMoment& v, int64_t begin, int64_t end, PassAmax& amax);
void fused_moments_pass_avx512(const PlainUpdate& u, const float* g, const FusedMoment& m, const FusedMoment& v, bool m_too, bool v_too,
                               int64_t begin, int64_t end);
void fused_moments_pass_avx2(const PlainUpdate& u, const float* g, const FusedMoment& m, const FusedMoment& v, bool m_too, bool v_too,
                             int64_t begin, int64_t end);
#endif

bool fused_step_applies(const StateFormat& m, const StateFormat& v, VectorCodec* m_codec, VectorCodec* v_codec) {
  VectorCodec mc, vc;
  if (!SCALIFY_HAVE_X86_SIMD || kernels::active_isa() == kernels::Isa::scalar || !vector_codec(m, mc) || !vector_codec(v, vc)) return false;
  const bool mg = m.scaling == StateScaling::per_group, vg = v.scaling == StateScaling::per_group;
  if (mg && vg && m.group_size != v.group_size) return false;
  const int64_t group = mg ? m.group_size : vg ? v.group_size : 16;
  if (group % 16 != 0 || group > kMaxFusedGroup) return false;
  if (m_codec) *m_codec = mc;
  if (v_codec) *v_codec = vc;
  return true;
}

#if SCALIFY_HAVE_X86_SIMD
void fused_update_pass(const PlainUpdate& u, float lr, float wd, const float* g, const WeightsIn& w, float* next, const FusedMoment& m,
                       const FusedMoment& v, int64_t begin, int64_t end, PassAmax& amax) {
  if (kernels::active_isa() == kernels::Isa::avx512) return fused_update_pass_avx512(u, lr, wd, g, w, next, m, v, begin, end, amax);
  fused_update_pass_avx2(u, lr, wd, g, w, next, m, v, begin, end, amax);
}

void fused_moments_pass(const PlainUpdate& u, const float* g, const FusedMoment& m, const FusedMoment& v, bool m_too, bool v_too,
                        int64_t begin, int64_t end) {
  if (kernels::active_isa() == kernels::Isa::avx512) return fused_moments_pass_avx512(u, g, m, v, m_too, v_too, begin, end);
  fused_moments_pass_avx2(u, g, m, v, m_too, v_too, begin, end);
}
#endif

}  // namespace scalify::optim

#include <cstdio>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/arch/copy_sm75.hpp>
#include <cute/atom/copy_traits_sm75.hpp>
#include <cutlass/numeric_types.h>
using namespace cute;
using Element = cutlass::bfloat16_t;
int main() {
  using Mma = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, _64, _256>>(),
                                      Layout<Shape<_1, _1, _1>>{}));
  using SmemLayoutdS = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, make_shape(_64{}, _64{}, _1{})));
  static Element buf[64 * 64];
  Tensor sP = make_tensor(make_smem_ptr(buf), SmemLayoutdS{});
  Mma mma;
  auto st = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma);
  auto ld = make_tiled_copy_C(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  auto cP = make_identity_tensor(make_shape(_64{}, _64{}));
  int bad_acc = 0, bad_stld = 0, n = 0;
  for (int t = 0; t < 128; ++t) {
    auto thr = mma.get_thread_slice(t);
    auto acc = partition_fragment_C(mma, make_shape(_64{}, _64{}));
    auto cacc = thr.partition_C(cP);
    auto sthr = st.get_thread_slice(t);
    auto lthr = ld.get_thread_slice(t);
    auto sd = sthr.partition_D(sP);
    auto ls = lthr.partition_S(sP);
    auto sr = sthr.retile_S(acc);
    auto lr = lthr.retile_D(acc);
    long st_addr[64], ld_addr[64];
    for (int j = 0; j < size(sr); ++j) st_addr[sr.layout()(j)] = raw_pointer_cast(&sd(j)) - buf;
    for (int j = 0; j < size(lr); ++j) ld_addr[lr.layout()(j)] = raw_pointer_cast(&ls(j)) - buf;
    for (int j = 0; j < size(acc); ++j) {
      const int off = acc.layout()(j);
      const long want = raw_pointer_cast(&sP(get<0>(cacc(j)), get<1>(cacc(j)), 0)) - buf;
      ++n;
      bad_acc += st_addr[off] != want;
      bad_stld += st_addr[off] != ld_addr[off];
      if (st_addr[off] != want && bad_acc <= 3) printf("t %d j %d (%d,%d): st %ld want %ld ld %ld\n", t, j, int(get<0>(cacc(j))), int(get<1>(cacc(j))), st_addr[off], want, ld_addr[off]);
    }
  }
  printf("%d elements: stmatrix.trans vs the accumulator's (query, key) in sP: %d differ; ldmatrix.trans vs stmatrix.trans: %d differ\n", n, bad_acc, bad_stld);
  return bad_acc + bad_stld != 0;
}

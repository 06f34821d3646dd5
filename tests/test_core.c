/* test_core.c — creation, metadata, dtypes and conversions, RNG. */
#include "harness.h"

TEST(test_zeros_has_shape_and_zero_values)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_NOTNULL(t);
    CHECK(em_ndim(t) == 2 && em_size(t, 0) == 2 && em_size(t, -1) == 3);
    CHECK(em_numel(t) == 6);
    CHECK_VALUES(t, 0, 0, 0, 0, 0, 0, 0);
    em_scope_end(s);
}

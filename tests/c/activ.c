/* Checks the float activations of fs_common.h against double math:
 *   - fs_expf_nonpos(x) within 3e-7 relative of exp(x) for x in [-87, 0], 0 below -87;
 *   - fs_silu_f(g) within 4 ulp of g / (1 + exp(-g)) for g in [-87, 100] (every 61st float;
 *     values below 1e-37 in magnitude are checked absolutely), -0 or 0 below -87.
 * Built and run by tests/test_activ_c.py; exit status = failures. */
#include <math.h>
#include <stdio.h>
#include "fs_common.h"

int main(void)
{
    int fails = 0;
    double worst_exp = 0.0, worst_silu = 0.0;
    for (float x = -87.0f; x <= 0.0f; x = nextafterf(x, 1.0f)) {
        double want = exp((double)x), err = fabs((double)fs_expf_nonpos(x) - want) / want;
        if (!(err <= 3e-7)) {
            if (fails < 10) printf("exp(%.9g): relative error %g\n", x, err);
            fails++;
        }
        worst_exp = err > worst_exp ? err : worst_exp;
        for (int i = 0; i < 60 && x < 0.0f; i++) x = nextafterf(x, 1.0f);
    }
    for (float g = -87.0f; g <= 100.0f; g = nextafterf(g, 200.0f)) {
        double want = (double)g / (1.0 + exp(-(double)g)), got = fs_silu_f(g);
        double ulp = ldexp(1.0, ilogb(want == 0.0 ? 1e-37 : want) - 23);
        double err = fabs(want) < 1e-37 ? (fabs(got - want) <= 1e-37 ? 0.0 : 1e9)
                                        : fabs(got - want) / ulp;
        if (!(err <= 4.0)) {
            if (fails < 10) printf("silu(%.9g) = %.9g, want %.9g (%g ulp)\n", g, got, want, err);
            fails++;
        }
        worst_silu = err > worst_silu ? err : worst_silu;
        for (int i = 0; i < 60; i++) g = nextafterf(g, 200.0f);
    }
    /* (silu(-inf) is NaN, as in the double formula and the NumPy twin: -inf * 0) */
    const float below[] = {-87.5f, -100.0f, -1e30f, -INFINITY};
    for (int i = 0; i < 4; i++)
        if (fs_expf_nonpos(below[i]) != 0.0f || (i < 3 && fs_silu_f(below[i]) != 0.0f)) {
            printf("x = %g: exp %g silu %g, want 0\n", below[i], fs_expf_nonpos(below[i]),
                   fs_silu_f(below[i]));
            fails++;
        }
    printf("worst: exp %.3g relative, silu %.3g ulp\n%d failures\n", worst_exp, worst_silu,
           fails);
    return fails;
}

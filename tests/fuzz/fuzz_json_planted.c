/* fuzz_json_planted.c — the fuzzer shown catching a planted bug: the JSON
 * reader built with EMBER_FUZZ_PLANTED_BUG, which drops the bounds check of
 * a \uXXXX escape's hex digits (nn/json.c, hex4), so a text ending inside
 * an escape is read past its end. scripts/fuzz.sh expects this target to
 * stop with AddressSanitizer's heap-buffer-overflow within its time. */
#define EMBER_FUZZ_PLANTED_BUG 1
#include "nn/json.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jval v;
    char err[160];
    if (json_parse((const char *)data, size, &v, err, sizeof err)) json_free(&v);
    return 0;
}

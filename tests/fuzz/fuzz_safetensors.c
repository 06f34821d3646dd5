/* fuzz_safetensors.c — libFuzzer target for the safetensors reader and the
 * JSON reader under it.
 *
 * Input: 2 bytes (little-endian) giving the data buffer's length, then the
 * header JSON. The target writes the file (8-byte header length, header,
 * that many zero bytes), opens it, reads every tensor and the metadata; and
 * parses the header on its own with json_check and json_parse (the tree the
 * accelerator's state files use). Invariants: no crash, leak or undefined
 * behaviour (ASan/UBSan); a refused file fails with EM_ERR_IO and a message
 * naming it; json_check and json_parse agree. */
#include <string.h>

#include "ember/ember.h"
#include "fuzz_util.h"
#include "nn/json_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t dlen = (size_t)data[0] | (size_t)data[1] << 8, hlen = size - 2;
    const uint8_t *h = data + 2;
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (uint8_t)((uint64_t)hlen >> (8 * k));
    uint8_t *head = malloc(8 + hlen);
    memcpy(head, len8, 8);
    memcpy(head + 8, h, hlen);
    const char *path = fuzz_file(head, 8 + hlen, NULL, dlen);
    free(head);

    em_clear_error();
    em_safetensors *f = em_safetensors_open(path);
    if (!f) {
        FUZZ_CHECK(em_last_status() == EM_ERR_IO && strstr(em_last_error(), path), "status %d: %s",
                   (int)em_last_status(), em_last_error());
    } else {
        for (int i = 0; i < em_safetensors_count(f); i++) {
            const char *name = em_safetensors_name(f, i);
            FUZZ_CHECK(name && name[0], "tensor %d has no name", i);
            em_tensor *t = em_safetensors_get(f, name);
            FUZZ_CHECK(t || em_last_status() == EM_ERR_DTYPE || em_last_status() == EM_ERR_SHAPE,
                       "get '%s': %s", name, em_last_error());
            em_free(t);
        }
        em_safetensors_metadata(f, "format");
        em_safetensors_close(f);
    }

    char e1[160], e2[160];
    jval v;
    bool checked = json_check((const char *)h, hlen, e1, sizeof e1);
    bool parsed = json_parse((const char *)h, hlen, &v, e2, sizeof e2);
    FUZZ_CHECK(checked == parsed && (checked || !strcmp(e1, e2)), "json_check says %s, json_parse %s",
               checked ? "ok" : e1, parsed ? "ok" : e2);
    if (parsed) json_free(&v);
    return 0;
}

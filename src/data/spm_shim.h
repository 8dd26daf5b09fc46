/* spm_shim.h — SentencePiece models (Debian's libsentencepiece, whose API
 * is C++) as C functions, for tokenizer.c (internal to src/data; the public
 * face is tokenizer.h).  spm_shim.cc is the only C++ of src/: a thin layer
 * that lets no exception cross into C. */
#ifndef TRD_DATA_SPM_SHIM_H
#define TRD_DATA_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct SpmModel SpmModel;

/* Load a .model file (a serialized ModelProto).  NULL with the library's
 * reason in err when it is missing or not a model. */
SpmModel *spm_load(const char *path, char *err, size_t err_len);
void spm_free(SpmModel *m);
int spm_piece_size(const SpmModel *m); /* ids 0..size-1 */
int spm_eos_id(const SpmModel *m);     /* -1 when the model has none */
int spm_is_control(const SpmModel *m, int id);
/* The id of a control piece spelled text[0..len) ("<s>", "</s>"), else
 * -1: the pieces that encoding text never yields from their spelling
 * (user-defined pieces, such as an added "<|im_start|>", it does). */
int spm_special_id(const SpmModel *m, const char *text, size_t len);

/* Append the ids of len bytes of text (the library's normalization and
 * segmentation, as spm_encode: no BOS or EOS added), growing *ids with
 * realloc.  0, or -1 when out of memory or the library fails. */
int spm_encode(const SpmModel *m, const char *text, size_t len, int32_t **ids, size_t *n,
               size_t *cap);

/* The text of ids in 0..size-1, as spm_decode gives it, appended to *out
 * (malloc'd, grown with realloc; *len and *cap updated, NUL-terminated).
 * 0, or -1 when out of memory or the library fails. */
int spm_decode(const SpmModel *m, const int32_t *ids, size_t n, char **out, size_t *len,
               size_t *cap);

#ifdef __cplusplus
}
#endif

#endif

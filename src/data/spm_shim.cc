// spm_shim.cc — spm_shim.h over sentencepiece::SentencePieceProcessor.
// Every function catches what the library or the standard library may
// throw (std::bad_alloc) and reports it as a failure: C callers never see
// an exception.
#include "data/spm_shim.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

struct SpmModel {
    sentencepiece::SentencePieceProcessor sp;
};

// Grow a malloc'd buffer of elem-sized items to hold at least need.
static bool grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *p = std::realloc(*buf, c * elem);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

extern "C" SpmModel *spm_load(const char *path, char *err, size_t err_len)
{
    try {
        auto m = std::make_unique<SpmModel>();
        const sentencepiece::util::Status st = m->sp.Load(path);
        if (!st.ok()) {
            // A file that is not a ModelProto fails deep in the library
            // ("Internal: ...cc(1101) [model_proto->ParseFromArray(...)]").
            const std::string why = st.ToString();
            std::snprintf(err, err_len, "%s",
                          why.find("ParseFromArray") != std::string::npos
                              ? "not a SentencePiece model (it does not parse as a ModelProto)"
                              : why.c_str());
            return nullptr;
        }
        return m.release();
    } catch (const std::exception &e) {
        std::snprintf(err, err_len, "%s", e.what());
        return nullptr;
    }
}

extern "C" void spm_free(SpmModel *m) { delete m; }
extern "C" int spm_piece_size(const SpmModel *m) { return m->sp.GetPieceSize(); }
extern "C" int spm_eos_id(const SpmModel *m) { return m->sp.eos_id(); }
extern "C" int spm_is_control(const SpmModel *m, int id) { return m->sp.IsControl(id); }

extern "C" int spm_special_id(const SpmModel *m, const char *text, size_t len)
{
    try {
        const int id = m->sp.PieceToId(std::string_view(text, len));
        if (id < 0 || id >= m->sp.GetPieceSize() || id == m->sp.unk_id())
            return -1;
        return m->sp.IsControl(id) ? id : -1; /* user-defined pieces: Encode finds them */
    } catch (const std::exception &) {
        return -1;
    }
}

extern "C" int spm_encode(const SpmModel *m, const char *text, size_t len, int32_t **ids, size_t *n,
                          size_t *cap)
{
    try {
        std::vector<int> v;
        if (!m->sp.Encode(std::string_view(text, len), &v).ok())
            return -1;
        if (!grow(reinterpret_cast<void **>(ids), cap, *n + v.size(), sizeof **ids))
            return -1;
        for (int id : v)
            (*ids)[(*n)++] = id;
        return 0;
    } catch (const std::exception &) {
        return -1;
    }
}

extern "C" int spm_decode(const SpmModel *m, const int32_t *ids, size_t n, char **out, size_t *len,
                          size_t *cap)
{
    try {
        const std::vector<int> v(ids, ids + n);
        std::string text;
        if (!m->sp.Decode(v, &text).ok())
            return -1;
        if (!grow(reinterpret_cast<void **>(out), cap, *len + text.size() + 1, 1))
            return -1;
        std::memcpy(*out + *len, text.data(), text.size());
        *len += text.size();
        (*out)[*len] = '\0';
        return 0;
    } catch (const std::exception &) {
        return -1;
    }
}

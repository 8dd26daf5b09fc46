/* ckpt_peft.c — a LoRA run's adapters as a PEFT adapter directory
 * (adapter_config.json + adapter_model.safetensors), the layout the `peft`
 * library loads onto a Llama or a GPT-2 model: each adapted linear layer
 * gets base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight
 * [out, r] in fp32.
 *
 * Llama: trident's fused qkv adapter (one A, B over the fused rows)
 * becomes q_proj, k_proj and v_proj adapters that share A, each B the rows
 * of its part in Hugging Face's order (the RoPE rows reordered as the
 * merged export reorders the weight, ckpt_hf_qkv_src_row), so B_part A is
 * exactly the fused update's part.
 *
 * GPT-2: Hugging Face's layers are Conv1D, weight [in, out] (nn.Linear's
 * transposed).  peft still stores A [r, in] and B [out, r] for them and,
 * told fan_in_fan_out, merges (B A) transposed; its unmerged forward is
 * x A^T B^T either way.  So the adapters are trident's as they are, except
 * that c_attn's B takes its rows in c_attn's [Q | K | V] column order, as
 * the merged export orders the fused weight (QKV_ALL). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "checkpoint/ckpt.h"
#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

typedef struct {
    char name[160];
    int64_t rows, cols;
    float *data; /* owned */
} PeftTensor;

typedef struct {
    PeftTensor *t;
    int n, cap;
} PeftSet;

static PeftTensor *peft_add(PeftSet *s, int64_t rows, int64_t cols, const char *fmt, int layer,
                            const char *module, char ab)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 32;
        s->t = realloc(s->t, (size_t)s->cap * sizeof *s->t);
        TRD_ASSERT(s->t);
    }
    PeftTensor *t = &s->t[s->n++];
    snprintf(t->name, sizeof t->name, fmt, layer, module, ab);
    t->rows = rows;
    t->cols = cols;
    t->data = trd_malloc((size_t)(rows * cols) * sizeof(float) + 1, "PEFT tensor");
    return t;
}

/* The Hugging Face module of a trident base name (not the fused qkv), or
 * NULL. */
static const char *hf_module(const char *base, ModelArch arch)
{
    static const char *const llama[][2] = {{"attn.proj", "self_attn.o_proj"},
                                           {"mlp.gate", "mlp.gate_proj"},
                                           {"mlp.up", "mlp.up_proj"},
                                           {"mlp.down", "mlp.down_proj"}};
    static const char *const gpt2[][2] = {{"attn.proj", "attn.c_proj"},
                                          {"mlp.fc", "mlp.c_fc"},
                                          {"mlp.proj", "mlp.c_proj"},
                                          {NULL, NULL}};
    const char *const(*map)[2] = arch == ARCH_GPT2 ? gpt2 : llama;
    for (size_t i = 0; i < 4 && map[i][0]; i++)
        if (!strcmp(base, map[i][0]))
            return map[i][1];
    return NULL;
}

#define PEFT_LLAMA "base_model.model.model.layers.%d.%s.lora_%c.weight"
#define PEFT_GPT2  "base_model.model.transformer.h.%d.%s.lora_%c.weight"

/* Every adapter of t (one rank, the whole model) into s, in HF's names. */
static int peft_collect(PeftSet *s, const ParamTable *t, const float *data, const ModelConfig *m,
                        char err[CFG_ERR])
{
    const int64_t hs = m->hidden / m->heads, r = m->lora.rank;
    const int gpt2 = m->arch == ARCH_GPT2;
    const char *const fmt = gpt2 ? PEFT_GPT2 : PEFT_LLAMA;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        int layer, len = 0;
        char base[PARAM_NAME];
        if (sscanf(p->name, "layers.%d.%63[a-z.]%n", &layer, base, &len) != 2) {
            ckpt_err(err, "peft export: unexpected tensor '%s'", p->name);
            return TRD_EXIT_INPUT;
        }
        char *dot = strrchr(base, '.'); /* "attn.qkv.lora_" -> "attn.qkv" */
        const char ab = p->name[strlen(p->name) - 1];
        if (!dot || (ab != 'A' && ab != 'B')) {
            ckpt_err(err, "peft export: '%s' is not an adapter", p->name);
            return TRD_EXIT_INPUT;
        }
        *dot = '\0';
        const float *x = data + p->offset;
        if (strcmp(base, "attn.qkv")) {
            const char *mod = hf_module(base, m->arch);
            if (!mod) {
                ckpt_err(err, "peft export: no Hugging Face module for '%s'", p->name);
                return TRD_EXIT_INPUT;
            }
            PeftTensor *o = peft_add(s, p->shape[0], p->shape[1], fmt, layer, mod, ab);
            memcpy(o->data, x, p->numel * sizeof(float));
            continue;
        }
        if (gpt2) { /* c_attn: B's rows in [Q | K | V] order, A as it is */
            PeftTensor *o = peft_add(s, p->shape[0], p->shape[1], fmt, layer, "attn.c_attn", ab);
            for (int64_t j = 0; j < p->shape[0]; j++) {
                const int64_t src =
                    ab == 'A' ? j : ckpt_hf_qkv_src_row(m->heads, m->kv_heads, hs, QKV_ALL, j);
                memcpy(o->data + j * p->shape[1], x + src * p->shape[1],
                       (size_t)p->shape[1] * sizeof(float));
            }
            continue;
        }
        static const char *const qkv[3] = {"self_attn.q_proj", "self_attn.k_proj",
                                           "self_attn.v_proj"};
        for (int part = QKV_Q; part <= QKV_V; part++) {
            if (ab == 'A') { /* shared by the three */
                PeftTensor *o = peft_add(s, r, m->hidden, fmt, layer, qkv[part], ab);
                memcpy(o->data, x, p->numel * sizeof(float));
                continue;
            }
            const int64_t rows = (part == QKV_Q ? m->heads : m->kv_heads) * hs;
            PeftTensor *o = peft_add(s, rows, r, fmt, layer, qkv[part], ab);
            for (int64_t j = 0; j < rows; j++) {
                const int64_t src = ckpt_hf_qkv_src_row(m->heads, m->kv_heads, hs, part, j);
                memcpy(o->data + j * r, x + src * r, (size_t)r * sizeof(float));
            }
        }
    }
    return TRD_EXIT_OK;
}

/* safetensors: an 8-byte little-endian header length, the JSON header
 * (names -> dtype, shape, byte offsets), then the tensors' bytes. */
static int peft_write_safetensors(const PeftSet *s, const char *path, char err[CFG_ERR])
{
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(cJSON_AddObjectToObject(h, "__metadata__"), "format", "pt");
    uint64_t off = 0;
    for (int i = 0; i < s->n; i++) {
        const PeftTensor *t = &s->t[i];
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        const double shape[2] = {(double)t->rows, (double)t->cols};
        cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, 2));
        const uint64_t bytes = (uint64_t)(t->rows * t->cols) * sizeof(float);
        const double offs[2] = {(double)off, (double)(off + bytes)};
        cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t len = strlen(json);
    const size_t padded = (len + 7) / 8 * 8; /* the data starts 8-aligned */
    FILE *f = fopen(path, "wb");
    int ok = f != NULL;
    if (ok) {
        uint8_t n8[8];
        for (int k = 0; k < 8; k++)
            n8[k] = (uint8_t)((uint64_t)padded >> (8 * k));
        ok = fwrite(n8, 1, 8, f) == 8 && fwrite(json, 1, len, f) == len;
        for (size_t k = len; ok && k < padded; k++)
            ok = fputc(' ', f) != EOF;
        for (int i = 0; ok && i < s->n; i++) { /* x86 and arm64 hosts: little-endian floats */
            const size_t n = (size_t)(s->t[i].rows * s->t[i].cols);
            ok = fwrite(s->t[i].data, sizeof(float), n, f) == n;
        }
        ok = fclose(f) == 0 && ok;
    }
    free(json);
    if (!ok)
        ckpt_err(err, "%s: cannot write: %s", path, strerror(errno));
    return ok ? TRD_EXIT_OK : TRD_EXIT_RUNTIME;
}

static int peft_write_config(const ModelConfig *m, const char *path, char err[CFG_ERR])
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(c, "base_model_name_or_path", m->lora.base);
    cJSON_AddNumberToObject(c, "r", m->lora.rank);
    cJSON_AddNumberToObject(c, "lora_alpha", m->lora.alpha);
    cJSON_AddNumberToObject(c, "lora_dropout", m->lora.dropout);
    cJSON_AddStringToObject(c, "bias", "none");
    /* GPT-2's Conv1D weights are [in, out]: peft merges (B A) transposed. */
    cJSON_AddBoolToObject(c, "fan_in_fan_out", m->arch == ARCH_GPT2);
    cJSON_AddBoolToObject(c, "inference_mode", 1);
    cJSON_AddBoolToObject(c, "use_rslora", 0);
    cJSON_AddBoolToObject(c, "init_lora_weights", 1);
    cJSON *mods = cJSON_AddArrayToObject(c, "target_modules");
    char bad[64];
    const int mask = config_lora_mask(m->lora.targets, m->arch, bad, sizeof bad);
    /* peft adapts a module whose full name is an entry or ends in "." and
     * an entry: GPT-2's two c_proj (attention and MLP output) are told
     * apart by their parent. */
    static const struct {
        int bit;
        const char *llama[3], *gpt2;
    } T[] = {{LORA_QKV, {"q_proj", "k_proj", "v_proj"}, "c_attn"},
             {LORA_PROJ, {"o_proj"}, "attn.c_proj"},
             {LORA_FC, {"gate_proj"}, "c_fc"},
             {LORA_UP, {"up_proj"}, NULL},
             {LORA_FCPROJ, {"down_proj"}, "mlp.c_proj"}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        if (!(mask & T[i].bit))
            continue;
        if (m->arch == ARCH_GPT2 && T[i].gpt2)
            cJSON_AddItemToArray(mods, cJSON_CreateString(T[i].gpt2));
        for (int k = 0; k < 3 && m->arch != ARCH_GPT2 && T[i].llama[k]; k++)
            cJSON_AddItemToArray(mods, cJSON_CreateString(T[i].llama[k]));
    }
    char *json = cJSON_Print(c);
    cJSON_Delete(c);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(json, f) >= 0 && fputc('\n', f) != EOF;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(json);
    if (!ok)
        ckpt_err(err, "%s: cannot write: %s", path, strerror(errno));
    return ok ? TRD_EXIT_OK : TRD_EXIT_RUNTIME;
}

int ckpt_peft_export(const char *out_dir, const ParamTable *t, const float *data,
                     const ModelConfig *m, char err[CFG_ERR])
{
    if (m->arch == ARCH_GPT2 && m->kv_heads != m->heads) {
        ckpt_err(err,
                 "peft export: a gpt2 model with kv_heads %d < heads %d (grouped-query "
                 "attention) has no GPT2LMHeadModel equivalent; use arch llama",
                 m->kv_heads, m->heads);
        return TRD_EXIT_INPUT;
    }
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        ckpt_err(err, "%s: cannot create: %s", out_dir, strerror(errno));
        return TRD_EXIT_INPUT;
    }
    PeftSet s = {0};
    int code = peft_collect(&s, t, data, m, err);
    char path[CFG_STR + 64];
    if (code == TRD_EXIT_OK) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
        code = peft_write_safetensors(&s, path, err);
    }
    if (code == TRD_EXIT_OK) {
        snprintf(path, sizeof path, "%s/adapter_config.json", out_dir);
        code = peft_write_config(m, path, err);
    }
    if (code == TRD_EXIT_OK)
        printf("exported %d adapter tensors (rank %d, alpha %g) to %s: adapter_config.json, "
               "adapter_model.safetensors (PEFT)\n",
               s.n, m->lora.rank, (double)m->lora.alpha, out_dir);
    for (int i = 0; i < s.n; i++)
        free(s.t[i].data);
    free(s.t);
    return code;
}

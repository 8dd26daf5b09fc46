/* config.c — YAML and --set parsing, defaults and YAML output of Config
 * (the range and consistency rules are in config_validate.c).
 *
 * One table of key descriptors (KEYS below) drives everything: the YAML
 * loader, `--set` overrides and the YAML writer all look a key up there and
 * go through the same typed parsers, so a key added to the table is read,
 * overridden and written back without further code.  Positions come from
 * libyaml's document API (0-based marks, printed 1-based). */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* Enum fields are stored through an int pointer by the table code. */
_Static_assert(sizeof(ModelArch) == sizeof(int), "enum fields must be int-sized");
_Static_assert(sizeof(ResumeKind) == sizeof(int), "enum fields must be int-sized");
_Static_assert(sizeof(RopeScaling) == sizeof(int), "enum fields must be int-sized");

/* ------------------------------------------------------------------------ */
/* The key table                                                             */
/* ------------------------------------------------------------------------ */

typedef enum {
    K_INT,       /* int */
    K_INT_AUTO,  /* int, or "auto" stored as 0 */
    K_EVERY,     /* int >= 0, or "auto" stored as CKPT_EVERY_AUTO */
    K_U64,       /* uint64_t, non-negative */
    K_FLOAT,     /* float, finite */
    K_BOOL,      /* int 0/1 from true/false */
    K_BOOL_AUTO, /* int 0/1, or "auto" stored as -1 (resolved by validation) */
    K_STR,       /* char[size] */
    K_ENUM,      /* int-sized enum, value = index into names */
    K_INT_LIST,  /* int[CFG_MAX_STAGES], count at aux */
    K_RESUME,    /* ResumeKind: auto | never | PATH (path stored at aux) */
    K_NAMES,     /* char[size]: a list of names, or one comma-separated string */
    K_BLEND,     /* char[size]: "W1 PATH1 W2 PATH2 ...", or a list of {path, weight} */
    K_CAPACITY,  /* float > 0, or "dropless" stored as 0 (model.moe.capacity_factor) */
} KeyKind;

typedef struct {
    const char *section; /* "" for top-level keys (backend) */
    const char *name;
    KeyKind kind;
    size_t offset;            /* offsetof(Config, ...) */
    size_t aux;               /* K_STR: buffer size; K_INT_LIST: count offset;
                                  K_RESUME: offset of the path buffer */
    const char *const *names; /* K_ENUM: names indexed by value, NULL-ended */
    bool required;
} KeyDesc;

static const char *const ARCH_NAMES[] = {"gpt2", "llama", NULL};
static const char *const SCHED_NAMES[] = {"1f1b", "interleaved", "gpipe", NULL};
static const char *const DECAY_NAMES[] = {"cosine", "linear", "constant", NULL};
static const char *const PREC_NAMES[] = {"fp32", "bf16", NULL};
static const char *const RECOMPUTE_NAMES[] = {"none", "selective", "full", NULL};
static const char *const FORMAT_NAMES[] = {"megatron", "llmc", NULL};
static const char *const BACKEND_NAMES[] = {"cpu", "cuda", NULL};
static const char *const COMM_NAMES[] = {"auto", "mpi", "nccl", NULL};
static const char *const OFFLOAD_NAMES[] = {"none", "optimizer", "optimizer+params", NULL};
static const char *const LORA_BASE_NAMES[] = {"fp32", "bf16", NULL};
static const char *const NONFINITE_NAMES[] = {"stop", "skip", NULL};
static const char *const ASYNC_NAMES[] = {"auto", "true", "false", NULL};
static const char *const ROPE_SCALING_NAMES[] = {"none", "llama3", NULL};

#define OFF(sec, field) offsetof(Config, sec.field)
#define KEY(sec, field, kind)                                                                      \
    {                                                                                              \
#sec, #field, kind, OFF(sec, field), 0, NULL, false                                        \
    }
#define REQ(sec, field, kind)                                                                      \
    {                                                                                              \
#sec, #field, kind, OFF(sec, field), 0, NULL, true                                         \
    }
#define STR(sec, field, req)                                                                       \
    {                                                                                              \
#sec, #field, K_STR, OFF(sec, field), sizeof(((Config *)0)->sec.field), NULL, req          \
    }
#define NAMES(sec, field, kind, req)                                                               \
    {                                                                                              \
#sec, #field, kind, OFF(sec, field), sizeof(((Config *)0)->sec.field), NULL, req           \
    }
#define ENUM(sec, field, names)                                                                    \
    {                                                                                              \
#sec, #field, K_ENUM, OFF(sec, field), 0, names, false                                     \
    }

static const KeyDesc KEYS[] = {
    STR(run, name, false),
    STR(run, dir, false),
    KEY(run, seed, K_U64),
    KEY(run, log_every, K_INT),
    KEY(run, tensorboard, K_BOOL),

    ENUM(model, arch, ARCH_NAMES),
    REQ(model, layers, K_INT),
    REQ(model, hidden, K_INT),
    REQ(model, heads, K_INT),
    KEY(model, kv_heads, K_INT),
    KEY(model, ffn_hidden, K_INT),
    REQ(model, vocab, K_INT),
    KEY(model, vocab_pad_multiple, K_INT),
    REQ(model, seq_len, K_INT),
    KEY(model, tie_embeddings, K_BOOL_AUTO),
    KEY(model, norm_eps, K_FLOAT),
    KEY(model, rope_theta, K_FLOAT),
    ENUM(model, rope_scaling, ROPE_SCALING_NAMES),
    KEY(model, rope_factor, K_FLOAT),
    KEY(model, rope_low_freq_factor, K_FLOAT),
    KEY(model, rope_high_freq_factor, K_FLOAT),
    KEY(model, rope_original_max_position_embeddings, K_INT),
    KEY(model, init_std, K_FLOAT),
    /* model.lora: a mapping inside model (load_key), --set model.lora.rank=8 */
    KEY(model.lora, rank, K_INT),
    KEY(model.lora, alpha, K_FLOAT),
    KEY(model.lora, dropout, K_FLOAT),
    NAMES(model.lora, targets, K_NAMES, false),
    STR(model.lora, base, false),
    ENUM(model.lora, base_dtype, LORA_BASE_NAMES),
    /* model.moe: a mapping inside model (load_key), --set model.moe.experts=8 */
    {"model.moe", "experts", K_INT, OFF(model, moe_experts), 0, NULL, false},
    {"model.moe", "top_k", K_INT, OFF(model, moe_top_k), 0, NULL, false},
    {"model.moe", "every", K_INT, OFF(model, moe_every), 0, NULL, false},
    {"model.moe", "ffn_hidden", K_INT, OFF(model, moe_ffn_hidden), 0, NULL, false},
    {"model.moe", "shared_experts", K_INT, OFF(model, moe_shared_experts), 0, NULL, false},
    {"model.moe", "aux_loss_coef", K_FLOAT, OFF(model, moe_aux_loss_coef), 0, NULL, false},
    {"model.moe", "z_loss_coef", K_FLOAT, OFF(model, moe_z_loss_coef), 0, NULL, false},
    {"model.moe", "capacity_factor", K_CAPACITY, OFF(model, moe_capacity_factor), 0, NULL, false},

    KEY(topology, tp, K_INT),
    KEY(topology, pp, K_INT),
    KEY(topology, ep, K_INT),
    KEY(topology, cp, K_INT),
    KEY(topology, dp, K_INT_AUTO),
    KEY(topology, zero, K_INT),
    KEY(topology, ranks_per_node, K_INT_AUTO),
    KEY(topology, sequence_parallel, K_BOOL),
    ENUM(topology, schedule, SCHED_NAMES),
    KEY(topology, virtual_stages, K_INT),
    {"topology", "stage_layers", K_INT_LIST, OFF(topology, stage_layers),
     OFF(topology, n_stage_layers), NULL, false},
    STR(topology, order, false),
    KEY(topology, allow_tp_across_nodes, K_BOOL),
    KEY(topology, bucket_mb, K_INT),
    ENUM(topology, comm, COMM_NAMES),
    ENUM(topology, offload, OFFLOAD_NAMES),

    REQ(training, steps, K_INT),
    REQ(training, global_batch, K_INT),
    KEY(training, micro_batch, K_INT_AUTO),
    REQ(training, lr, K_FLOAT),
    KEY(training, min_lr, K_FLOAT),
    KEY(training, warmup_steps, K_INT),
    ENUM(training, decay, DECAY_NAMES),
    KEY(training, weight_decay, K_FLOAT),
    KEY(training, beta1, K_FLOAT),
    KEY(training, beta2, K_FLOAT),
    KEY(training, eps, K_FLOAT),
    KEY(training, grad_clip, K_FLOAT),
    ENUM(training, precision, PREC_NAMES),
    ENUM(training, recompute, RECOMPUTE_NAMES),
    KEY(training, trace, K_BOOL),
    ENUM(training, nonfinite, NONFINITE_NAMES),
    KEY(training, max_skipped, K_INT),
    KEY(training, hang_timeout, K_INT),
    KEY(training, straggler_threshold, K_FLOAT),
    KEY(training, sample_every, K_INT),

    NAMES(data, path, K_NAMES, true), /* or data.blend: check_required */
    ENUM(data, format, FORMAT_NAMES),
    NAMES(data, val_path, K_NAMES, false),
    NAMES(data, blend, K_BLEND, false),
    NAMES(data, val_blend, K_BLEND, false),
    KEY(data, val_every, K_INT),
    KEY(data, val_sequences, K_INT),
    KEY(data, document_mask, K_BOOL),
    KEY(data, eod_mask_loss, K_BOOL),
    KEY(data, eot, K_INT),

    STR(checkpoint, dir, false),
    KEY(checkpoint, every, K_EVERY),
    KEY(checkpoint, keep, K_INT),
    ENUM(checkpoint, async, ASYNC_NAMES),
    {"checkpoint", "resume", K_RESUME, OFF(checkpoint, resume), OFF(checkpoint, resume_path), NULL,
     false},
    {"checkpoint", "allow_changes", K_NAMES, OFF(checkpoint, allow_changes),
     sizeof(((Config *)0)->checkpoint.allow_changes), NULL, false},
    STR(checkpoint, init_from, false),

    {"", "backend", K_ENUM, offsetof(Config, backend), 0, BACKEND_NAMES, false},
};
enum { N_KEYS = sizeof(KEYS) / sizeof(KEYS[0]) };
_Static_assert(N_KEYS <= CFG_MAX_KEYS, "raise CFG_MAX_KEYS in config.h");

/* Keys that were renamed: the old name gets a message that says what
 * replaced it and why, not "unknown key". */
static const struct {
    const char *old, *hint;
} RENAMED[] = {
    {"data.val_batches", "replaced by data.val_sequences (a number of sequences: "
                         "val_batches x micro_batch), so the validation set is the same for "
                         "every layout and micro_batch"},
};

static const char *renamed_hint(const char *full)
{
    for (size_t i = 0; i < sizeof RENAMED / sizeof RENAMED[0]; i++)
        if (!strcmp(full, RENAMED[i].old))
            return RENAMED[i].hint;
    return NULL;
}

static const char *const SECTIONS[] = {"run",  "model",      "topology", "training",
                                       "data", "checkpoint", NULL};

/* "model.hidden", or "backend" for a top-level key. */
static const char *key_fullname(const KeyDesc *k, char buf[64])
{
    if (k->section[0])
        snprintf(buf, 64, "%s.%s", k->section, k->name);
    else
        snprintf(buf, 64, "%s", k->name);
    return buf;
}

static int find_key(const char *section, const char *name)
{
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(KEYS[i].section, section) && !strcmp(KEYS[i].name, name))
            return i;
    return -1;
}

static bool is_section(const char *s)
{
    for (int i = 0; SECTIONS[i]; i++)
        if (!strcmp(SECTIONS[i], s))
            return true;
    return false;
}

/* Every message goes into a CFG_ERR buffer through here; an over-long one is
 * cut, which is acceptable for a message (and keeps gcc's truncation
 * analysis, which cannot know our strings are short, quiet). */
static void put_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_err(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, CFG_ERR, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Suggestions: the closest known name by edit distance                      */
/* ------------------------------------------------------------------------ */

static int edit_distance(const char *a, const char *b)
{
    enum { MAXL = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= MAXL || lb >= MAXL)
        return INT_MAX;
    int row[MAXL];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* A suggestion is worth making only when the typo is small relative to the
 * word; otherwise "tp" would be offered for any two-letter key. */
static bool close_enough(const char *typed, int dist)
{
    return dist <= 2 && 2 * dist < (int)strlen(typed);
}

/* Closest key of `section` ("" = top level) to `typed`, or NULL. */
static const char *suggest_key(const char *section, const char *typed)
{
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(KEYS[i].section, section))
            continue;
        int d = edit_distance(typed, KEYS[i].name);
        if (d < best_d) {
            best_d = d;
            best = KEYS[i].name;
        }
    }
    return best && close_enough(typed, best_d) ? best : NULL;
}

/* Closest top-level name (a section or "backend"). */
static const char *suggest_section(const char *typed)
{
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; SECTIONS[i]; i++) {
        int d = edit_distance(typed, SECTIONS[i]);
        if (d < best_d) {
            best_d = d;
            best = SECTIONS[i];
        }
    }
    int d = edit_distance(typed, "backend");
    if (d < best_d) {
        best_d = d;
        best = "backend";
    }
    return best && close_enough(typed, best_d) ? best : NULL;
}

/* Closest full key name ("training.lr") for --set. */
static const char *suggest_fullname(const char *typed, char buf[64])
{
    int best_d = INT_MAX, best = -1;
    for (int i = 0; i < N_KEYS; i++) {
        char name[64];
        int d = edit_distance(typed, key_fullname(&KEYS[i], name));
        if (d < best_d) {
            best_d = d;
            best = i;
        }
    }
    if (best < 0 || !close_enough(typed, best_d))
        return NULL;
    return key_fullname(&KEYS[best], buf);
}

/* "arch, layers, hidden, ..." — the keys of a section, for messages. */
static void list_keys(const char *section, char *out, size_t n)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < N_KEYS && used < n; i++) {
        if (strcmp(KEYS[i].section, section))
            continue;
        int w = snprintf(out + used, n - used, "%s%s", used ? ", " : "", KEYS[i].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* ------------------------------------------------------------------------ */
/* Typed scalar parsers.  Each returns 0, or -1 with "what is wrong          */
/* (expected ...)" in why.                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    char text[CFG_ERR];
} Why;

static int fail(Why *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Why *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->text, sizeof why->text, fmt, ap);
    va_end(ap);
    return -1;
}

/* Quote a user value for a message, shortened so one bad line cannot flood
 * the error buffer. */
static const char *shown(const char *s, char buf[80])
{
    if (!*s)
        return "nothing";
    if (strlen(s) > 60)
        snprintf(buf, 80, "'%.57s...'", s);
    else
        snprintf(buf, 80, "'%s'", s);
    return buf;
}

static bool all_digits(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

static int parse_int(const char *s, int *out, Why *why)
{
    char b[80];
    const char *digits = (*s == '+' || *s == '-') ? s + 1 : s;
    if (!all_digits(digits))
        return fail(why, "expected an integer, got %s", shown(s, b));
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v < INT_MIN || v > INT_MAX)
        return fail(why, "integer %s is out of range (expected %d..%d)", shown(s, b), INT_MIN,
                    INT_MAX);
    *out = (int)v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out, Why *why)
{
    char b[80];
    const char *digits = *s == '+' ? s + 1 : s;
    if (*s == '-' && all_digits(s + 1))
        return fail(why, "expected a non-negative integer, got %s", shown(s, b));
    if (!all_digits(digits))
        return fail(why, "expected a non-negative integer, got %s", shown(s, b));
    errno = 0;
    unsigned long long v = strtoull(digits, NULL, 10);
    if (errno == ERANGE)
        return fail(why, "integer %s is out of range (expected 0..%llu)", shown(s, b),
                    (unsigned long long)UINT64_MAX);
    *out = (uint64_t)v;
    return 0;
}

/* Decimal numbers only: [+-] digits [. digits] [e [+-] digits], or .5 —
 * strtof alone would also take "nan", "inf" and hex floats. */
static bool looks_decimal(const char *s)
{
    if (*s == '+' || *s == '-')
        s++;
    int mant = 0;
    while (isdigit((unsigned char)*s))
        s++, mant++;
    if (*s == '.') {
        s++;
        while (isdigit((unsigned char)*s))
            s++, mant++;
    }
    if (!mant)
        return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!isdigit((unsigned char)*s))
            return false;
        while (isdigit((unsigned char)*s))
            s++;
    }
    return *s == '\0';
}

static int parse_float(const char *s, float *out, Why *why)
{
    char b[80];
    if (!looks_decimal(s))
        return fail(why, "expected a number, got %s", shown(s, b));
    errno = 0;
    float v = strtof(s, NULL);
    /* ERANGE also flags underflow to a denormal or zero: a value that small
     * is almost certainly a typo in the exponent, so it is refused too. */
    if (errno == ERANGE || !isfinite(v))
        return fail(why,
                    "number %s is out of range for a 32-bit float (expected a magnitude "
                    "between 1.2e-38 and 3.4e38, or 0)",
                    shown(s, b));
    *out = v;
    return 0;
}

/* YAML 1.2 core schema booleans only: yes/no/on/off are plain strings. */
static int parse_bool(const char *s, int *out, Why *why)
{
    char b[80];
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
        *out = 0;
        return 0;
    }
    return fail(why,
                "expected a boolean, true or false (YAML 1.2: yes/no/on/off are not "
                "booleans), got %s",
                shown(s, b));
}

static int parse_enum(const char *s, const char *const *names, int *out, Why *why)
{
    char b[80], list[200] = "";
    size_t used = 0;
    for (int i = 0; names[i]; i++) {
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
        int w = snprintf(list + used, sizeof list - used, "%s%s", i ? "|" : "", names[i]);
        if (w > 0 && (size_t)w < sizeof list - used)
            used += (size_t)w;
    }
    return fail(why, "unknown value %s (expected %s)", shown(s, b), list);
}

static int store_str(char *dst, size_t size, const char *s, Why *why)
{
    size_t n = strlen(s);
    if (n >= size)
        return fail(why, "string is too long (%zu bytes; at most %zu)", n, size - 1);
    /* Zero the whole buffer so two configs with equal values compare equal
     * byte for byte (the round-trip test relies on it). */
    memset(dst, 0, size);
    memcpy(dst, s, n);
    return 0;
}

/* Store one scalar into the field of key k. */
static int set_scalar(Config *cfg, const KeyDesc *k, const char *s, Why *why)
{
    char *field = (char *)cfg + k->offset;
    switch (k->kind) {
    case K_INT:
        return parse_int(s, (int *)field, why);
    case K_INT_AUTO:
        if (!strcmp(s, "auto")) {
            *(int *)field = 0;
            return 0;
        }
        if (!all_digits((*s == '+' || *s == '-') ? s + 1 : s)) {
            char b[80];
            return fail(why, "expected an integer or auto, got %s", shown(s, b));
        }
        return parse_int(s, (int *)field, why);
    case K_EVERY:
        if (!strcmp(s, "auto")) {
            *(int *)field = CKPT_EVERY_AUTO;
            return 0;
        }
        if (!all_digits(*s == '+' ? s + 1 : s)) {
            char b[80];
            return fail(why, "expected a number of steps >= 0 or auto, got %s", shown(s, b));
        }
        return parse_int(s, (int *)field, why);
    case K_U64:
        return parse_u64(s, (uint64_t *)field, why);
    case K_FLOAT:
        return parse_float(s, (float *)field, why);
    case K_BOOL:
        return parse_bool(s, (int *)field, why);
    case K_BOOL_AUTO:
        if (!strcmp(s, "auto")) {
            *(int *)field = -1;
            return 0;
        }
        if (parse_bool(s, (int *)field, why)) {
            char b[80];
            return fail(why, "expected true, false or auto, got %s", shown(s, b));
        }
        return 0;
    case K_STR:
    case K_NAMES:
    case K_BLEND:
        return store_str(field, k->aux, s, why);
    case K_ENUM:
        return parse_enum(s, k->names, (int *)field, why);
    case K_RESUME: {
        char *path = (char *)cfg + k->aux;
        if (!*s)
            return fail(why, "expected auto, never or a checkpoint path, got nothing");
        int kind = !strcmp(s, "auto")    ? RESUME_AUTO
                   : !strcmp(s, "never") ? RESUME_NEVER
                                         : RESUME_PATH;
        if (store_str(path, sizeof cfg->checkpoint.resume_path, kind == RESUME_PATH ? s : "", why))
            return -1;
        *(int *)field = kind;
        return 0;
    }
    case K_INT_LIST:
        return fail(why, "expected a list of integers such as [3, 5], got a scalar '%s'", s);
    case K_CAPACITY: {
        if (!strcmp(s, "dropless")) {
            *(float *)field = 0.0f;
            return 0;
        }
        if (parse_float(s, (float *)field, why))
            return -1;
        if (!(*(float *)field > 0)) {
            char b[80];
            return fail(why, "expected a capacity factor > 0 (1.25 is usual), or dropless, got %s",
                        shown(s, b));
        }
        return 0;
    }
    }
    return fail(why, "internal error: unknown key kind");
}

static int store_list(Config *cfg, const KeyDesc *k, const int *v, int n)
{
    int *dst = (int *)((char *)cfg + k->offset);
    memset(dst, 0, sizeof cfg->topology.stage_layers);
    memcpy(dst, v, (size_t)n * sizeof *v);
    *(int *)((char *)cfg + k->aux) = n;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Defaults and names                                                        */
/* ------------------------------------------------------------------------ */

void config_defaults(Config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->run.name, "trident");
    strcpy(cfg->run.dir, "runs/trident");
    cfg->run.seed = 1234;
    cfg->run.log_every = 10;
    cfg->run.tensorboard = 1;

    ModelConfig *m = &cfg->model;
    m->arch = ARCH_GPT2;
    m->vocab_pad_multiple = 128;
    m->tie_embeddings = -1; /* unset: the arch decides in config_validate */
    m->norm_eps = 1e-5f;
    m->rope_theta = 10000.0f;
    m->init_std = 0.02f;
    m->moe_top_k = 2;
    m->moe_every = 1;
    m->moe_aux_loss_coef = 0.01f;
    m->moe_z_loss_coef = 0.001f;
    m->lora.alpha = 16.0f;
    strcpy(m->lora.targets, "qkv");

    TopologyConfig *t = &cfg->topology;
    t->tp = 1;
    t->pp = 1;
    t->ep = 1;
    t->cp = 1;
    t->schedule = SCHED_1F1B;
    t->virtual_stages = 1;
    strcpy(t->order, "tp-dp-pp");
    t->bucket_mb = 25;

    TrainingConfig *tr = &cfg->training;
    tr->lr = 3e-4f;
    tr->decay = DECAY_COSINE;
    tr->weight_decay = 0.1f;
    tr->beta1 = 0.9f;
    tr->beta2 = 0.95f;
    tr->eps = 1e-8f;
    tr->grad_clip = 1.0f;
    tr->precision = PREC_FP32;
    tr->recompute = RECOMPUTE_NONE;
    tr->nonfinite = NONFINITE_STOP;
    tr->max_skipped = 10;
    tr->hang_timeout = 300;
    tr->straggler_threshold = 1.2f;

    cfg->data.format = DATA_MEGATRON;
    cfg->data.val_sequences = 32;
    cfg->data.eot = -1;

    /* Checkpoints unless asked not to: a preempted or crashed job resumes. */
    strcpy(cfg->checkpoint.dir, "auto");
    cfg->checkpoint.every = CKPT_EVERY_AUTO;
    cfg->checkpoint.keep = 2;
    cfg->checkpoint.resume = RESUME_AUTO;
    cfg->backend = BACKEND_CPU;
}

int config_blend_parse(const char *s, BlendSpec *out, char err[CFG_ERR])
{
    memset(out, 0, sizeof *out);
    char buf[CFG_PATHS];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL, *w = strtok_r(buf, " \t", &save);
    for (; w; w = strtok_r(NULL, " \t", &save)) {
        char *path = strtok_r(NULL, " \t", &save), *end;
        if (!path) {
            put_err(err, "weight %s has no path after it (expected \"W1 PATH1 W2 PATH2 ...\")", w);
            return -1;
        }
        double v = strtod(w, &end);
        if (*end || end == w || !(v > 0) || v > 1e300) {
            put_err(err, "'%s' is not a weight > 0 (expected \"W1 PATH1 W2 PATH2 ...\")", w);
            return -1;
        }
        if (out->n == CFG_MAX_BLEND) {
            put_err(err, "more than %d datasets in a blend", CFG_MAX_BLEND);
            return -1;
        }
        out->weight[out->n] = v;
        snprintf(out->path[out->n], CFG_PATHS, "%s", path);
        out->n++;
    }
    if (out->n == 0) {
        put_err(err, "empty blend (expected \"W1 PATH1 W2 PATH2 ...\")");
        return -1;
    }
    return 0;
}

int config_data_spec(const DataConfig *d, int val, BlendSpec *out, char err[CFG_ERR])
{
    const char *blend = val ? d->val_blend : d->blend, *path = val ? d->val_path : d->path;
    if (blend[0])
        return config_blend_parse(blend, out, err);
    memset(out, 0, sizeof *out);
    if (path[0]) {
        out->n = 1;
        out->weight[0] = 1;
        snprintf(out->path[0], CFG_PATHS, "%s", path);
    }
    return 0;
}

const char *config_data_name(const DataConfig *d) { return d->blend[0] ? d->blend : d->path; }

const char *config_arch_name(ModelArch a) { return (unsigned)a < 2 ? ARCH_NAMES[a] : "?"; }

const char *config_precision_name(Precision p) { return (unsigned)p < 2 ? PREC_NAMES[p] : "?"; }

void config_rope_scaling_text(const ModelConfig *m, char *out, size_t n)
{
    if (m->rope_scaling != ROPE_SCALING_LLAMA3)
        snprintf(out, n, "none");
    else
        snprintf(out, n,
                 "llama3 (factor %.9g, low_freq_factor %.9g, high_freq_factor %.9g, "
                 "original_max_position_embeddings %d)",
                 m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor,
                 m->rope_original_max_position_embeddings);
}

int config_rope_scaling_same(const ModelConfig *a, const ModelConfig *b)
{
    if (a->rope_scaling != b->rope_scaling)
        return 0;
    return a->rope_scaling == ROPE_SCALING_NONE ||
           (a->rope_factor == b->rope_factor &&
            a->rope_low_freq_factor == b->rope_low_freq_factor &&
            a->rope_high_freq_factor == b->rope_high_freq_factor &&
            a->rope_original_max_position_embeddings == b->rope_original_max_position_embeddings);
}

/* ------------------------------------------------------------------------ */
/* YAML loading                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
    Config *cfg;
    const char *path;
    yaml_document_t *doc;
    char *err;
    size_t set_line[N_KEYS]; /* 1-based line where a key was given, 0 = not */
} Loader;

static int load_error(Loader *L, yaml_mark_t mark, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int load_error(Loader *L, yaml_mark_t mark, const char *fmt, ...)
{
    char msg[CFG_ERR];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    put_err(L->err, "%s:%zu:%zu: %s", L->path, mark.line + 1, mark.column + 1, msg);
    return -1;
}

static const char *scalar_text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static const char *node_kind(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return "a scalar";
    }
}

/* An empty plain value ("model:" with nothing under it) is YAML null. */
static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = scalar_text(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null");
}

static int load_list(Loader *L, const KeyDesc *k, const char *full, yaml_node_t *val)
{
    int v[CFG_MAX_STAGES], n = 0;
    for (yaml_node_item_t *it = val->data.sequence.items.start; it < val->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(L->doc, *it);
        Why why;
        if (item->type != YAML_SCALAR_NODE)
            return load_error(L, item->start_mark,
                              "key '%s': list item %d is %s (expected an integer)", full, n + 1,
                              node_kind(item));
        if (n == CFG_MAX_STAGES)
            return load_error(L, item->start_mark, "key '%s': too many entries (at most %d)", full,
                              CFG_MAX_STAGES);
        if (parse_int(scalar_text(item), &v[n], &why))
            return load_error(L, item->start_mark, "key '%s': list item %d: %s", full, n + 1,
                              why.text);
        n++;
    }
    return store_list(L->cfg, k, v, n);
}

/* Append sep, a and (when not empty) " " b to buf[*used..]: 0, or -1 when
 * it does not fit. */
static int join(char *buf, size_t cap, size_t *used, const char *sep, const char *a, const char *b)
{
    int w = snprintf(buf + *used, cap - *used, "%s%s%s%s", sep, a, *b ? " " : "", b);
    if (w < 0 || (size_t)w >= cap - *used)
        return -1;
    *used += (size_t)w;
    return 0;
}

/* A list's joined text as the value of key k (its checks apply). */
static int set_joined(Loader *L, const KeyDesc *k, const char *full, yaml_node_t *val,
                      const char *joined)
{
    Why why;
    if (set_scalar(L->cfg, k, joined, &why))
        return load_error(L, val->start_mark, "key '%s': %s", full, why.text);
    return 0;
}

/* A list of names ([seed, data]) stored as the string "seed,data". */
static int load_names(Loader *L, const KeyDesc *k, const char *full, yaml_node_t *val)
{
    char joined[CFG_PATHS] = "";
    size_t used = 0;
    for (yaml_node_item_t *it = val->data.sequence.items.start; it < val->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(L->doc, *it);
        if (item->type != YAML_SCALAR_NODE)
            return load_error(L, item->start_mark, "key '%s': list item is %s (expected a name)",
                              full, node_kind(item));
        if (join(joined, sizeof joined, &used, used ? "," : "", scalar_text(item), ""))
            return load_error(L, item->start_mark, "key '%s': list is too long", full);
    }
    return set_joined(L, k, full, val, joined);
}

/* A blend as a list of {path: P, weight: W} mappings, stored in
 * Megatron-LM's string form "W1 P1 W2 P2 ..." (checked by validation). */
static int load_blend(Loader *L, const KeyDesc *k, const char *full, yaml_node_t *val)
{
    char joined[CFG_PATHS] = "";
    size_t used = 0;
    int n = 0;
    for (yaml_node_item_t *it = val->data.sequence.items.start; it < val->data.sequence.items.top;
         it++, n++) {
        yaml_node_t *item = yaml_document_get_node(L->doc, *it);
        if (item->type != YAML_MAPPING_NODE)
            return load_error(L, item->start_mark,
                              "key '%s': list item %d is %s (expected {path: ..., weight: ...})",
                              full, n + 1, node_kind(item));
        const char *path = NULL, *weight = NULL;
        for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top;
             p++) {
            yaml_node_t *pk = yaml_document_get_node(L->doc, p->key);
            yaml_node_t *pv = yaml_document_get_node(L->doc, p->value);
            const char *name = pk->type == YAML_SCALAR_NODE ? scalar_text(pk) : "";
            if (pv->type != YAML_SCALAR_NODE || (strcmp(name, "path") && strcmp(name, "weight")))
                return load_error(L, pk->start_mark,
                                  "key '%s': list item %d: expected the keys path and weight "
                                  "with scalar values",
                                  full, n + 1);
            if (!strcmp(name, "path"))
                path = scalar_text(pv);
            else
                weight = scalar_text(pv);
        }
        if (!path || !weight || !*path || strpbrk(path, " \t"))
            return load_error(L, item->start_mark,
                              "key '%s': list item %d needs a path (without spaces) and a weight",
                              full, n + 1);
        if (join(joined, sizeof joined, &used, used ? " " : "", weight, path))
            return load_error(L, item->start_mark, "key '%s': list is too long", full);
    }
    return set_joined(L, k, full, val, joined);
}

/* One `key: value` pair of a section (or the top level, section ""). */
static int load_section(Loader *L, const char *section, yaml_node_t *val);

static int load_key(Loader *L, const char *section, yaml_node_t *key, yaml_node_t *val)
{
    char full[64], sugg[128] = "", keys[512];
    const char *name = scalar_text(key);
    if (section[0])
        snprintf(full, sizeof full, "%s.%.40s", section, name);
    else
        snprintf(full, sizeof full, "%.40s", name);

    /* model.lora: {rank, ...} and model.moe: {experts, ...}, sections of their own */
    if (!strcmp(section, "model") && !strcmp(name, "lora"))
        return load_section(L, "model.lora", val);
    if (!strcmp(section, "model") && !strcmp(name, "moe"))
        return load_section(L, "model.moe", val);
    int i = find_key(section, name);
    if (i < 0 && renamed_hint(full))
        return load_error(L, key->start_mark, "key '%s': %s", full, renamed_hint(full));
    if (i < 0) {
        const char *s = suggest_key(section, name);
        list_keys(section, keys, sizeof keys);
        if (s)
            snprintf(sugg, sizeof sugg, "did you mean '%s'? ", s);
        return load_error(L, key->start_mark, "key '%s': unknown key (%sknown keys of '%s': %s)",
                          full, sugg, section, keys);
    }
    const KeyDesc *k = &KEYS[i];
    if (L->set_line[i])
        return load_error(L, key->start_mark,
                          "key '%s': duplicate key (first given on line %zu; keep one)", full,
                          L->set_line[i]);
    L->set_line[i] = key->start_mark.line + 1;
    L->cfg->origin.line[i] = (int)val->start_mark.line + 1;
    L->cfg->origin.col[i] = (int)val->start_mark.column + 1;

    if (k->kind == K_INT_LIST) {
        if (val->type == YAML_SEQUENCE_NODE)
            return load_list(L, k, full, val);
        return load_error(L, val->start_mark,
                          "key '%s': expected a list of integers such as [3, 5], got %s", full,
                          node_kind(val));
    }
    if (k->kind == K_NAMES && val->type == YAML_SEQUENCE_NODE)
        return load_names(L, k, full, val);
    if (k->kind == K_BLEND && val->type == YAML_SEQUENCE_NODE)
        return load_blend(L, k, full, val);
    if (val->type != YAML_SCALAR_NODE)
        return load_error(L, val->start_mark, "key '%s': expected a scalar value, got %s", full,
                          node_kind(val));
    /* A YAML null ("key:" with no value, "~") is an empty string; for other
     * kinds it then reads "got nothing". */
    Why why;
    if (set_scalar(L->cfg, k, is_null(val) ? "" : scalar_text(val), &why))
        return load_error(L, val->start_mark, "key '%s': %s", full, why.text);
    return 0;
}

static int load_section(Loader *L, const char *section, yaml_node_t *val)
{
    if (is_null(val))
        return 0; /* "checkpoint:" alone: an empty section */
    if (val->type != YAML_MAPPING_NODE) {
        char keys[512];
        list_keys(section, keys, sizeof keys);
        return load_error(L, val->start_mark,
                          "key '%s': expected a mapping of %s keys (%s), got %s", section, section,
                          keys, node_kind(val));
    }
    for (yaml_node_pair_t *p = val->data.mapping.pairs.start; p < val->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(L->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(L->doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return load_error(L, k->start_mark, "key '%s': a key must be a plain name, got %s",
                              section, node_kind(k));
        if (load_key(L, section, k, v))
            return -1;
    }
    return 0;
}

/* Required keys: reported at the section's mark, or the file start when the
 * whole section is missing. */
static int check_required(Loader *L, const yaml_mark_t *section_mark, const bool *section_seen)
{
    const int path = find_key("data", "path"), blend = find_key("data", "blend");
    /* With checkpoint.init_from the model comes from the source (a
     * front end fills what the file leaves out: config_model_given). */
    const int init = L->set_line[find_key("checkpoint", "init_from")] != 0 ||
                     L->set_line[find_key("model.lora", "base")] != 0;
    for (int i = 0; i < N_KEYS; i++) {
        if (!KEYS[i].required || L->set_line[i] || (i == path && L->set_line[blend]) ||
            (init && !strcmp(KEYS[i].section, "model")))
            continue;
        yaml_mark_t at = {0, 0, 0};
        for (int s = 0; SECTIONS[s]; s++)
            if (!strcmp(SECTIONS[s], KEYS[i].section) && section_seen[s])
                at = section_mark[s];
        char full[64];
        key_fullname(&KEYS[i], full);
        return load_error(L, at, "key '%s': missing required key (add '%s:'%s under '%s:')", full,
                          KEYS[i].name, i == path ? " or 'blend:'" : "", KEYS[i].section);
    }
    return 0;
}

static int load_root(Loader *L, yaml_node_t *root)
{
    enum { NSEC = sizeof(SECTIONS) / sizeof(SECTIONS[0]) - 1 };
    yaml_mark_t section_mark[NSEC] = {{0, 0, 0}};
    bool section_seen[NSEC] = {false};
    size_t section_line[NSEC] = {0};

    if (root->type != YAML_MAPPING_NODE)
        return load_error(L, root->start_mark,
                          "the top level is %s; expected a mapping of sections "
                          "(run, model, topology, training, data, checkpoint, backend)",
                          node_kind(root));

    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(L->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(L->doc, p->value);
        if (k->type != YAML_SCALAR_NODE)
            return load_error(L, k->start_mark, "a top-level key must be a section name, got %s",
                              node_kind(k));
        const char *name = scalar_text(k);
        if (find_key("", name) >= 0) {
            if (load_key(L, "", k, v))
                return -1;
            continue;
        }
        int s = 0;
        while (SECTIONS[s] && strcmp(SECTIONS[s], name))
            s++;
        if (!SECTIONS[s]) {
            char sugg[128] = "";
            const char *best = suggest_section(name);
            if (best)
                snprintf(sugg, sizeof sugg, "did you mean '%s'? ", best);
            return load_error(L, k->start_mark,
                              "key '%.60s': unknown section (%sexpected one of: run, model, "
                              "topology, training, data, checkpoint, backend)",
                              name, sugg);
        }
        if (section_seen[s])
            return load_error(L, k->start_mark,
                              "key '%s': duplicate section (first given on line %zu; merge the "
                              "two)",
                              name, section_line[s]);
        section_seen[s] = true;
        section_line[s] = k->start_mark.line + 1;
        section_mark[s] = k->start_mark;
        if (load_section(L, name, v))
            return -1;
    }
    return check_required(L, section_mark, section_seen);
}

/* Configs are small: anything larger is not one, and reading it whole
 * (a multi-GB file, /dev/zero) would only waste time and memory. */
#define CFG_MAX_BYTES ((size_t)1 << 20)
/* Mappings and sequences nested deeper than this are refused before the
 * document is built: a real config nests 3 levels, and libyaml's loader
 * recurses once per level. */
#define CFG_MAX_DEPTH 64

/* Read a whole regular file of at most CFG_MAX_BYTES; NULL with err set
 * on failure.  O_NONBLOCK: opening a FIFO must not wait for a writer. */
static unsigned char *read_file(const char *path, size_t *len, char *err)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        put_err(err, "%s: cannot read config: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        put_err(err, "%s: cannot read config: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size > CFG_MAX_BYTES) {
        const char *what = S_ISDIR(st.st_mode)                          ? "a directory"
                           : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                           : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                        : NULL;
        if (what)
            put_err(err, "%s: cannot read config: %s, not a regular file", path, what);
        else
            put_err(err,
                    "%s: cannot read config: %lld bytes, more than a config's limit of "
                    "%zu (1 MiB)",
                    path, (long long)st.st_size, CFG_MAX_BYTES);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        put_err(err, "%s: cannot read config: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    /* The size fstat gave (at most 1 MiB), and one byte more, which tells
     * a file that grew since: a buffer of the file's size, not of the
     * limit (every rank loads the config). */
    const size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size + 1);
    size_t n = buf ? fread(buf, 1, size + 1, f) : 0;
    int bad = !buf || ferror(f);
    int saved = errno;
    fclose(f);
    if (bad || n > size) {
        put_err(err, "%s: cannot read config: %s", path,
                !buf  ? "out of memory"
                : bad ? strerror(saved)
                      : "it grew while being read");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Refuse nesting deeper than CFG_MAX_DEPTH by streaming the events (the
 * scanner only reads as far as the parser asks, so 100k '[' stop at the
 * 65th).  A syntax error ends the scan quietly: the full load reports it
 * with its usual message. */
static int check_depth(const char *path, const unsigned char *buf, size_t len, char *err)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return 0;
    yaml_parser_set_input_string(&p, buf, len);
    int depth = 0, rc = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev))
            break;
        const yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > CFG_MAX_DEPTH) {
                put_err(err,
                        "%s:%zu:%zu: nested more than %d levels deep; a config nests "
                        "sections, keys and lists (3 levels)",
                        path, ev.start_mark.line + 1, ev.start_mark.column + 1, CFG_MAX_DEPTH);
                rc = -1;
            }
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (rc || type == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&p);
    return rc;
}

/* Byte at (line, column) of the buffer, columns counted in characters as
 * libyaml counts them; -1 when past the end. */
static int char_at(const unsigned char *buf, size_t len, size_t line, size_t col)
{
    size_t i = 0;
    for (size_t l = 0; l < line && i < len; i++)
        if (buf[i] == '\n')
            l++;
    for (size_t c = 0; c < col && i < len; c++) {
        i++;
        while (i < len && (buf[i] & 0xC0) == 0x80)
            i++;
    }
    return i < len ? buf[i] : -1;
}

static int syntax_error(const char *path, const yaml_parser_t *p, const unsigned char *buf,
                        size_t len, char *err)
{
    yaml_mark_t m = p->problem_mark;
    char ctx[160] = "", hint[96] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu column %zu)", p->context,
                 p->context_mark.line + 1, p->context_mark.column + 1);
    if (char_at(buf, len, m.line, m.column) == '\t' || (p->problem && strstr(p->problem, "tab")))
        snprintf(hint, sizeof hint, "; YAML indentation must use spaces, not tabs");
    put_err(err, "%s:%zu:%zu: not valid YAML: %s%s%s", path, m.line + 1, m.column + 1,
            p->problem ? p->problem : "parse error", ctx, hint);
    return -1;
}

int config_load(Config *cfg, const char *path, char err[CFG_ERR])
{
    config_defaults(cfg);
    size_t len = 0;
    unsigned char *buf = read_file(path, &len, err);
    if (!buf)
        return -1;
    if (check_depth(path, buf, len, err) != 0) {
        free(buf);
        return -1;
    }

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        put_err(err, "%s: cannot start the YAML parser (out of memory)", path);
        free(buf);
        return -1;
    }
    yaml_parser_set_input_string(&parser, buf, len);

    int rc = -1;
    if (!yaml_parser_load(&parser, &doc)) {
        syntax_error(path, &parser, buf, len, err);
        goto out_parser;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root || is_null(root)) { /* nothing, comments only, or a bare "---" */
        put_err(err,
                "%s:1:1: the file is empty (expected a mapping with sections "
                "model, training, data, ...)",
                path);
        goto out_doc;
    }

    /* A second document would be silently ignored: refuse it, and read the
     * whole stream first so syntax errors come before semantic ones. */
    yaml_document_t next;
    if (!yaml_parser_load(&parser, &next)) {
        syntax_error(path, &parser, buf, len, err);
        goto out_doc;
    }
    yaml_node_t *extra = yaml_document_get_root_node(&next);
    if (extra) {
        put_err(err,
                "%s:%zu:%zu: a second YAML document (after '---'); a config is "
                "one document",
                path, extra->start_mark.line + 1, extra->start_mark.column + 1);
        yaml_document_delete(&next);
        goto out_doc;
    }
    yaml_document_delete(&next);

    Loader L = {.cfg = cfg, .path = path, .doc = &doc, .err = err};
    if (load_root(&L, root))
        goto out_doc;
    snprintf(cfg->source, sizeof cfg->source, "%s", path);
    rc = 0;
out_doc:
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&parser);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* --set key.path=value                                                      */
/* ------------------------------------------------------------------------ */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/* "[3, 5]" (brackets optional, "[]" empty) into v. */
static int parse_list_text(char *s, int *v, int *n, Why *why)
{
    s = trim(s);
    size_t len = strlen(s);
    if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
        s[len - 1] = '\0';
        s = trim(s + 1);
    }
    *n = 0;
    if (!*s)
        return 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == CFG_MAX_STAGES)
            return fail(why, "too many entries (at most %d)", CFG_MAX_STAGES);
        if (parse_int(trim(tok), &v[*n], why))
            return fail(why, "list item %d: %s", *n + 1, why->text);
        (*n)++;
    }
    return 0;
}

int config_set(Config *cfg, const char *assignment, char err[CFG_ERR])
{
    char buf[CFG_ERR];
    if (strlen(assignment) >= sizeof buf) {
        put_err(err, "--set %.60s...: too long", assignment);
        return -1;
    }
    strcpy(buf, assignment);
    char *eq = strchr(buf, '=');
    if (!eq) {
        put_err(err,
                "--set %s: missing '=' (expected key.path=value, e.g. "
                "training.lr=3e-4)",
                assignment);
        return -1;
    }
    *eq = '\0';
    char *key = trim(buf), *value = trim(eq + 1);

    char section[64] = "";
    const char *name = key;
    char *dot = strrchr(key, '.'); /* model.lora.rank: section model.lora */
    if (dot && (size_t)(dot - key) < sizeof section) {
        memcpy(section, key, (size_t)(dot - key));
        section[dot - key] = '\0';
        name = dot + 1;
    }
    int i = dot ? find_key(section, name) : find_key("", key);
    if (i < 0 && renamed_hint(key)) {
        put_err(err, "--set %s: key '%.60s': %s", assignment, key, renamed_hint(key));
        return -1;
    }
    if (i < 0) {
        char s[64], sugg[128] = "";
        if (suggest_fullname(key, s))
            snprintf(sugg, sizeof sugg, "; did you mean '%s'?", s);
        else if (!dot && is_section(key))
            snprintf(sugg, sizeof sugg,
                     "; '%s' is a section, set one of its keys "
                     "(%s.KEY=VALUE)",
                     key, key);
        else if (!dot)
            snprintf(sugg, sizeof sugg, "; keys are written section.key, e.g. training.lr");
        else if (!is_section(section))
            snprintf(sugg, sizeof sugg,
                     "; sections are run, model, topology, training, data, "
                     "checkpoint");
        put_err(err, "--set %s: key '%.60s': unknown key%s", assignment, key, sugg);
        return -1;
    }

    const KeyDesc *k = &KEYS[i];
    Why why;
    int rc;
    if (k->kind == K_INT_LIST) {
        int v[CFG_MAX_STAGES], n = 0;
        rc = parse_list_text(value, v, &n, &why);
        if (!rc)
            store_list(cfg, k, v, n);
    } else {
        size_t len = strlen(value); /* data.path=[a,b]: the list's brackets */
        if (k->kind == K_NAMES && len >= 2 && value[0] == '[' && value[len - 1] == ']') {
            value[len - 1] = '\0';
            value = trim(value + 1);
        }
        rc = set_scalar(cfg, k, value, &why);
    }
    if (rc) {
        char full[64];
        put_err(err, "--set %s: key '%s': %s", assignment, key_fullname(k, full), why.text);
        return -1;
    }
    snprintf(cfg->origin.set[i], CFG_SET_ARG, "%s", assignment);
    return 0;
}

void config_where(const Config *cfg, const char *key, char *buf, size_t n)
{
    char section[64] = "";
    const char *name = key, *dot = strrchr(key, '.');
    if (dot && (size_t)(dot - key) < sizeof section) {
        memcpy(section, key, (size_t)(dot - key));
        name = dot + 1;
    }
    const int i = find_key(section, name);
    const char *file = cfg->source[0] ? cfg->source : "config";
    if (i >= 0 && cfg->origin.set[i][0])
        snprintf(buf, n, "--set %s", cfg->origin.set[i]);
    else if (i >= 0 && cfg->origin.line[i])
        snprintf(buf, n, "%s:%d:%d", file, cfg->origin.line[i], cfg->origin.col[i]);
    else
        snprintf(buf, n, "%s", file);
}

int config_model_given(const Config *cfg, const char *name)
{
    /* "moe.experts": the key experts of the section model.moe */
    char section[64] = "model";
    const char *dot = strrchr(name, '.');
    if (dot && (size_t)(dot - name) < sizeof section - 6) {
        snprintf(section, sizeof section, "model.%.*s", (int)(dot - name), name);
        name = dot + 1;
    }
    const int i = find_key(section, name);
    return i >= 0 && (cfg->origin.line[i] || cfg->origin.set[i][0]);
}

/* ------------------------------------------------------------------------ */
/* YAML output                                                               */
/* ------------------------------------------------------------------------ */

/* Strings are always double-quoted, so "true", "123" or ": " stay strings. */
static void write_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void write_value(FILE *f, const Config *cfg, const KeyDesc *k)
{
    const char *field = (const char *)cfg + k->offset;
    int iv = 0;
    if (k->kind != K_STR && k->kind != K_U64 && k->kind != K_FLOAT && k->kind != K_CAPACITY &&
        k->kind != K_INT_LIST && k->kind != K_NAMES && k->kind != K_BLEND)
        iv = *(const int *)field;
    switch (k->kind) {
    case K_INT:
        fprintf(f, "%d", iv);
        break;
    case K_INT_AUTO:
        if (iv == 0)
            fputs("auto", f);
        else
            fprintf(f, "%d", iv);
        break;
    case K_EVERY:
        if (iv == CKPT_EVERY_AUTO)
            fputs("auto", f);
        else
            fprintf(f, "%d", iv);
        break;
    case K_U64:
        fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case K_CAPACITY:
        if (*(const float *)field == 0.0f) {
            fputs("dropless", f);
            break;
        }
        /* fall through */
    case K_FLOAT:
        /* 9 significant digits reproduce every float exactly. */
        fprintf(f, "%.9g", (double)*(const float *)field);
        break;
    case K_BOOL:
        fputs(iv ? "true" : "false", f);
        break;
    case K_BOOL_AUTO:
        fputs(iv < 0 ? "auto" : iv ? "true" : "false", f);
        break;
    case K_STR:
    case K_NAMES:
    case K_BLEND:
        write_quoted(f, field);
        break;
    case K_ENUM: {
        int n = 0;
        while (k->names[n])
            n++;
        fputs(iv >= 0 && iv < n ? k->names[iv] : "?", f);
        break;
    }
    case K_RESUME:
        if (iv == RESUME_PATH)
            write_quoted(f, (const char *)cfg + k->aux);
        else
            fputs(iv == RESUME_NEVER ? "never" : "auto", f);
        break;
    case K_INT_LIST: {
        const int *v = (const int *)field;
        int n = *(const int *)((const char *)cfg + k->aux);
        fputc('[', f);
        for (int i = 0; i < n; i++)
            fprintf(f, "%s%d", i ? ", " : "", v[i]);
        fputc(']', f);
        break;
    }
    }
}

int config_write_yaml(const Config *cfg, const char *path, char err[CFG_ERR])
{
    FILE *f = fopen(path, "w");
    if (!f) {
        put_err(err, "%s: cannot write config: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "# trident config, every key resolved");
    if (cfg->source[0])
        fprintf(f, " (from %s)", cfg->source);
    fputc('\n', f);
    const char *section = NULL;
    for (int i = 0; i < N_KEYS; i++) {
        const KeyDesc *k = &KEYS[i];
        if (!section || strcmp(section, k->section)) {
            section = k->section;
            const char *sub = strchr(section, '.'); /* model.lora: nested in model */
            if (sub)
                fprintf(f, "  %s:\n", sub + 1);
            else if (section[0])
                fprintf(f, "%s:\n", section);
        }
        fprintf(f, "%s%s: ", !section[0] ? "" : strchr(section, '.') ? "    " : "  ", k->name);
        write_value(f, cfg, k);
        fputc('\n', f);
    }
    /* Flushed and fsynced: a full disk shows here, not as a short file later. */
    errno = 0;
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int saved = errno ? errno : EIO;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        saved = errno;
    }
    if (bad) {
        put_err(err, "%s: cannot write config: %s", path, strerror(saved));
        return -1;
    }
    return 0;
}

int config_lora_mask(const char *targets, ModelArch arch, char *bad, size_t n)
{
    static const struct {
        const char *name;
        int bit;
    } T[] = {{"qkv", LORA_QKV},
             {"proj", LORA_PROJ},
             {"fc", LORA_FC},
             {"up", LORA_UP},
             {"fcproj", LORA_FCPROJ}};
    int mask = 0;
    const char *s = targets;
    while (*s) {
        size_t len = strcspn(s, ",");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(len < 63 ? len : 63), s);
        char *t = trim(name);
        int bit = 0;
        for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
            if (!strcmp(t, T[i].name))
                bit = T[i].bit;
        if (bit == LORA_UP && arch != ARCH_LLAMA)
            bit = 0; /* gpt2's MLP has no up projection */
        if (!bit) {
            snprintf(bad, n, "%s", t);
            return -1;
        }
        mask |= bit;
        s += len + (s[len] == ',');
    }
    return mask;
}

/* config.h — the experiment config: one typed, validated struct.
 *
 * A YAML file (libyaml) is parsed into a Config, `--set key.path=value`
 * overrides are applied on top, then config_validate() checks ranges and
 * consistency.  Every error names file:line:column (or "--set") and the key;
 * the caller prints it and exits with TRD_EXIT_INPUT (2).  Nothing is run or
 * written before a config has passed validation. */
#ifndef TRD_CONFIG_H
#define TRD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define CFG_STR         256  /* max length of a string value, paths included */
#define CFG_PATHS       2048 /* data.path, data.blend...: lists of paths and patterns */
#define CFG_ERR         1024 /* size of an error message buffer */
#define CFG_MAX_STAGES  64
#define CFG_MAX_VIRTUAL 16  /* topology.virtual_stages: model chunks per pipeline rank */
#define CFG_MAX_KEYS    112 /* capacity of the key table (config.c asserts it) */
#define CFG_SET_ARG     96  /* an --set argument, as kept for error messages */
/* model.layers at most: the parameter table, the stage split and the
 * schedules hold a few entries per layer, built before the memory check;
 * the deepest published models have about 128 layers. */
#define CFG_MAX_LAYERS 4096

typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA = 1 } ModelArch;
typedef enum { SCHED_1F1B = 0, SCHED_INTERLEAVED = 1, SCHED_GPIPE = 2 } ScheduleKind;
typedef enum { DECAY_COSINE = 0, DECAY_LINEAR = 1, DECAY_CONSTANT = 2 } DecayKind;
typedef enum { PREC_FP32 = 0, PREC_BF16 = 1 } Precision;
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_SELECTIVE = 1, RECOMPUTE_FULL = 2 } Recompute;
typedef enum { DATA_MEGATRON = 0, DATA_LLMC = 1 } DataFormat;
typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } BackendKind;
typedef enum { RESUME_AUTO = 0, RESUME_NEVER = 1, RESUME_PATH = 2 } ResumeKind;
typedef enum { COMM_AUTO = 0, COMM_MPI = 1, COMM_NCCL = 2 } CommKind;
/* topology.offload: where the optimizer's state lives (backend: cuda).
 * optimizer: the fp32 master weights and Adam moments of the rank's shard in
 * page-locked host memory, AdamW on the host's cores (docs/finetune.md).
 * optimizer+params (ZeRO-3 only): the rank's parameter shard too; the device
 * holds only the layers gathered for compute (zero.h). */
typedef enum { OFFLOAD_NONE = 0, OFFLOAD_OPTIMIZER = 1, OFFLOAD_PARAMS = 2 } OffloadKind;
typedef enum { NONFINITE_STOP = 0, NONFINITE_SKIP = 1 } NonfiniteKind;
typedef enum { ROPE_SCALING_NONE = 0, ROPE_SCALING_LLAMA3 = 1 } RopeScaling;
/* checkpoint.async: auto is on where the MPI library runs threads and the
 * host snapshot fits beside the rest (docs/checkpoint.md). */
typedef enum { ASYNC_AUTO = 0, ASYNC_ON = 1, ASYNC_OFF = 2 } AsyncKind;

typedef struct {
    char name[CFG_STR]; /* run name (log and metrics naming) */
    char dir[CFG_STR];  /* output directory: metrics.jsonl, logs */
    uint64_t seed;
    int log_every;   /* readable log line every N steps (>= 1) */
    int tensorboard; /* write TensorBoard event files under dir/tb (rank 0) */
} RunConfig;

/* model.lora: low-rank adapters on chosen linear layers, the rest of the
 * model frozen (docs/finetune.md).  rank 0: no adapters, a plain model. */
enum { LORA_QKV = 1, LORA_PROJ = 2, LORA_FC = 4, LORA_UP = 8, LORA_FCPROJ = 16 };
typedef struct {
    int rank;              /* r: A is [r, in], B is [out, r] */
    float alpha;           /* the update is (alpha / r) B A */
    float dropout;         /* on the adapter input, [0, 1) (model.c: lora_dropout) */
    char targets[CFG_STR]; /* names, comma-separated: qkv, proj, fc, up, fcproj */
    char base[CFG_STR];    /* the frozen base: a Hugging Face directory or a trident
                            * checkpoint of the plain model ("": fresh from run.seed) */
    enum { LORA_BASE_FP32 = 0, LORA_BASE_BF16 = 1 } base_dtype; /* the base's storage */
} LoraConfig;

typedef struct {
    ModelArch arch;
    int layers, hidden, heads;
    int kv_heads;   /* 0 in YAML means "= heads"; resolved by validation */
    int ffn_hidden; /* 0 means default: 4*hidden (gpt2), 8/3*hidden rounded up to 64 (llama) */
    int vocab;      /* tokenizer vocabulary size (unpadded) */
    int vocab_pad_multiple; /* padded vocab is a multiple of tp * this (default 128) */
    int seq_len;
    int tie_embeddings; /* default 1 for gpt2, 0 for llama */
    float norm_eps;     /* default 1e-5 */
    float rope_theta;   /* default 10000 (llama only) */
    /* RoPE frequency scaling (llama only): none, or Llama 3's (Hugging Face's
     * rope_type "llama3") with its four parameters, all required then. */
    RopeScaling rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    float init_std; /* default 0.02 */
    /* Mixture of experts (model.moe, docs/moe.md); moe_experts 0: a dense model. */
    int moe_experts;           /* E experts per MoE layer (0: none) */
    int moe_top_k;             /* experts per token (default 2) */
    int moe_every;             /* layer l is MoE when (l + 1) % every == 0 (default 1) */
    int moe_ffn_hidden;        /* an expert's hidden size (0: model.ffn_hidden) */
    int moe_shared_experts;    /* always-on experts, fused into one MLP of that many widths */
    float moe_aux_loss_coef;   /* Switch/GShard load-balancing loss (default 0.01) */
    float moe_z_loss_coef;     /* router z-loss (default 0.001) */
    float moe_capacity_factor; /* 0: dropless (written `dropless`); > 0: capacity */
    LoraConfig lora;
} ModelConfig;

/* The most experts a MoE layer may have (the route's host tables are sized by it). */
#define MOE_MAX_EXPERTS 256

/* Is layer l (0-based) a mixture-of-experts layer?  Every moe_every-th
 * layer, the last of each run of moe_every: with every 2, layers 1, 3, ... */
static inline int config_moe_layer(const ModelConfig *m, int l)
{
    return m->moe_experts > 0 && (l + 1) % (m->moe_every > 0 ? m->moe_every : 1) == 0;
}

/* An expert's hidden size: model.moe.ffn_hidden, or model.ffn_hidden when 0. */
static inline int config_moe_ffn(const ModelConfig *m)
{
    return m->moe_ffn_hidden > 0 ? m->moe_ffn_hidden : m->ffn_hidden;
}

typedef struct {
    int tp, pp;
    int ep;             /* expert parallel: ranks of dp sharing a layer's experts (default 1) */
    int cp;             /* context parallel: ranks sharing each sequence (default 1) */
    int dp;             /* 0 means "auto": world / (tp*cp*pp) */
    int zero;           /* 0..3 */
    int ranks_per_node; /* 0 means "auto" */
    int sequence_parallel;
    ScheduleKind schedule;
    int virtual_stages; /* >= 1; > 1 only with the interleaved schedule */
    int n_stage_layers; /* 0: split layers evenly over pp */
    int stage_layers[CFG_MAX_STAGES];
    char order[16]; /* rank order, default "tp-dp-pp" */
    int allow_tp_across_nodes;
    int bucket_mb; /* DP gradient bucket size in MiB (default 25) */
    CommKind comm; /* what carries device buffers: auto (NCCL when every rank of
                             * a node has a GPU of its own), mpi (host staging), nccl */
    /* none (default) or optimizer: the optimizer state in host memory */
    OffloadKind offload;
} TopologyConfig;

typedef struct {
    int steps;
    int global_batch; /* sequences per optimizer step */
    int micro_batch;  /* sequences per data-parallel rank per micro-step; 0 in YAML
                             * means "auto", resolved by validation once dp is known */
    float lr, min_lr;
    int warmup_steps;
    DecayKind decay;
    float weight_decay, beta1, beta2, eps;
    float grad_clip; /* 0 disables clipping */
    Precision precision;
    Recompute recompute;
    int trace;               /* write a Chrome trace of the run */
    NonfiniteKind nonfinite; /* a NaN/Inf loss or gradient norm: stop, or skip the update */
    int max_skipped;         /* skip: stop after this many skipped steps in a row (>= 1) */
    int hang_timeout; /* seconds without progress before the watchdog ends the job (0: off) */
    float straggler_threshold; /* report the slowest rank above this x the median (default 1.2) */
    int sample_every;          /* print a sampled continuation every N steps (0: off) */
} TrainingConfig;

typedef struct {
    /* Datasets: a prefix (megatron: PREFIX.bin/.idx) or file (llmc), a quoted
     * glob pattern of them, or a comma-separated list: the shards of one
     * dataset, in that order (docs/data.md). */
    char path[CFG_PATHS];
    DataFormat format;
    char val_path[CFG_PATHS]; /* empty: no validation */
    /* A weighted blend instead of path: "W1 PATH1 W2 PATH2 ..." (Megatron-LM's
     * form; YAML may give a list of {path, weight}).  Empty: none. */
    char blend[CFG_PATHS], val_blend[CFG_PATHS];
    int val_every;     /* steps between validations (0: only at the end) */
    int val_sequences; /* sequences per validation: the first N of the validation
                             * stream, whatever the layout and micro_batch */
    /* Packed documents: a sequence holds documents ended by the token eot;
     * with document_mask each attends only within its own document, with
     * positions restarting at each (Megatron's --reset-position-ids and
     * --reset-attention-mask). */
    int document_mask;
    int eod_mask_loss; /* targets that are eot count no loss (Megatron's --eod-mask-loss) */
    int eot;           /* -1: not set */
} DataConfig;

/* checkpoint.every auto: a save once CKPT_AUTO_INTERVAL_S seconds of
 * training have passed since the last one, or 50 times the last save's
 * blocking time if that is longer (so saving costs at most 2 %). */
#define CKPT_EVERY_AUTO      (-1)
#define CKPT_AUTO_INTERVAL_S 1800

typedef struct {
    char dir[CFG_STR]; /* empty: no checkpoints; "auto" (the default) means
                        * <run.dir>/ckpt, resolved by validation */
    int every;         /* steps between saves; 0: only at the end; CKPT_EVERY_AUTO
                        * (the default): by time, src/train/train.c */
    int keep;          /* checkpoints kept (>= 1) */
    AsyncKind async;   /* write in the background from a host snapshot */
    ResumeKind resume;
    char resume_path[CFG_STR];
    char allow_changes[CFG_STR]; /* "seed,data": what a resume may change (comma list) */
    char init_from[CFG_STR];     /* empty: none; a Hugging Face directory or a trident
                                  * checkpoint whose weights start a fresh run */
} CheckpointConfig;

/* Where each key's value came from, for messages about values: the YAML
 * value's 1-based line and column, or the --set argument that set it last.
 * Indexed like the key table; provenance, not part of the experiment. */
typedef struct {
    int line[CFG_MAX_KEYS], col[CFG_MAX_KEYS]; /* 0: not from the file */
    char set[CFG_MAX_KEYS][CFG_SET_ARG];       /* "": not from --set */
} ConfigOrigin;

typedef struct {
    char source[CFG_STR]; /* file the config came from */
    ConfigOrigin origin;
    RunConfig run;
    ModelConfig model;
    TopologyConfig topology;
    TrainingConfig training;
    DataConfig data;
    CheckpointConfig checkpoint;
    BackendKind backend;
} Config;

/* Does expert parallelism divide the experts' memory (docs/moe.md): a MoE
 * model, topology.ep > 1, no offload, no LoRA (any ZeRO stage)?  Then a
 * rank holds only its ep rank's E / ep experts (zero.h). */
static inline int config_ep_divides(const Config *c)
{
    return c->model.moe_experts > 0 && c->topology.ep > 1 && c->topology.offload == OFFLOAD_NONE &&
           c->model.lora.rank == 0;
}

/* A blend as datasets and weights: data.blend parsed, or data.path as one
 * dataset of weight 1. */
#define CFG_MAX_BLEND 16
typedef struct {
    int n;
    double weight[CFG_MAX_BLEND];
    char path[CFG_MAX_BLEND][CFG_PATHS];
} BlendSpec;

/* The training (val 0) or validation (val 1) data of cfg as a BlendSpec:
 * data.blend if set, else data.path.  n = 0 when there is none (no
 * validation data).  -1 with err on a malformed blend string. */
int config_data_spec(const DataConfig *d, int val, BlendSpec *out, char err[CFG_ERR]);
/* Parse "W1 PATH1 W2 PATH2 ...": 0, or -1 with err saying what is wrong. */
int config_blend_parse(const char *s, BlendSpec *out, char err[CFG_ERR]);
/* What identifies the training data (data.blend if set, else data.path):
 * recorded in checkpoints, compared on resume. */
const char *config_data_name(const DataConfig *d);

/* Fill every field with its default (documented in docs/config.md). */
void config_defaults(Config *cfg);

/* Parse a YAML file into cfg (on top of defaults).  Returns 0, or -1 with a
 * message "FILE:LINE:COL: key 'a.b': what is wrong" in err. */
int config_load(Config *cfg, const char *path, char err[CFG_ERR]);

/* Apply one "key.path=value" override with the same typing rules as YAML.
 * Errors read "--set a.b=v: what is wrong". */
int config_set(Config *cfg, const char *assignment, char err[CFG_ERR]);

/* Resolve derived defaults (kv_heads, ffn_hidden, tie_embeddings, dp given
 * world) and check ranges and consistency.  world <= 0 skips world checks. */
int config_validate(Config *cfg, int world, char err[CFG_ERR]);

/* The bounds config_validate puts on a model's own sizes, for a model read
 * from elsewhere (a Hugging Face config.json): layers, hidden, vocab and
 * seq_len >= 1; ffn_hidden and the padded vocabulary in 32 bits; fewer
 * than 2^48 parameters; at most CFG_MAX_LAYERS layers.  0, or -1 with err
 * (the trident key and the limit, no place: the caller names the file). */
int config_model_sizes(const ModelConfig *m, char err[CFG_ERR]);

/* The place a key's value came from, for a message about it: "FILE:L:C"
 * (the value in the YAML file), "--set a.b=v", or "FILE" (a default or a
 * derived value).  key is the full name, e.g. "training.lr". */
void config_where(const Config *cfg, const char *key, char *buf, size_t n);

/* Whether model.<name> was written in the file or by --set (not a default):
 * with checkpoint.init_from, the keys left out come from the source, and
 * the file may leave the whole model section out. */
int config_model_given(const Config *cfg, const char *name);

/* Write the config back as YAML (saved with runs and checkpoints). */
int config_write_yaml(const Config *cfg, const char *path, char err[CFG_ERR]);

/* Names for enums, for logs and YAML output. */
const char *config_arch_name(ModelArch a);
const char *config_precision_name(Precision p);

/* model.rope_scaling for messages: "none", or "llama3 (factor 8,
 * low_freq_factor 1, high_freq_factor 4,
 * original_max_position_embeddings 8192)". */
void config_rope_scaling_text(const ModelConfig *m, char *out, size_t n);
/* 1 when a and b scale RoPE the same way (the parameters of "none" are
 * not compared). */
int config_rope_scaling_same(const ModelConfig *a, const ModelConfig *b);

/* model.lora.targets as LORA_* bits: 0 when empty, -1 with the unknown
 * name in bad[n] when one is not a layer of `arch` (up: llama only). */
int config_lora_mask(const char *targets, ModelArch arch, char *bad, size_t n);

#endif

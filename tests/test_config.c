/* test_config.c — the config module: YAML loading, error messages with
 * file:line:col, --set overrides, validation rules and the YAML round trip.
 *
 * Expected positions were read off the fixtures in tests/yaml/ by hand
 * (1-based line:column of the offending key or value), not taken from the
 * program's output. */
#include "config/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static char fixture_dir[512];

static const char *fixture(const char *name, char buf[768])
{
    snprintf(buf, 768, "%s/%s", fixture_dir, name);
    return buf;
}

/* Every needle must occur in the message. */
static int contains_all(const char *msg, const char *const *needles)
{
    for (; *needles; needles++)
        if (!strstr(msg, *needles))
            return 0;
    return 1;
}

/* Load a malformed fixture: it must fail with a message that starts with
 * "PATH:LINE:COL:" and holds every needle. */
static void expect_load_error(const char *name, int line, int col, const char *const *needles)
{
    char path[768], where[900], err[CFG_ERR] = "";
    Config cfg;
    int rc = config_load(&cfg, fixture(name, path), err);
    CHECK(rc == -1, "%s: config_load returned %d (expected -1)", name, rc);
    snprintf(where, sizeof where, "%s:%d:%d: ", path, line, col);
    CHECK(strncmp(err, where, strlen(where)) == 0, "%s: message does not start with '%s': %s", name,
          where, err);
    CHECK(contains_all(err, needles), "%s: message lacks an expected word: %s", name, err);
    CHECK(!strchr(err, '\n'), "%s: message must be one line: %s", name, err);
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_malformed(void)
{
    expect_load_error("bad_unknown_key.yaml", 3, 3,
                      WORDS("key 'model.hiden'", "unknown key", "did you mean 'hidden'?"));
    expect_load_error("bad_unknown_section.yaml", 7, 1,
                      WORDS("'trainng'", "unknown section", "did you mean 'training'?"));
    expect_load_error("bad_wrong_type.yaml", 4, 10,
                      WORDS("key 'model.heads'", "expected an integer", "'abc'"));
    expect_load_error("bad_enum.yaml", 2, 11, WORDS("key 'model.arch'", "'gpt3'", "gpt2|llama"));
    expect_load_error("bad_duplicate.yaml", 5, 3,
                      WORDS("key 'model.hidden'", "duplicate key", "line 3"));
    expect_load_error("bad_missing_required.yaml", 3, 1,
                      WORDS("key 'model.heads'", "missing required key"));
    expect_load_error("bad_missing_section.yaml", 1, 1,
                      WORDS("key 'data.path'", "missing required key"));
    expect_load_error("bad_tab.yaml", 3, 1, WORDS("not valid YAML", "tab"));
    expect_load_error("bad_indent.yaml", 3, 11,
                      WORDS("not valid YAML", "mapping values are not allowed"));
    expect_load_error("bad_top_list.yaml", 1, 1, WORDS("top level is a list", "mapping"));
    expect_load_error("bad_empty.yaml", 1, 1, WORDS("empty"));
    expect_load_error("bad_list_for_scalar.yaml", 2, 11,
                      WORDS("key 'model.layers'", "expected a scalar", "got a list"));
    expect_load_error("bad_int_range.yaml", 3, 11,
                      WORDS("key 'model.hidden'", "99999999999", "out of range"));
    expect_load_error("bad_mapping_for_scalar.yaml", 3, 5,
                      WORDS("key 'training.lr'", "expected a scalar", "got a mapping"));
    expect_load_error("bad_section_scalar.yaml", 1, 8,
                      WORDS("key 'model'", "expected a mapping", "got a scalar"));
    expect_load_error("bad_bool.yaml", 2, 22,
                      WORDS("key 'topology.sequence_parallel'", "true or false", "'yes'"));
    expect_load_error("bad_stage_item.yaml", 4, 7,
                      WORDS("key 'topology.stage_layers'", "list item 2", "'five'"));
    expect_load_error("bad_scalar_for_list.yaml", 2, 17,
                      WORDS("key 'topology.stage_layers'", "expected a list"));
    expect_load_error("bad_flow.yaml", 4, 1, WORDS("not valid YAML", "flow sequence"));
    expect_load_error("bad_two_docs.yaml", 4, 1, WORDS("second YAML document"));

    /* A file that does not exist: the OS reason, no position. */
    char path[768], err[CFG_ERR] = "";
    Config cfg;
    CHECK(config_load(&cfg, fixture("no_such_file.yaml", path), err) == -1, "missing file");
    CHECK(strstr(err, "no_such_file.yaml") && strstr(err, "No such file or directory"),
          "missing file message: %s", err);
}

static void test_good_full(void)
{
    char path[768], err[CFG_ERR] = "";
    Config c;
    int rc = config_load(&c, fixture("good_full.yaml", path), err);
    CHECK(rc == 0, "good_full.yaml: %s", err);
    if (rc)
        return;
    CHECK(!strcmp(c.source, path), "source %s", c.source);
    CHECK(!strcmp(c.run.name, "llama-tiny"), "run.name %s", c.run.name);
    CHECK(!strcmp(c.run.dir, "runs/llama-tiny"), "run.dir %s", c.run.dir);
    CHECK(c.run.seed == 42, "seed");
    CHECK(c.run.log_every == 5, "log_every");
    CHECK(c.model.arch == ARCH_LLAMA, "arch");
    CHECK(c.model.layers == 8 && c.model.hidden == 256 && c.model.heads == 8, "shape");
    CHECK(c.model.kv_heads == 2, "kv_heads");
    CHECK(c.model.ffn_hidden == 0, "ffn_hidden stays 0 until validation");
    CHECK(c.model.vocab == 50257 && c.model.vocab_pad_multiple == 64, "vocab");
    CHECK(c.model.seq_len == 128, "seq_len");
    CHECK(c.model.tie_embeddings == 1, "tie_embeddings");
    CHECK_CLOSE(c.model.norm_eps, 1e-6, 1e-6, 0, "norm_eps");
    CHECK_CLOSE(c.model.rope_theta, 500000.0, 1e-6, 0, "rope_theta");
    CHECK_CLOSE(c.model.init_std, 0.01, 1e-6, 0, "init_std");
    CHECK(c.topology.tp == 2 && c.topology.pp == 2, "tp pp");
    CHECK(c.topology.dp == 0, "dp auto -> 0");
    CHECK(c.topology.zero == 1 && c.topology.ranks_per_node == 4, "zero rpn");
    CHECK(c.topology.sequence_parallel == 1, "sp");
    CHECK(c.topology.schedule == SCHED_GPIPE && c.topology.virtual_stages == 1, "schedule");
    CHECK(c.topology.n_stage_layers == 2 && c.topology.stage_layers[0] == 3 &&
              c.topology.stage_layers[1] == 5,
          "stage_layers");
    CHECK(!strcmp(c.topology.order, "tp-dp-pp"), "order");
    CHECK(c.topology.allow_tp_across_nodes == 0 && c.topology.bucket_mb == 50, "bucket");
    CHECK(c.training.steps == 100 && c.training.global_batch == 32 && c.training.micro_batch == 2,
          "batch");
    CHECK_CLOSE(c.training.lr, 6e-4, 1e-6, 0, "lr");
    CHECK_CLOSE(c.training.min_lr, 6e-5, 1e-6, 0, "min_lr");
    CHECK(c.training.warmup_steps == 10 && c.training.decay == DECAY_LINEAR, "warmup decay");
    CHECK_CLOSE(c.training.weight_decay, 0.05, 1e-6, 0, "wd");
    CHECK_CLOSE(c.training.beta1, 0.8, 1e-6, 0, "beta1");
    CHECK_CLOSE(c.training.beta2, 0.99, 1e-6, 0, "beta2");
    CHECK_CLOSE(c.training.eps, 1e-6, 1e-6, 0, "eps");
    CHECK_CLOSE(c.training.grad_clip, 0.5, 1e-6, 0, "clip");
    CHECK(c.training.precision == PREC_BF16, "precision");
    CHECK(c.training.recompute == RECOMPUTE_SELECTIVE && c.training.trace == 1, "recompute");
    CHECK(!strcmp(c.data.path, "data/tinyshakespeare/train") && c.data.format == DATA_LLMC, "data");
    CHECK(!strcmp(c.data.val_path, "data/tinyshakespeare/val"), "val_path");
    CHECK(c.data.val_every == 20 && c.data.val_sequences == 64, "val");
    CHECK(!strcmp(c.checkpoint.dir, "ckpt/llama-tiny") && c.checkpoint.every == 50 &&
              c.checkpoint.keep == 3,
          "checkpoint");
    CHECK(c.checkpoint.resume == RESUME_PATH &&
              !strcmp(c.checkpoint.resume_path, "ckpt/other/step_000050"),
          "resume path");
    CHECK(c.backend == BACKEND_CUDA, "backend");

    /* Validation with 8 ranks: dp = 8 / (2*2) = 2; ffn = 8/3*256 = 682.7 -> 704. */
    rc = config_validate(&c, 8, err);
    CHECK(rc == 0, "validate good_full: %s", err);
    CHECK(c.topology.dp == 2, "dp resolved to %d", c.topology.dp);
    CHECK(c.model.ffn_hidden == 704, "llama ffn_hidden %d", c.model.ffn_hidden);
    CHECK(c.model.kv_heads == 2, "kv_heads kept");
    CHECK(c.model.tie_embeddings == 1, "explicit tie kept");
    CHECK(!strcmp(config_arch_name(c.model.arch), "llama"), "arch name");
    CHECK(!strcmp(config_precision_name(c.training.precision), "bf16"), "precision name");
    CHECK(!strcmp(config_arch_name(ARCH_GPT2), "gpt2"), "gpt2 name");
    CHECK(!strcmp(config_precision_name(PREC_FP32), "fp32"), "fp32 name");
}

static void test_defaults(void)
{
    char path[768], err[CFG_ERR] = "";
    Config c;
    int rc = config_load(&c, fixture("good_minimal.yaml", path), err);
    CHECK(rc == 0, "good_minimal.yaml: %s", err);
    if (rc)
        return;
    CHECK(!strcmp(c.run.name, "trident") && !strcmp(c.run.dir, "runs/trident"), "run");
    CHECK(c.run.seed == 1234 && c.run.log_every == 10, "seed log_every");
    CHECK(c.model.arch == ARCH_GPT2 && c.model.vocab_pad_multiple == 128, "model defaults");
    CHECK(c.model.tie_embeddings == -1 && c.model.kv_heads == 0 && c.model.ffn_hidden == 0,
          "unset model fields");
    CHECK_CLOSE(c.model.norm_eps, 1e-5, 1e-6, 0, "norm_eps");
    CHECK_CLOSE(c.model.rope_theta, 10000, 1e-6, 0, "rope_theta");
    CHECK_CLOSE(c.model.init_std, 0.02, 1e-6, 0, "init_std");
    CHECK(c.topology.tp == 1 && c.topology.pp == 1 && c.topology.dp == 0 && c.topology.zero == 0 &&
              c.topology.ranks_per_node == 0,
          "topology");
    CHECK(c.topology.schedule == SCHED_1F1B && c.topology.virtual_stages == 1 &&
              c.topology.n_stage_layers == 0 && !strcmp(c.topology.order, "tp-dp-pp") &&
              c.topology.bucket_mb == 25 && !c.topology.sequence_parallel &&
              !c.topology.allow_tp_across_nodes,
          "topology 2");
    CHECK_CLOSE(c.training.min_lr, 0, 0, 0, "min_lr");
    CHECK(c.training.warmup_steps == 0 && c.training.decay == DECAY_COSINE, "sched");
    CHECK_CLOSE(c.training.weight_decay, 0.1, 1e-6, 0, "wd");
    CHECK_CLOSE(c.training.beta1, 0.9, 1e-6, 0, "b1");
    CHECK_CLOSE(c.training.beta2, 0.95, 1e-6, 0, "b2");
    CHECK_CLOSE(c.training.eps, 1e-8, 1e-6, 0, "eps");
    CHECK_CLOSE(c.training.grad_clip, 1.0, 1e-6, 0, "clip");
    CHECK(c.training.precision == PREC_FP32 && c.training.recompute == RECOMPUTE_NONE &&
              !c.training.trace,
          "precision");
    CHECK(c.data.format == DATA_MEGATRON && c.data.val_every == 0 && c.data.val_sequences == 32 &&
              !c.data.val_path[0],
          "data");
    /* Checkpoints by default: <run.dir>/ckpt, saved by time (issue 35). */
    CHECK(c.checkpoint.keep == 2 && c.checkpoint.every == CKPT_EVERY_AUTO &&
              c.checkpoint.resume == RESUME_AUTO && !strcmp(c.checkpoint.dir, "auto"),
          "checkpoint: dir '%s' every %d", c.checkpoint.dir, c.checkpoint.every);
    CHECK(c.backend == BACKEND_CPU, "backend");

    /* Derived values for gpt2: kv = heads, ffn = 4*hidden, tied embeddings. */
    rc = config_validate(&c, 0, err);
    CHECK(rc == 0, "validate minimal: %s", err);
    CHECK(c.model.kv_heads == 4 && c.model.ffn_hidden == 256 && c.model.tie_embeddings == 1,
          "gpt2 derived: kv %d ffn %d tie %d", c.model.kv_heads, c.model.ffn_hidden,
          c.model.tie_embeddings);
    CHECK(c.topology.dp == 0, "dp stays auto without a world size");
    CHECK(!strcmp(c.checkpoint.dir, "runs/trident/ckpt"), "checkpoint.dir auto -> '%s'",
          c.checkpoint.dir);

    /* Llama: untied, ffn = 8/3*64 = 170.7 -> 192. */
    CHECK(config_load(&c, path, err) == 0, "%s", err);
    CHECK(config_set(&c, "model.arch=llama", err) == 0, "%s", err);
    CHECK(config_validate(&c, 4, err) == 0, "%s", err);
    CHECK(c.model.ffn_hidden == 192 && c.model.tie_embeddings == 0 && c.topology.dp == 4,
          "llama derived: ffn %d tie %d dp %d", c.model.ffn_hidden, c.model.tie_embeddings,
          c.topology.dp);
}

/* --set: each bad assignment must fail with the "--set A:" prefix, the key
 * and the given words. */
static void expect_set_error(const char *assignment, const char *const *needles)
{
    Config c;
    char err[CFG_ERR] = "", prefix[300];
    config_defaults(&c);
    int rc = config_set(&c, assignment, err);
    CHECK(rc == -1, "--set %s returned %d", assignment, rc);
    snprintf(prefix, sizeof prefix, "--set %s: ", assignment);
    CHECK(!strncmp(err, prefix, strlen(prefix)), "--set prefix missing: %s", err);
    CHECK(contains_all(err, needles), "--set %s: message lacks a word: %s", assignment, err);
}

static void test_set(void)
{
    Config c;
    char err[CFG_ERR] = "";
    config_defaults(&c);
    CHECK(config_set(&c, "training.lr=3e-4", err) == 0, "%s", err);
    CHECK_CLOSE(c.training.lr, 3e-4, 1e-6, 0, "lr via --set");
    CHECK(config_set(&c, "topology.stage_layers=[3,5]", err) == 0, "%s", err);
    CHECK(c.topology.n_stage_layers == 2 && c.topology.stage_layers[0] == 3 &&
              c.topology.stage_layers[1] == 5,
          "stage_layers via --set");
    CHECK(config_set(&c, "topology.stage_layers=[]", err) == 0, "%s", err);
    CHECK(c.topology.n_stage_layers == 0, "empty list clears stage_layers");
    CHECK(config_set(&c, "topology.dp=auto", err) == 0 && c.topology.dp == 0, "dp auto");
    CHECK(config_set(&c, "topology.dp=3", err) == 0 && c.topology.dp == 3, "dp 3");
    CHECK(config_set(&c, "checkpoint.every=0", err) == 0 && c.checkpoint.every == 0, "every 0");
    CHECK(config_set(&c, "checkpoint.every=auto", err) == 0 &&
              c.checkpoint.every == CKPT_EVERY_AUTO,
          "every auto");
    CHECK(config_set(&c, "checkpoint.every=-1", err) == -1 && strstr(err, "checkpoint.every") &&
              strstr(err, "auto"),
          "every -1 is refused (auto is written auto): %s", err);
    CHECK(config_set(&c, "model.arch=llama", err) == 0 && c.model.arch == ARCH_LLAMA, "arch");
    CHECK(config_set(&c, "topology.sequence_parallel=true", err) == 0 &&
              c.topology.sequence_parallel == 1,
          "bool");
    CHECK(c.topology.comm == COMM_AUTO && config_set(&c, "topology.comm=nccl", err) == 0 &&
              c.topology.comm == COMM_NCCL,
          "comm: auto by default, nccl set");
    CHECK(config_set(&c, "backend=cuda", err) == 0 && c.backend == BACKEND_CUDA, "backend");
    CHECK(config_set(&c, "checkpoint.resume=never", err) == 0 &&
              c.checkpoint.resume == RESUME_NEVER,
          "resume never");
    CHECK(config_set(&c, "checkpoint.resume=ckpt/x/step_10", err) == 0 &&
              c.checkpoint.resume == RESUME_PATH &&
              !strcmp(c.checkpoint.resume_path, "ckpt/x/step_10"),
          "resume path");
    CHECK(config_set(&c, "run.seed=18446744073709551615", err) == 0 && c.run.seed == UINT64_MAX,
          "seed max");
    CHECK(config_set(&c, "data.path=a=b", err) == 0 && !strcmp(c.data.path, "a=b"),
          "value with '=' (split at the first one): %s", c.data.path);

    expect_set_error("model.hiden=64", WORDS("unknown key", "did you mean 'model.hidden'?"));
    expect_set_error("model.layers=abc",
                     WORDS("key 'model.layers'", "expected an integer", "'abc'"));
    expect_set_error("training.precision=fp16",
                     WORDS("key 'training.precision'", "'fp16'", "fp32|bf16"));
    expect_set_error("training.lr", WORDS("missing '='"));
    expect_set_error("model.layers=3000000000", WORDS("out of range"));
    expect_set_error("training.lr=nan", WORDS("expected a number"));
    expect_set_error("training.lr=1e60", WORDS("out of range"));
    expect_set_error("run.seed=-1", WORDS("non-negative"));
    expect_set_error("topology.stage_layers=[3,x]", WORDS("list item 2", "'x'"));
    expect_set_error("topology.sequence_parallel=yes", WORDS("true or false"));
    expect_set_error("nosuch.key=1", WORDS("unknown key"));
}

/* Start from a valid config and break one rule at a time. */
static void base_config(Config *c)
{
    char err[CFG_ERR];
    const char *sets[] = {"model.layers=4",          "model.hidden=64",        "model.heads=4",
                          "model.vocab=256",         "model.seq_len=32",       "training.steps=10",
                          "training.global_batch=8", "training.micro_batch=2", "training.lr=1e-3",
                          "data.path=data/x"};
    config_defaults(c);
    strcpy(c->source, "base.yaml");
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (config_set(c, sets[i], err))
            fprintf(stderr, "base_config: %s\n", err);
}

static void expect_invalid(const char *const *sets, int world, const char *const *needles)
{
    Config c;
    char err[CFG_ERR] = "";
    base_config(&c);
    for (; *sets; sets++)
        CHECK(config_set(&c, *sets, err) == 0, "set %s: %s", *sets, err);
    int rc = config_validate(&c, world, err);
    CHECK(rc == -1, "validate should fail (%s...)", needles[0]);
    /* The message starts where the value came from: the --set that gave
     * the key (base_config sets everything with --set), or the file. */
    CHECK(!strncmp(err, "--set ", 6) || !strncmp(err, "config error in base.yaml: ", 27),
          "prefix: %s", err);
    CHECK(contains_all(err, needles), "validation message lacks a word: %s", err);
}

static void test_validate(void)
{
    Config c;
    char err[CFG_ERR] = "";
    base_config(&c);
    CHECK(config_validate(&c, 0, err) == 0, "base config valid: %s", err);

    /* ranges */
    expect_invalid(WORDS("model.layers=0"), 0, WORDS("model.layers", ">= 1"));
    /* Issue 34: 4e7 layers of hidden 128 pass the 2^48-parameter bound but
     * built a parameter table of gigabytes before the memory check. */
    expect_invalid(WORDS("model.layers=40000000"), 0, WORDS("model.layers", "4096"));
    /* Issue 34: token batches a typo can give, refused at validation with
     * the key the user wrote (micro_batch auto: the global batch) and the
     * limit, before anything proportional to them is allocated. */
    expect_invalid(WORDS("training.micro_batch=auto", "training.global_batch=1000000000",
                         "model.seq_len=1024"),
                   0,
                   WORDS("--set training.global_batch=1000000000", "2^48",
                         "auto: up to training.global_batch"));
    expect_invalid(WORDS("training.micro_batch=1000000000", "training.global_batch=1000000000",
                         "model.seq_len=1024"),
                   0, WORDS("--set training.micro_batch=1000000000", "2^48"));
    expect_invalid(WORDS("model.seq_len=1000000000"), 0,
                   WORDS("model.seq_len (1000000000)", "2^4"));
    expect_invalid(WORDS("training.micro_batch=1", "training.global_batch=1000000000"), 0,
                   WORDS("--set training.global_batch=1000000000", "2^31"));
    expect_invalid(WORDS("model.hidden=0"), 0, WORDS("model.hidden", ">= 1"));
    expect_invalid(WORDS("model.heads=0"), 0, WORDS("model.heads", ">= 1"));
    expect_invalid(WORDS("model.vocab=0"), 0, WORDS("model.vocab", ">= 1"));
    expect_invalid(WORDS("model.seq_len=0"), 0, WORDS("model.seq_len", ">= 1"));
    expect_invalid(WORDS("training.steps=0"), 0, WORDS("training.steps", ">= 1"));
    expect_invalid(WORDS("topology.tp=0"), 0, WORDS("topology.tp", ">= 1"));
    expect_invalid(WORDS("topology.pp=0"), 0, WORDS("topology.pp", ">= 1"));
    expect_invalid(WORDS("topology.zero=4"), 0, WORDS("topology.zero", "0, 1, 2 or 3"));
    expect_invalid(WORDS("topology.virtual_stages=0"), 0, WORDS("topology.virtual_stages"));
    expect_invalid(WORDS("run.log_every=0"), 0, WORDS("run.log_every", ">= 1"));
    expect_invalid(WORDS("checkpoint.keep=0"), 0, WORDS("checkpoint.keep", ">= 1"));
    expect_invalid(WORDS("topology.comm=nccl"), 0, WORDS("topology.comm nccl", "backend: cuda"));
    expect_invalid(WORDS("data.val_sequences=0"), 0, WORDS("data.val_sequences", ">= 1"));
    expect_invalid(WORDS("training.warmup_steps=-1"), 0, WORDS("training.warmup_steps"));
    expect_invalid(WORDS("data.path="), 0, WORDS("data.path", "required"));

    /* optimizer */
    expect_invalid(WORDS("training.lr=0"), 0, WORDS("training.lr", "> 0"));
    expect_invalid(WORDS("training.min_lr=0.01"), 0, WORDS("training.min_lr", "training.lr"));
    expect_invalid(WORDS("training.min_lr=-1e-5"), 0, WORDS("training.min_lr"));
    expect_invalid(WORDS("training.beta1=1"), 0, WORDS("training.beta1", "[0, 1)"));
    expect_invalid(WORDS("training.beta2=-0.1"), 0, WORDS("training.beta2", "[0, 1)"));
    expect_invalid(WORDS("training.eps=0"), 0, WORDS("training.eps", "> 0"));
    expect_invalid(WORDS("training.weight_decay=-0.1"), 0, WORDS("training.weight_decay"));
    expect_invalid(WORDS("training.grad_clip=-1"), 0, WORDS("training.grad_clip"));

    /* model shape */
    expect_invalid(WORDS("model.hidden=66"), 0,
                   WORDS("model.hidden (66)", "model.heads (4)", "64 or 68"));
    expect_invalid(WORDS("model.kv_heads=3"), 0, WORDS("model.heads (4)", "model.kv_heads (3)"));
    /* llama head size 6/2 = 3 is odd: RoPE needs pairs. */
    expect_invalid(WORDS("model.arch=llama", "model.hidden=6", "model.heads=2"), 0,
                   WORDS("even", "llama", "RoPE"));
    expect_invalid(WORDS("model.arch=llama", "model.rope_theta=0"), 0,
                   WORDS("model.rope_theta", "llama"));
    /* Llama 3's RoPE scaling: its four parameters, in range, on llama only */
#define LLAMA3                                                                                     \
    "model.arch=llama", "model.rope_scaling=llama3", "model.rope_factor=8",                        \
        "model.rope_low_freq_factor=1", "model.rope_high_freq_factor=4",                           \
        "model.rope_original_max_position_embeddings=8192"
    expect_invalid(WORDS(LLAMA3, "model.rope_factor=0.5"), 0,
                   WORDS("--set model.rope_factor=0.5", "model.rope_factor (0.5)", ">= 1"));
    expect_invalid(WORDS(LLAMA3, "model.rope_high_freq_factor=1"), 0,
                   WORDS("model.rope_high_freq_factor (1)", "greater"));
    expect_invalid(WORDS(LLAMA3, "model.rope_original_max_position_embeddings=0"), 0,
                   WORDS("model.rope_original_max_position_embeddings (0)", ">= 1"));
    expect_invalid(WORDS("model.arch=llama", "model.rope_scaling=llama3"), 0,
                   WORDS("model.rope_factor (0)", ">= 1"));
    expect_invalid(WORDS(LLAMA3, "model.arch=gpt2"), 0, WORDS("rope_scaling", "arch llama"));
    expect_invalid(WORDS("model.arch=llama", "model.rope_factor=8"), 0,
                   WORDS("model.rope_factor", "apply only with", "llama3"));
#undef LLAMA3

    /* topology */
    expect_invalid(WORDS("topology.virtual_stages=2"), 0,
                   WORDS("topology.virtual_stages", "interleaved"));
    Config ok;
    base_config(&ok);
    CHECK(config_set(&ok, "topology.schedule=interleaved", err) == 0, "%s", err);
    CHECK(config_set(&ok, "topology.virtual_stages=2", err) == 0, "%s", err);
    CHECK(config_set(&ok, "topology.pp=2", err) == 0, "%s", err);
    CHECK(config_validate(&ok, 0, err) == 0, "interleaved with 2 virtual stages: %s", err);
    expect_invalid(WORDS("topology.pp=2", "topology.stage_layers=[4]"), 0,
                   WORDS("topology.stage_layers", "1 entries", "topology.pp (2)"));
    expect_invalid(WORDS("topology.pp=2", "topology.schedule=interleaved",
                         "topology.virtual_stages=2", "topology.stage_layers=[2,2]"),
                   0, WORDS("topology.stage_layers", "2 entries", "is 4", "model stage"));
    expect_invalid(
        WORDS("topology.pp=2", "topology.schedule=interleaved", "topology.virtual_stages=17"), 0,
        WORDS("topology.virtual_stages (17)", "above 16"));
    expect_invalid(WORDS("topology.pp=2", "topology.stage_layers=[1,2]"), 0,
                   WORDS("topology.stage_layers", "sums to 3", "model.layers is 4"));
    expect_invalid(WORDS("topology.pp=2", "topology.stage_layers=[0,4]"), 0,
                   WORDS("topology.stage_layers[0]", ">= 1"));
    expect_invalid(WORDS("topology.pp=5"), 0, WORDS("model.layers (4)", "topology.pp (5)"));
    expect_invalid(WORDS("topology.tp=3"), 0,
                   WORDS("model.heads (4)", "topology.tp (3)", "1, 2, 4"));
    /* heads 12, kv 4, tp 6: 12 % 6 == 0 but neither of 4 and 6 divides the other. */
    expect_invalid(WORDS("model.heads=12", "model.hidden=96", "model.kv_heads=4", "topology.tp=6"),
                   0, WORDS("model.kv_heads (4)", "topology.tp (6)"));
    expect_invalid(WORDS("topology.tp=2", "model.ffn_hidden=255"), 0,
                   WORDS("model.ffn_hidden (255)", "topology.tp (2)"));
    expect_invalid(WORDS("topology.tp=4", "model.seq_len=30", "topology.sequence_parallel=true"), 0,
                   WORDS("model.seq_len (30)", "topology.tp (4)", "sequence_parallel"));
    expect_invalid(WORDS("topology.order=tp-tp-pp"), 0, WORDS("topology.order"));

    /* batch and world */
    expect_invalid(WORDS("training.global_batch=64", "training.micro_batch=4", "topology.dp=3"), 0,
                   WORDS("--set training.micro_batch=4: ",
                         "global_batch 64 is not a "
                         "multiple of training.micro_batch 4 x topology.dp 3 = 12",
                         "micro_batch: auto", "keeps the global batch"));
    /* The micro_batch fix comes first, with the size auto would pick. */
    expect_invalid(WORDS("training.global_batch=8", "training.micro_batch=8", "topology.dp=2"), 0,
                   WORDS("micro_batch: auto (here 4) or a divisor of 4"));
    expect_invalid(WORDS("training.global_batch=7"), 0,
                   WORDS("training.global_batch 7", "training.micro_batch 2"));
    expect_invalid(WORDS("topology.tp=2"), 3, WORDS("world size 3", "topology.tp (2)"));
    expect_invalid(WORDS("topology.tp=2", "topology.dp=2"), 8,
                   WORDS("topology.dp (2)", "= 4", "world size is 8"));
    /* dp auto from world 4 with tp 2: dp 2, micro 2 x 2 = 4 divides 8. */
    base_config(&c);
    CHECK(config_set(&c, "topology.tp=2", err) == 0, "%s", err);
    CHECK(config_validate(&c, 4, err) == 0 && c.topology.dp == 2, "dp auto: %s", err);
    /* With world 16, dp is 8 and micro 2 x dp 8 = 16 no longer divides 8. */
    expect_invalid(WORDS("topology.tp=2"), 16, WORDS("global_batch 8", "topology.dp 8"));

    /* micro_batch auto: a rank's whole share without a pipeline; with one,
     * the largest size that leaves >= 2 x pp micro-batches. */
    struct {
        int gb, world, pp, want;
    } autos[] = {{8, 1, 1, 8},  {8, 2, 1, 4}, {8, 8, 1, 1},
                 {32, 2, 2, 8}, {8, 4, 2, 1}, {6, 3, 1, 2}};
    for (size_t i = 0; i < sizeof autos / sizeof autos[0]; i++) {
        char set[64];
        base_config(&c);
        CHECK(config_set(&c, "training.micro_batch=auto", err) == 0, "%s", err);
        snprintf(set, sizeof set, "training.global_batch=%d", autos[i].gb);
        CHECK(config_set(&c, set, err) == 0, "%s", err);
        snprintf(set, sizeof set, "topology.pp=%d", autos[i].pp);
        CHECK(config_set(&c, set, err) == 0, "%s", err);
        int rc = config_validate(&c, autos[i].world, err);
        CHECK(rc == 0 && c.training.micro_batch == autos[i].want,
              "auto micro_batch, global %d, world %d, pp %d: got %d, want %d (%s)", autos[i].gb,
              autos[i].world, autos[i].pp, c.training.micro_batch, autos[i].want, rc ? err : "");
    }
    expect_invalid(WORDS("training.micro_batch=auto", "training.global_batch=8"), 3,
                   WORDS("training.global_batch 8 is not divisible by topology.dp 3"));
}

/* Write text to a fresh /tmp file named after tag; 0 when it worked. */
static int temp_yaml(const char *tag, const char *text, char path[64])
{
    snprintf(path, 64, "/tmp/trident_test_%s_%d.yaml", tag, (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "create %s", path);
    if (!f)
        return -1;
    fputs(text, f);
    fclose(f);
    return 0;
}

/* A value error in a file names FILE:LINE:COL of the value; a value that
 * came from --set names that argument; a renamed key says what replaced it. */
static void test_value_places(void)
{
    char path[64], err[CFG_ERR] = "";
    if (temp_yaml("place",
                  "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training:\n"
                  "  steps: 10\n"
                  "  global_batch: 8\n"
                  "  lr:   -1\n"
                  "topology:\n"
                  "  zero: 7\n"
                  "data: {path: data/x}\n",
                  path))
        return;
    Config c;
    CHECK(config_load(&c, path, err) == 0, "load: %s", err);
    char want[128];
    snprintf(want, sizeof want, "%s:7:9: topology.zero (7) must be 0, 1, 2 or 3", path);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, want, strlen(want)),
          "zero: want '%s', got '%s'", want, err);
    CHECK(config_set(&c, "topology.zero=0", err) == 0, "%s", err);
    snprintf(want, sizeof want, "%s:5:9: training.lr (-1) must be > 0", path);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, want, strlen(want)),
          "lr: want '%s', got '%s'", want, err);
    CHECK(config_set(&c, "training.lr=1e-3", err) == 0, "%s", err);
    CHECK(config_set(&c, "topology.zero=5", err) == 0, "%s", err);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, "--set topology.zero=5: ", 23),
          "zero from --set: %s", err);
    /* A default value has no place but the file. */
    CHECK(config_set(&c, "topology.zero=0", err) == 0, "%s", err);
    CHECK(config_validate(&c, 1, err) == 0, "valid now: %s", err);
    remove(path);

    CHECK(config_set(&c, "data.val_batches=8", err) == -1 && strstr(err, "data.val_sequences"),
          "renamed key: %s", err);
}

/* topology.offload: the optimizer state in host memory is a device
 * backend's option; on the CPU backend it is refused at the key's place. */
static void test_offload_key(void)
{
    char path[64], err[CFG_ERR] = "";
    if (temp_yaml("offload",
                  "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training: {steps: 10, global_batch: 8, lr: 1e-3}\n"
                  "topology:\n"
                  "  offload: optimizer\n"
                  "data: {path: data/x}\n",
                  path))
        return;
    Config c;
    CHECK(config_load(&c, path, err) == 0, "load: %s", err);
    CHECK(c.topology.offload == OFFLOAD_OPTIMIZER, "offload optimizer read");
    char want[128];
    snprintf(want, sizeof want, "%s:4:12: topology.offload moves the optimizer state", path);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, want, strlen(want)) &&
              strstr(err, "backend: cuda"),
          "offload on the cpu: want '%s', got '%s'", want, err);
    CHECK(config_set(&c, "backend=cuda", err) == 0 && config_validate(&c, 1, err) == 0,
          "offload with backend cuda is valid: %s", err);
    remove(path);
    /* optimizer+params: the parameter shard only ZeRO-3 has, refused at
     * the key without it, with the rule and the fix */
    if (temp_yaml("offload_params",
                  "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training: {steps: 10, global_batch: 8, lr: 1e-3}\n"
                  "backend: cuda\n"
                  "topology: {zero: 1, offload: optimizer+params}\n"
                  "data: {path: data/x}\n",
                  path))
        return;
    CHECK(config_load(&c, path, err) == 0, "load: %s", err);
    CHECK(c.topology.offload == OFFLOAD_PARAMS, "offload optimizer+params read");
    snprintf(want, sizeof want, "%s:4:30: topology.offload optimizer+params moves", path);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, want, strlen(want)) &&
              strstr(err, "topology.zero is 1") && strstr(err, "set topology.zero: 3"),
          "optimizer+params with ZeRO 1: want '%s', got '%s'", want, err);
    CHECK(config_set(&c, "topology.zero=3", err) == 0 && config_validate(&c, 1, err) == 0,
          "optimizer+params with ZeRO-3 (dp 1) is valid: %s", err);
    remove(path);
    config_defaults(&c);
    CHECK(c.topology.offload == OFFLOAD_NONE, "offload none by default");
    expect_set_error("topology.offload=params", WORDS("topology.offload", "none|optimizer"));
}

/* model.moe: a mapping inside model, or model.moe.KEY with --set; its
 * errors at FILE:LINE:COL of the value; the writer's form reads back. */
static void test_moe_keys(void)
{
    char path[64], err[CFG_ERR] = "", out[64];
    if (temp_yaml("moe",
                  "model:\n"
                  "  layers: 2\n"
                  "  hidden: 64\n"
                  "  heads: 4\n"
                  "  vocab: 256\n"
                  "  seq_len: 32\n"
                  "  moe:\n"
                  "    experts: 4\n"
                  "    top_k: 5\n"
                  "    capacity_factor: 1.25\n"
                  "    shared_experts: 1\n"
                  "training: {steps: 10, global_batch: 8, lr: 1e-3}\n"
                  "data: {path: data/x}\n",
                  path))
        return;
    Config c;
    CHECK(config_load(&c, path, err) == 0, "load: %s", err);
    CHECK(c.model.moe_experts == 4 && c.model.moe_top_k == 5 &&
              c.model.moe_capacity_factor == 1.25f && c.model.moe_shared_experts == 1 &&
              c.model.moe_every == 1 && c.model.moe_aux_loss_coef == 0.01f,
          "moe keys and defaults");
    char want[160];
    snprintf(want, sizeof want, "%s:9:12: model.moe.top_k (5) must be between 1 and", path);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, want, strlen(want)),
          "top_k: want '%s', got '%s'", want, err);
    CHECK(config_set(&c, "model.moe.top_k=2", err) == 0, "%s", err);
    CHECK(config_validate(&c, 1, err) == 0, "valid now: %s", err);
    CHECK(c.model.moe_ffn_hidden == 256, "moe.ffn_hidden resolved to ffn_hidden: %d",
          c.model.moe_ffn_hidden);
    /* Written as a moe: mapping nested in model, and read back the same. */
    Config b;
    snprintf(out, sizeof out, "/tmp/trident_test_moe_out_%d.yaml", (int)getpid());
    CHECK(config_write_yaml(&c, out, err) == 0, "write: %s", err);
    CHECK(config_load(&b, out, err) == 0, "reload: %s", err);
    memcpy(b.source, c.source, sizeof b.source);
    memcpy(&b.origin, &c.origin, sizeof b.origin);
    CHECK(memcmp(&b, &c, sizeof b) == 0, "moe round trip changed the config");
    CHECK(config_set(&b, "model.moe.capacity_factor=dropless", err) == 0, "%s", err);
    CHECK(config_write_yaml(&b, out, err) == 0 && config_load(&c, out, err) == 0 &&
              c.model.moe_capacity_factor == 0,
          "dropless round trip: %s", err);
    remove(out);
    remove(path);

    if (temp_yaml("moe_bad",
                  "model:\n"
                  "  layers: 2\n"
                  "  moe: {experts: 4, capacity_factor: 0}\n",
                  path))
        return;
    snprintf(want, sizeof want, "%s:3:38: key 'model.moe.capacity_factor': expected a capacity",
             path);
    CHECK(config_load(&c, path, err) == -1 && !strncmp(err, want, strlen(want)),
          "capacity 0: want '%s', got '%s'", want, err);
    remove(path);
    if (temp_yaml("moe_bad", "model:\n  moe: {experts: 4, topk: 2}\n", path))
        return;
    CHECK(config_load(&c, path, err) == -1 && strstr(err, ":2:21: key 'model.moe.topk'") &&
              strstr(err, "did you mean 'top_k'"),
          "unknown moe key: %s", err);
    remove(path);

    expect_set_error("model.moe.capacity_factor=-1",
                     WORDS("--set model.moe.capacity_factor=-1", "> 0", "dropless"));
    expect_invalid(WORDS("model.moe.experts=4", "model.moe.every=5"), 0,
                   WORDS("model.moe.every (5)", "model.layers (4)"));
    expect_invalid(WORDS("model.moe.experts=4", "topology.cp=2"), 0,
                   WORDS("--set topology.cp=2", "model.moe", "context"));
    /* tp splits every expert like the dense MLP: its width must divide. */
    expect_invalid(
        WORDS("model.moe.experts=4", "model.moe.ffn_hidden=6", "topology.tp=4"), 0,
        WORDS("--set model.moe.ffn_hidden=6", "divisible by topology.tp (4)", "multiple of 4"));
    base_config(&c);
    CHECK(config_set(&c, "model.moe.experts=4", err) == 0 &&
              config_set(&c, "topology.tp=2", err) == 0 &&
              config_set(&c, "topology.sequence_parallel=true", err) == 0 &&
              config_validate(&c, 0, err) == 0,
          "MoE with tp 2 and sequence parallelism: %s", err);
    expect_invalid(WORDS("model.moe.experts=4", "topology.ep=3"), 0,
                   WORDS("topology.ep (3)", "model.moe.experts (4)"));
    expect_invalid(WORDS("model.moe.experts=4", "topology.ep=4"), 2,
                   WORDS("topology.ep (4)", "topology.dp (2)"));
    expect_invalid(WORDS("topology.ep=2"), 0, WORDS("topology.ep (2)", "model.moe.experts"));
    /* Expert parallelism: ep 2 of dp 2 over 4 experts is a layout. */
    base_config(&c);
    CHECK(config_set(&c, "model.moe.experts=4", err) == 0 &&
              config_set(&c, "topology.ep=2", err) == 0 && config_validate(&c, 2, err) == 0,
          "ep 2 with dp 2: %s", err);
    /* From a file, the message is at the value of topology.ep. */
    if (temp_yaml("moe_ep",
                  "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training: {steps: 10, global_batch: 12, lr: 1e-3}\n"
                  "data: {path: data/x}\n"
                  "topology:\n"
                  "  ep: 3\n",
                  path))
        return;
    snprintf(want, sizeof want, "%s:5:7: ", path);
    CHECK(config_load(&c, path, err) == 0 && config_set(&c, "model.moe.experts=4", err) == 0,
          "load: %s", err);
    CHECK(config_validate(&c, 3, err) == -1 && !strncmp(err, want, strlen(want)) &&
              strstr(err, "topology.ep (3) must divide model.moe.experts (4)"),
          "ep 3 of 4 experts: want '%s...', got '%s'", want, err);
    remove(path);
}

/* Write the resolved config and read it back: the structs must be equal
 * byte for byte (source aside, which names the file read). */
static void test_round_trip(void)
{
    char path[768], err[CFG_ERR] = "", out[64];
    Config a, b;
    snprintf(out, sizeof out, "/tmp/trident_test_config_%d.yaml", (int)getpid());
    CHECK(config_load(&a, fixture("good_full.yaml", path), err) == 0, "%s", err);
    /* Awkward strings must survive quoting. */
    CHECK(config_set(&a, "run.name=has \"quotes\", a \\ and: colon", err) == 0, "%s", err);
    CHECK(config_set(&a, "data.val_path=true", err) == 0, "%s", err);
    CHECK(config_set(&a, "training.lr=0.000123456789", err) == 0, "%s", err);
    CHECK(config_set(&a, "model.tie_embeddings=auto", err) == 0, "%s", err);
    CHECK(config_set(&a, "checkpoint.every=auto", err) == 0, "%s", err);

    /* Unvalidated first (tie_embeddings auto, dp auto), then validated. */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            CHECK(config_validate(&a, 8, err) == 0, "%s", err);
        CHECK(config_write_yaml(&a, out, err) == 0, "write: %s", err);
        int rc = config_load(&b, out, err);
        CHECK(rc == 0, "reload pass %d: %s", pass, err);
        if (rc)
            break;
        CHECK(!strcmp(b.source, out), "source of the reloaded config");
        memcpy(b.source, a.source, sizeof b.source);
        memcpy(&b.origin, &a.origin, sizeof b.origin); /* provenance, not the experiment */
        CHECK(memcmp(&a, &b, sizeof a) == 0, "round trip pass %d changed the config", pass);
        CHECK(!strcmp(b.run.name, "has \"quotes\", a \\ and: colon"), "name %s", b.run.name);
        CHECK(!strcmp(b.data.val_path, "true"), "string 'true' stays a string");
        CHECK(b.training.lr == a.training.lr, "float exact");
    }
    CHECK(a.topology.dp == 2 && b.topology.dp == 2, "resolved dp written");
    CHECK(b.model.ffn_hidden == 704 && b.model.tie_embeddings == 0, "resolved model written");
    remove(out);

    CHECK(config_write_yaml(&a, "/nonexistent-dir/x.yaml", err) == -1 &&
              strstr(err, "/nonexistent-dir/x.yaml"),
          "unwritable path: %s", err);
}

/* data.path as a list, data.blend as a YAML list of {path, weight} (kept
 * in Megatron's string form, written and read back), and their errors. */
static void test_data_keys(void)
{
    char path[64], out[64], err[CFG_ERR] = "";
    if (temp_yaml("blend",
                  "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training: {steps: 10, global_batch: 8, lr: 1e-3}\n"
                  "data:\n"
                  "  blend:\n"
                  "    - {path: \"data/web-*\", weight: 0.7}\n"
                  "    - {weight: 3, path: data/b}\n"
                  "  val_path: [data/v1, data/v2]\n",
                  path))
        return;
    Config a, b;
    CHECK(config_load(&a, path, err) == 0, "load: %s", err);
    CHECK(!strcmp(a.data.blend, "0.7 data/web-* 3 data/b"), "blend '%s'", a.data.blend);
    CHECK(!strcmp(a.data.val_path, "data/v1,data/v2"), "val_path '%s'", a.data.val_path);
    CHECK(config_validate(&a, 1, err) == 0, "valid: %s", err);
    BlendSpec spec;
    CHECK(config_data_spec(&a.data, 0, &spec, err) == 0 && spec.n == 2 && spec.weight[1] == 3 &&
              !strcmp(spec.path[0], "data/web-*"),
          "spec: %s", err);
    CHECK(config_data_spec(&a.data, 1, &spec, err) == 0 && spec.n == 1 &&
              !strcmp(spec.path[0], "data/v1,data/v2"),
          "val spec");
    CHECK(!strcmp(config_data_name(&a.data), a.data.blend), "the blend names the data");
    snprintf(out, sizeof out, "/tmp/trident_test_blend_out_%d.yaml", (int)getpid());
    CHECK(config_write_yaml(&a, out, err) == 0 && config_load(&b, out, err) == 0, "%s", err);
    CHECK(!strcmp(b.data.blend, a.data.blend) && !strcmp(b.data.val_path, a.data.val_path),
          "blend and list written and read back");
    CHECK(config_set(&a, "data.path=[x, y]", err) == 0 && !strcmp(a.data.path, "x, y"),
          "--set list: '%s'", a.data.path);
    CHECK(config_validate(&a, 1, err) == -1 && strstr(err, "both set"), "path and blend: %s", err);
    CHECK(config_set(&a, "data.path=", err) == 0 && config_set(&a, "data.blend=1 a 2", err) == 0 &&
              config_validate(&a, 1, err) == -1 && strstr(err, "--set data.blend=1 a 2") &&
              strstr(err, "weight 2 has no path"),
          "bad blend string: %s", err);
    remove(path);
    remove(out);
    if (temp_yaml("noblend",
                  "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training: {steps: 10, global_batch: 8, lr: 1e-3}\n"
                  "data:\n"
                  "  blend:\n"
                  "    - {path: a, weight: 1}\n"
                  "    - {path: b}\n",
                  path))
        return;
    char want[128];
    snprintf(want, sizeof want, "%s:6:7: key 'data.blend': list item 2 needs a path", path);
    CHECK(config_load(&a, path, err) == -1 && !strncmp(err, want, strlen(want)),
          "want '%s', got '%s'", want, err);
    remove(path);
}

/* Issue 17's keys: training.nonfinite, training.max_skipped, and
 * checkpoint.allow_changes as a YAML list, a comma string or a --set list. */
static void test_reliability_keys(void)
{
    char err[CFG_ERR] = "", path[64];
    Config c;
    base_config(&c);
    CHECK(c.training.nonfinite == NONFINITE_STOP && c.training.max_skipped == 10 &&
              !c.checkpoint.allow_changes[0],
          "defaults: stop, 10, no changes allowed");
    CHECK(config_set(&c, "training.nonfinite=skip", err) == 0 &&
              c.training.nonfinite == NONFINITE_SKIP,
          "nonfinite skip: %s", err);
    CHECK(config_set(&c, "checkpoint.allow_changes=[seed, data]", err) == 0 &&
              config_validate(&c, 0, err) == 0 && !strcmp(c.checkpoint.allow_changes, "seed,data"),
          "--set list normalised: '%s' %s", c.checkpoint.allow_changes, err);
    expect_invalid((const char *const[]){"training.max_skipped=0", NULL}, 0,
                   (const char *const[]){"training.max_skipped", ">= 1", NULL});
    expect_invalid((const char *const[]){"checkpoint.allow_changes=seed,lr", NULL}, 0,
                   (const char *const[]){"checkpoint.allow_changes", "'lr'", NULL});

    if (temp_yaml("config_ac",
                  "model: {layers: 1, hidden: 64, heads: 4, vocab: 256, seq_len: 32}\n"
                  "training: {steps: 1, global_batch: 8, micro_batch: 8, lr: 1.0e-3, "
                  "max_skipped: 3}\n"
                  "data: {path: data/x}\n"
                  "checkpoint: {allow_changes: [data, seed]}\n",
                  path))
        return;
    Config y, back;
    CHECK(config_load(&y, path, err) == 0 && config_validate(&y, 1, err) == 0, "load: %s", err);
    CHECK(!strcmp(y.checkpoint.allow_changes, "data,seed") && y.training.max_skipped == 3,
          "YAML list joined: '%s'", y.checkpoint.allow_changes);
    CHECK(config_write_yaml(&y, path, err) == 0 && config_load(&back, path, err) == 0 &&
              !strcmp(back.checkpoint.allow_changes, "data,seed"),
          "written as a string and read back: '%s' %s", back.checkpoint.allow_changes, err);
    remove(path);
}

/* checkpoint.init_from in the file: the model section may be left out
 * (a front end fills it from the source); config_model_given says which
 * keys the file and --set gave.  Without init_from the keys stay required. */
static void test_init_from_model(void)
{
    char path[64], err[CFG_ERR] = "";
    snprintf(path, sizeof path, "/tmp/trident_test_init_%d.yaml", (int)getpid());
    const char *body = "training: {steps: 2, global_batch: 8, lr: 1.0e-3}\n"
                       "data: {path: data/x}\n";
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f)
        return;
    fprintf(f, "%scheckpoint: {init_from: hf/model}\nmodel: {seq_len: 64}\n", body);
    fclose(f);
    Config c;
    CHECK(config_load(&c, path, err) == 0, "no model section with init_from: %s", err);
    CHECK(config_model_given(&c, "seq_len") && !config_model_given(&c, "layers") &&
              !config_model_given(&c, "arch"),
          "given: seq_len only");
    CHECK(config_set(&c, "model.hidden=64", err) == 0 && config_model_given(&c, "hidden"),
          "--set gives a key");
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "%s", body);
        fclose(f);
    }
    CHECK(config_load(&c, path, err) == -1 && strstr(err, "model.layers") &&
              strstr(err, "missing required key"),
          "without init_from the model keys are required: %s", err);
    remove(path);
}

/* model.lora: a mapping inside model, its --set keys (three parts), the
 * validation of targets at file:line:col, the YAML round trip. */
static void test_lora(void)
{
    char path[64], err[CFG_ERR] = "", out[64];
    if (temp_yaml("lora",
                  "model:\n"
                  "  arch: llama\n"
                  "  layers: 2\n"
                  "  hidden: 64\n"
                  "  heads: 4\n"
                  "  vocab: 256\n"
                  "  seq_len: 32\n"
                  "  lora:\n"
                  "    rank: 8\n"
                  "    targets: [qkv, up, mlp]\n"
                  "training: {steps: 10, global_batch: 8, lr: 1.0e-3}\n"
                  "data: {path: data/x}\n",
                  path))
        return;
    Config c;
    CHECK(config_load(&c, path, err) == 0, "load: %s", err);
    CHECK(c.model.lora.rank == 8 && c.model.lora.alpha == 16.0f &&
              !strcmp(c.model.lora.targets, "qkv,up,mlp"),
          "lora: rank %d alpha %g targets %s", c.model.lora.rank, (double)c.model.lora.alpha,
          c.model.lora.targets);
    char want[160];
    snprintf(want, sizeof want,
             "%s:10:14: model.lora.targets: 'mlp' is not a linear layer of a llama model", path);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, want, strlen(want)),
          "bad target: want '%s', got '%s'", want, err);
    CHECK(config_set(&c, "model.lora.targets=[qkv, fcproj]", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.lora.alpha=32", err) == 0 && c.model.lora.alpha == 32.0f, "%s",
          err);
    CHECK(config_validate(&c, 1, err) == 0, "valid now: %s", err);
    CHECK(config_set(&c, "model.lora.dropout=0.1", err) == 0, "%s", err);
    CHECK(config_validate(&c, 1, err) == 0, "dropout 0.1 on the cpu backend: %s", err);
    CHECK(config_set(&c, "model.lora.dropout=1", err) == 0, "%s", err);
    CHECK(config_validate(&c, 1, err) == -1 && !strncmp(err, "--set model.lora.dropout=1: ", 28),
          "dropout 1 from --set: %s", err);
    CHECK(config_set(&c, "model.lora.dropout=0", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.lora.rnak=4", err) == -1 && strstr(err, "model.lora.rank"),
          "a typo gets a suggestion: %s", err);
    snprintf(out, sizeof out, "/tmp/trident_test_lora_%d.yaml", (int)getpid());
    Config b;
    CHECK(config_write_yaml(&c, out, err) == 0 && config_load(&b, out, err) == 0, "%s", err);
    CHECK(b.model.lora.rank == 8 && b.model.lora.alpha == 32.0f &&
              !strcmp(b.model.lora.targets, "qkv,fcproj"),
          "round trip: rank %d alpha %g targets %s", b.model.lora.rank, (double)b.model.lora.alpha,
          b.model.lora.targets);
    CHECK(config_set(&c, "model.lora.targets=qkv,up", err) == 0, "%s", err);
    CHECK(config_set(&c, "model.arch=gpt2", err) == 0, "%s", err);
    CHECK(config_validate(&c, 1, err) == -1 && strstr(err, "'up' is not a linear layer of a gpt2"),
          "up on gpt2: %s", err);
    remove(path);
    remove(out);
}

int main(void)
{
    const char *root = getenv("TRIDENT_SOURCE_ROOT");
    snprintf(fixture_dir, sizeof fixture_dir, "%s/tests/yaml", root ? root : ".");
    test_malformed();
    test_good_full();
    test_defaults();
    test_set();
    test_validate();
    test_value_places();
    test_offload_key();
    test_moe_keys();
    test_round_trip();
    test_data_keys();
    test_reliability_keys();
    test_init_from_model();
    test_lora();
    return check_summary("config");
}

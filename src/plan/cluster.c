/* cluster.c — cluster presets and the YAML cluster description.
 *
 * Preset figures are vendor data sheet numbers (docs/plan.md gives them
 * with their sources); efficiencies and the runtime reserve are this
 * planner's assumptions, stated there too. */
#include "plan/cluster.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/error.h"

/* clang-format off */
static const PlanCluster PRESETS[] = {
    /* name          nodes gpn  mem   rsv  peak   hbm   nvlink lat  net  lat   gemm  comm  bf16 storage (plan --storage)
     *                                                                                       host GiB  pcie  host GB/s (offload) */
    {"a100-40gb",    1, 8,  40.0, 2.0, 312.0, 1555.0, 300.0, 5.0, 25.0, 10.0, 0.62, 0.80, 0, 1024.0, 25.0, 409.6},
    {"a100-80gb",    1, 8,  80.0, 2.0, 312.0, 2039.0, 300.0, 5.0, 25.0, 10.0, 0.62, 0.80, 0, 2048.0, 25.0, 409.6},
    {"h100-sxm",     1, 8,  80.0, 2.0, 989.0, 3350.0, 450.0, 5.0, 50.0, 10.0, 0.57, 0.80, 0, 2048.0, 50.0, 614.4},
    {"h200",         1, 8, 140.0, 2.0, 989.0, 4800.0, 450.0, 5.0, 50.0, 10.0, 0.57, 0.80, 0, 2048.0, 50.0, 614.4},
    /* Consumer cards in one box talk over PCIe 4.0 x16; nodes over 100 GbE shared by 4.
     * The box: a workstation board with 256 GiB of DDR4-3200 on 4 channels. */
    {"rtx3090",      1, 4,  24.0, 1.5,  71.0,  936.0,  25.0, 10.0, 3.0, 20.0, 0.65, 0.80, 0,  256.0, 25.0, 102.4},
    /* The CPU reference backend (this machine's class): fp32, memory as RAM. */
    {"cpu",          1, 1,  24.0, 0.0,   0.1,   20.0,  10.0, 2.0, 10.0,  5.0, 0.50, 0.50, 0,   24.0, 10.0,  20.0},
};
/* clang-format on */
enum { N_PRESETS = sizeof PRESETS / sizeof PRESETS[0] };

const char *cluster_preset_names(void)
{
    return "a100-40gb, a100-80gb, h100-sxm, h200, rtx3090, cpu";
}

double cluster_device_peak_tflops(const char *device)
{
    /* A device name (CUDA's: "NVIDIA H100 80GB HBM3") and its preset. */
    static const struct {
        const char *key, *preset;
    } known[] = {
        {"H200", "h200"}, {"H100", "h100-sxm"}, {"A100", "a100-80gb"}, {"RTX 3090", "rtx3090"}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strstr(device, known[i].key))
            for (int j = 0; j < N_PRESETS; j++)
                if (!strcmp(PRESETS[j].name, known[i].preset))
                    return PRESETS[j].peak_tflops;
    return 0;
}

int cluster_preset(const char *name, PlanCluster *c, char err[CFG_ERR])
{
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(PRESETS[i].name, name)) {
            *c = PRESETS[i];
            return 0;
        }
    return trd_errorf(err, "cluster preset '%s' is not known; presets: %s, or a YAML file", name,
                      cluster_preset_names());
}

/* ---- YAML ------------------------------------------------------------------ */

typedef enum { F_STR, F_INT, F_NUM } FieldKind;

typedef struct {
    const char *key;
    FieldKind kind;
    size_t offset;
    double min; /* smallest accepted value (numbers) */
} Field;

static const Field FIELDS[] = {
    {"name", F_STR, offsetof(PlanCluster, name), 0},
    {"nodes", F_INT, offsetof(PlanCluster, nodes), 1},
    {"gpus_per_node", F_INT, offsetof(PlanCluster, gpus_per_node), 1},
    {"gpu_memory_gib", F_NUM, offsetof(PlanCluster, gpu_memory_gib), 1e-3},
    {"reserve_gib", F_NUM, offsetof(PlanCluster, reserve_gib), 0},
    {"peak_tflops", F_NUM, offsetof(PlanCluster, peak_tflops), 1e-6},
    {"hbm_gbps", F_NUM, offsetof(PlanCluster, hbm_gbps), 1e-6},
    {"nvlink_gbps", F_NUM, offsetof(PlanCluster, nvlink_gbps), 1e-6},
    {"nvlink_latency_us", F_NUM, offsetof(PlanCluster, nvlink_latency_us), 0},
    {"network_gbps", F_NUM, offsetof(PlanCluster, network_gbps), 1e-6},
    {"network_latency_us", F_NUM, offsetof(PlanCluster, network_latency_us), 0},
    {"gemm_efficiency", F_NUM, offsetof(PlanCluster, gemm_efficiency), 1e-3},
    {"comm_efficiency", F_NUM, offsetof(PlanCluster, comm_efficiency), 1e-3},
    {"host_memory_gib", F_NUM, offsetof(PlanCluster, host_memory_gib), 1e-3},
    {"pcie_gbps", F_NUM, offsetof(PlanCluster, pcie_gbps), 1e-6},
    {"host_memory_gbps", F_NUM, offsetof(PlanCluster, host_memory_gbps), 1e-6},
};
enum { N_FIELDS = sizeof FIELDS / sizeof FIELDS[0] };

static int at(char err[CFG_ERR], const char *path, yaml_mark_t m, const char *what,
              const char *detail)
{
    return trd_errorf(err, "%s:%zu:%zu: %s%s", path, m.line + 1, m.column + 1, what, detail);
}

static int set_field(const Field *f, PlanCluster *c, const char *s, char why[128])
{
    char *end = NULL;
    errno = 0;
    if (f->kind == F_STR) {
        if (strlen(s) >= sizeof c->name)
            return snprintf(why, 128, "longer than %zu characters", sizeof c->name - 1), -1;
        snprintf((char *)c + f->offset, sizeof c->name, "%s", s);
        return 0;
    }
    if (f->kind == F_INT) {
        long v = strtol(s, &end, 10);
        if (errno || end == s || *end || v < (long)f->min || v > INT_MAX)
            return snprintf(why, 128, "expected a whole number >= %.0f, got '%s'", f->min, s), -1;
        *(int *)((char *)c + f->offset) = (int)v;
        return 0;
    }
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < f->min)
        return snprintf(why, 128, "expected a number >= %g, got '%s'", f->min, s), -1;
    *(double *)((char *)c + f->offset) = v;
    return 0;
}

static const yaml_node_t *find_value(yaml_document_t *d, yaml_node_t *root, const char *key,
                                     yaml_mark_t *mark)
{
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key);
        if (k->type == YAML_SCALAR_NODE && !strcmp((char *)k->data.scalar.value, key)) {
            *mark = k->start_mark;
            return yaml_document_get_node(d, p->value);
        }
    }
    return NULL;
}

/* The mapping: `preset` first (the base), then every other key over it. */
static int load_mapping(yaml_document_t *d, const char *path, PlanCluster *c, char err[CFG_ERR])
{
    yaml_node_t *root = yaml_document_get_root_node(d);
    if (!root || root->type != YAML_MAPPING_NODE)
        return trd_errorf(err, "%s: a cluster file is a mapping (preset: ..., nodes: ...)", path);
    yaml_mark_t mark;
    const yaml_node_t *pre = find_value(d, root, "preset", &mark);
    if (!pre)
        return at(err, path, root->start_mark, "key 'preset' is missing",
                  "; name the preset the other keys override (a100-80gb, h100-sxm, ...)");
    if (pre->type != YAML_SCALAR_NODE ||
        cluster_preset((char *)pre->data.scalar.value, c, err) != 0) {
        char msg[CFG_ERR];
        snprintf(msg, sizeof msg, ": %s", pre->type == YAML_SCALAR_NODE ? err : "not a scalar");
        return at(err, path, pre->start_mark, "key 'preset'", msg);
    }
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key),
                    *v = yaml_document_get_node(d, p->value);
        const char *key = k->type == YAML_SCALAR_NODE ? (char *)k->data.scalar.value : "?";
        if (!strcmp(key, "preset"))
            continue;
        const Field *f = NULL;
        for (int i = 0; i < N_FIELDS; i++)
            if (!strcmp(FIELDS[i].key, key))
                f = &FIELDS[i];
        char msg[CFG_ERR];
        if (!f) {
            snprintf(msg, sizeof msg, "'%s' is not a cluster key (keys: preset", key);
            for (int i = 0; i < N_FIELDS; i++)
                snprintf(msg + strlen(msg), sizeof msg - strlen(msg), ", %s", FIELDS[i].key);
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), ")");
            return at(err, path, k->start_mark, "key ", msg);
        }
        if (v->type != YAML_SCALAR_NODE)
            return at(err, path, v->start_mark, "key ", "expected a single value");
        char why[128];
        if (set_field(f, c, (char *)v->data.scalar.value, why) != 0) {
            snprintf(msg, sizeof msg, "'%s': %s", key, why);
            return at(err, path, v->start_mark, "key ", msg);
        }
    }
    if (c->reserve_gib >= c->gpu_memory_gib)
        return trd_errorf(err, "%s: reserve_gib %.1f leaves nothing of gpu_memory_gib %.1f", path,
                          c->reserve_gib, c->gpu_memory_gib);
    return 0;
}

static int load_file(const char *path, PlanCluster *c, char err[CFG_ERR])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return trd_errorf(err, "cannot open cluster file %s: %s (or name a preset: %s)", path,
                          strerror(errno), cluster_preset_names());
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int rc;
    if (!yaml_parser_load(&parser, &doc)) {
        rc = trd_errorf(err, "%s:%zu:%zu: %s", path, parser.problem_mark.line + 1,
                        parser.problem_mark.column + 1,
                        parser.problem ? parser.problem : "YAML syntax error");
    } else {
        rc = load_mapping(&doc, path, c, err);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

int cluster_load(const char *spec, PlanCluster *c, char err[CFG_ERR])
{
    char name[64];
    int nodes = 0, gpn = 0;
    const char *colon = strchr(spec, ':');
    if (colon && (size_t)(colon - spec) < sizeof name) {
        snprintf(name, sizeof name, "%.*s", (int)(colon - spec), spec);
        char tail;
        if (sscanf(colon + 1, "%dx%d%c", &nodes, &gpn, &tail) != 2 || nodes < 1 || gpn < 1)
            return trd_errorf(err, "cluster '%s': expected NAME:NODESxGPUS, e.g. a100-80gb:16x8",
                              spec);
        if (cluster_preset(name, c, err) != 0)
            return -1;
        c->nodes = nodes;
        c->gpus_per_node = gpn;
        return 0;
    }
    if (cluster_preset(spec, c, err) == 0)
        return 0;
    return load_file(spec, c, err);
}
